"""MuZero: transforms, targets, the model step used by search, replay insertion, learning."""

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest
from conftest import KnownModel, kernel_shapes, spy_on_keywords, tiny_sebulba_muzero_config

import agents
import anakin
from agents import muzero
from agents.muzero import learning as muzero_learning
from agents.muzero import networks as muzero_networks
from agents.muzero.search import visited_q_bounds
from agents.vtrace import networks as vtrace_networks
from experiments.configs import muzero_catch
from podracer import replication
from podracer.agent import parameter_count
from podracer.config import ConfigError
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec, StepType, TimeStep, Trajectory

SPEC = EnvSpec(observation=ArraySpec((10, 5), np.float32), action=DiscreteSpec(3))


def test_signed_hyperbolic_two_hot_round_trip():
    x = jnp.array([-30.0, -1.0, -0.3, 0.0, 0.25, 1.0, 3.0, 42.0])
    probs = muzero.scalar_to_probs(x, 10)
    assert probs.shape == (8, 21)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(muzero.probs_to_scalar(probs, 10), x, rtol=1e-4, atol=1e-4)


def test_two_hot_puts_mass_on_the_two_neighbouring_bins():
    # h(3) = sign(3)(sqrt(3 + 1) - 1) + 0.001 * 3 = 1.003 -> bins +1 and +2 of [-10, 10].
    probs = np.asarray(muzero.scalar_to_probs(jnp.array(3.0), 10))
    expected = np.zeros(21)
    expected[11], expected[12] = 0.997, 0.003
    np.testing.assert_allclose(probs, expected, atol=1e-5)


def test_support_bins_space_the_two_hot_support_evenly_over_minus_s_to_s():
    # h(0.2) = sqrt(1.2) - 1 + 0.001 * 0.2 = 0.0956451. With 201 bins on [-10, 10] (steps of
    # 0.1) it lies between bin 100 (0.0) and bin 101 (0.1); with 21 (the integers) between
    # bins 10 (0) and 11 (1).
    fine = np.asarray(muzero.scalar_to_probs(jnp.array(0.2), 10, 201))
    expected = np.zeros(201)
    expected[100], expected[101] = 0.043549, 0.956451
    np.testing.assert_allclose(fine, expected, atol=1e-5)
    coarse = np.asarray(muzero.scalar_to_probs(jnp.array(0.2), 10))
    assert coarse.shape == (21,)
    np.testing.assert_allclose(coarse[10:12], [0.904355, 0.0956451], atol=1e-5)
    # The inverse reads the bins from the distribution (float32 bins: within 5e-4).
    x = jnp.array([-7.0, -0.05, 0.0, 0.2, 5.5])
    np.testing.assert_allclose(
        muzero.probs_to_scalar(muzero.scalar_to_probs(x, 10, 201), 10), x, atol=5e-4)


def test_the_unroll_loss_reads_the_bins_from_the_logits():
    # Logits log phi(z) with 201 bins: each trained step's cross-entropy is phi(z)'s entropy.
    # z = 0.2 at steps 0 and 1 (h = 0.0956451: weights 0.043549 and 0.956451), reward 0.2 at
    # step 1; step 2 is masked.
    k, bins = 3, 201
    targets = muzero.UnrollTargets(
        reward=jnp.array([0.0, 0.2, 0.2]), value=jnp.array([0.2, 0.2, 0.2]),
        policy=jnp.full((k, 3), 1 / 3), reward_mask=jnp.array([0.0, 1.0, 0.0]),
        value_mask=jnp.array([1.0, 1.0, 0.0]), policy_mask=jnp.zeros(k),
        terminal=jnp.zeros(k))
    logits = jnp.log(muzero.scalar_to_probs(targets.value, 10, bins) + 1e-30)
    out = muzero.unroll_loss(jnp.zeros((k, 3)), logits, logits, targets, support_size=10,
                             value_cost=1.0)
    entropy = -(0.043549 * np.log(0.043549) + 0.956451 * np.log(0.956451))
    np.testing.assert_allclose(out.value_loss, 2 * entropy, rtol=1e-4)
    np.testing.assert_allclose(out.reward_loss, entropy, rtol=1e-4)
    assert float(out.terminal_loss) == 0.0  # no terminal head: no such term


def test_latent_normalisation_and_its_jacobian_match_a_hand_derivation():
    # Example 0, x = (3, 1, 2, 5): min 1 at entry 1, max 5 at entry 3, R = 4, so
    # y = (x - 1) / 4 and dy_i/dx_j = (d_ij - d_j1) / R - (x_i - 1)(d_j3 - d_j1) / R^2.
    # Example 1 is constant: R = 0 < the floor 1e-5, y = 0, and the minimum's gradient is
    # shared by the four tied entries (JAX's rule for `min`): dy_i/dx_j = (d_ij - 1/4) /
    # 1e-5. No gradient crosses examples.
    x = np.array([[3.0, 1.0, 2.0, 5.0], [0.5, 0.5, 0.5, 0.5]], np.float32)
    e = np.eye(4)
    expected_y = np.stack([(x[0] - 1) / 4, np.zeros(4)])
    expected_jacobian = np.zeros((2, 4, 2, 4))
    expected_jacobian[0, :, 0] = (e - e[1]) / 4 - np.outer(x[0] - 1, e[3] - e[1]) / 16
    expected_jacobian[1, :, 1] = (e - 0.25) / 1e-5
    np.testing.assert_allclose(muzero.normalise_latent(jnp.asarray(x)), expected_y, atol=1e-7)
    np.testing.assert_allclose(jax.jacobian(muzero.normalise_latent)(jnp.asarray(x)),
                               expected_jacobian, rtol=1e-5, atol=1e-6)


def test_an_extreme_no_entry_matches_gets_a_zero_tangent_not_nan():
    """Where XLA computes the latent twice with different rounding, the minimum or maximum
    taken from one copy may equal no entry of the other: JAX's rule for `max` then divides
    0 by 0 and the whole gradient is NaN. The guarded rule gives that row 0 and leaves the
    other rows as JAX's rule does: the mean tangent over the entries equal to the extreme."""
    x = jnp.array([[1.0, 4.0, 4.0, 2.0], [1.0, 4.0, 4.0, 2.0]])
    dx = jnp.array([[1.0, 2.0, 6.0, 8.0], [1.0, 2.0, 6.0, 8.0]])
    extreme = jnp.array([[4.0], [4.0000005]])  # row 1: rounded differently, matching nothing
    tangent = muzero_networks.extreme_tangent(x, extreme, dx)
    np.testing.assert_array_equal(tangent, [[4.0], [0.0]])  # (2 + 6) / 2, and 0


def test_the_terminal_head_loss_is_the_logistic_loss_where_the_reward_is_trained():
    # Steps 1..3 trained (the reward mask), the episode ended at step 2. Logits 2, -1, 3 at
    # steps 1..3 against targets 0, 1, 1: log(1 + e^2) + log(1 + e^1) + log(1 + e^-3);
    # step 0 (logit 5, target 0) is never trained.
    k = 4
    targets = muzero.UnrollTargets(
        reward=jnp.zeros(k), value=jnp.zeros(k), policy=jnp.full((k, 3), 1 / 3),
        reward_mask=jnp.array([0.0, 1.0, 1.0, 1.0]), value_mask=jnp.zeros(k),
        policy_mask=jnp.zeros(k), terminal=jnp.array([0.0, 0.0, 1.0, 1.0]))
    zeros = jnp.zeros((k, 21))
    out = muzero.unroll_loss(jnp.zeros((k, 3)), zeros, zeros, targets, support_size=10,
                             value_cost=1.0, terminal_logits=jnp.array([5.0, 2.0, -1.0, 3.0]))
    expected = math.log(1 + math.e ** 2) + math.log(1 + math.e) + math.log(1 + math.e ** -3)
    np.testing.assert_allclose(out.terminal_loss, expected, rtol=1e-5)
    # The reward term: CE of uniform logits against phi(0) on the 3 trained steps.
    np.testing.assert_allclose(out.loss, (3 * math.log(21) + expected) / k, rtol=1e-5)


def test_the_terminal_head_discounts_the_search_step_by_the_chance_the_episode_goes_on():
    config = muzero.default_config()
    config.discount = 0.9
    config.terminal_head = False
    network = muzero_networks.make_network(config, SPEC)
    config.terminal_head = True
    ended = muzero_networks.make_network(config, SPEC)
    obs, action = jnp.zeros((2, 10, 5)), jnp.array([0, 2])
    params = network.init(jax.random.PRNGKey(0), obs, action)
    with_head = ended.init(jax.random.PRNGKey(0), obs, action)
    assert "end_head" in with_head["params"] and "end_head" not in params["params"]

    def step(net, p):
        latent = net.apply(p, obs, method="represent")
        out, _ = muzero.make_recurrent_fn(net, 10, 0.9)(p, None, action, latent)
        return np.asarray(out.discount)

    np.testing.assert_allclose(step(network, params), [0.9, 0.9], rtol=1e-6)
    # A fresh head says P(end) = sigmoid(-4.6) = 0.0099518: gamma (1 - P(end)).
    np.testing.assert_allclose(step(ended, with_head), [0.9 * (1 - 0.0099518)] * 2, rtol=1e-5)
    # Its output bias set to +20: the model is sure the step ends the game.
    sure = jax.tree.map(lambda x: x, with_head)
    last = max(sure["params"]["end_head"])  # Dense_1, after the hidden Dense_0
    sure["params"]["end_head"][last]["bias"] = jnp.full((1,), 20.0)
    np.testing.assert_allclose(step(ended, sure), [0.0, 0.0], atol=1e-7)


def _terminal_head_gradients(share):
    """The terminal head's summed logits differentiated with respect to every parameter, for a
    head with a non-zero output layer (heads start at zero) so gradients reach its hidden layer."""
    config = muzero.default_config()
    config.terminal_head, config.terminal_head_gradient = True, share
    network = muzero_networks.make_network(config, SPEC)
    obs, action = jax.random.normal(jax.random.PRNGKey(1), (4, 10, 5)), jnp.array([0, 1, 2, 0])
    params = network.init(jax.random.PRNGKey(0), obs, action)
    head = params["params"]["end_head"]
    head[max(head)]["kernel"] = jnp.ones_like(head[max(head)]["kernel"])

    def end_logits(p):
        latent = network.apply(p, obs, method="represent")
        _, next_latent = network.apply(p, latent, action, method="dynamics")
        return jnp.sum(network.apply(p, next_latent, method="terminal_logit"))

    return jax.grad(end_logits)(params)["params"]


@pytest.mark.parametrize("gradient", [True, False])
def test_the_terminal_head_trains_h_and_g_only_with_its_gradient_switch_on(gradient):
    # The head's own layers always get a gradient; the representation and dynamics only when
    # `terminal_head_gradient` (True and False: the shares 1 and 0).
    grads = _terminal_head_gradients(gradient)
    size = lambda tree: max(float(jnp.abs(x).max()) for x in jax.tree.leaves(tree))
    assert size(grads["end_head"]) > 0
    model = {name: g for name, g in grads.items() if name != "end_head"}
    assert (size(model) > 0) == gradient, size(model)


def test_a_share_of_the_terminal_heads_gradient_reaches_h_and_g_scaled_by_it():
    # The chain rule through x -> share * x (backwards only): h's and g's gradients are the
    # whole gradient times the share, the head's own are the whole gradient.
    whole, part = _terminal_head_gradients(1.0), _terminal_head_gradients(0.25)
    for name in whole:
        scale = 1.0 if name == "end_head" else 0.25
        chex.assert_trees_all_close(part[name], jax.tree.map(lambda g, s=scale: s * g, whole[name]),
                                    rtol=1e-5, atol=1e-7)
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(whole["repr_net"])) > 0


@pytest.mark.parametrize("bad", [-0.1, 1.5, 2])
def test_a_terminal_head_gradient_outside_0_to_1_names_the_field(bad):
    config = muzero.default_config()
    config.terminal_head = True
    config.terminal_head_gradient = bad
    with pytest.raises(ConfigError, match=r"agent\.terminal_head_gradient"):
        agents.make(config, SPEC)


def test_support_bins_set_the_heads_width_and_a_learner_step_runs():
    spec = EnvSpec(observation=ArraySpec((1,), np.float32), action=DiscreteSpec(3))
    config = muzero.default_config()
    config.support_bins = 201
    config.rollout_length, config.replay_capacity, config.min_replay_items = 4, 8, 3
    config.batch_size, config.updates_per_step = 2, 1
    config.unroll_steps, config.td_steps, config.num_simulations = 1, 2, 2
    agent = agents.make(config, spec)
    state = agent.init(jax.random.PRNGKey(0))
    heads = state.params["params"]
    for name in ("value_head", "reward_head"):
        assert jax.tree.leaves(heads[name])[-1].shape[-1] == 201, name  # the output layer
    trajectories, _ = _hand_worked_stream()
    for trajectory in trajectories[:2]:
        state, metrics = agent.learner_step(state, trajectory, jax.random.PRNGKey(1),
                                            axis_name=None)
    assert int(state.updates) == 1 and np.isfinite(float(metrics["loss"]))
    assert float(metrics["value_loss"]) > 0


@pytest.mark.parametrize("bad", [0, 1, 2.5, True, "201"])
def test_a_bad_support_bins_names_the_field(bad):
    config = muzero.default_config()
    config.support_bins = bad
    with pytest.raises(ConfigError, match=r"agent\.support_bins"):
        muzero.validate(config)


def test_n_step_values_stop_at_terminals_and_bootstrap_truncations():
    # o0 FIRST, o1 MID, o2 LAST (terminal, r=1), o3 FIRST, o4 MID, o5 LAST (truncated, r=2).
    rewards = jnp.array([0.0, 0.0, 1.0, 0.0, 0.5, 2.0])
    discounts = jnp.array([1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    steps = jnp.array([0, 1, 2, 0, 1, 2])
    boot = jnp.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    z = muzero.n_step_values(rewards, discounts, steps, boot, n=3, discount=0.5)
    # z0 = 0 + .5 * 1 (terminal: no bootstrap); z1 = 1; z2 = 0 (a terminal is worth 0);
    # z3 = .5 + .5 * 2 + .25 * 60 (truncated end bootstraps); z4 = 2 + .5 * 60; z5 = 60.
    np.testing.assert_allclose(z, [0.5, 1.0, 0.0, 16.5, 32.0, 60.0], rtol=1e-6)
    z1 = muzero.n_step_values(rewards, discounts, steps, boot, n=1, discount=0.5)
    np.testing.assert_allclose(z1, [10.0, 1.0, 0.0, 0.5 + 25.0, 32.0, 60.0], rtol=1e-6)


def test_recurrent_fn_shapes_and_discount():
    config = muzero.default_config()
    network = muzero.make_network(config, SPEC)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, 10, 5)), jnp.zeros((1,), jnp.int32))
    latent = network.apply(params, jnp.ones((7, 10, 5)), method="represent")
    assert latent.shape == (7, 64)  # the default latent for a 2-D (not image) observation
    np.testing.assert_allclose(latent.min(-1), 0.0, atol=1e-6)  # min-max normalised
    np.testing.assert_allclose(latent.max(-1), 1.0, atol=1e-4)
    recurrent_fn = muzero.make_recurrent_fn(network, config.support_size, 0.9)
    out, next_latent = recurrent_fn(params, None, jnp.arange(7) % 3, latent)
    assert next_latent.shape == latent.shape
    assert out.reward.shape == out.value.shape == out.discount.shape == (7,)
    assert out.prior_logits.shape == (7, 3)
    # The default's fresh terminal head says P(end) = sigmoid(-4.6) = 0.0099518 for any
    # latent (its output layer starts at zero weights): gamma (1 - P(end)).
    np.testing.assert_allclose(out.discount, 0.9 * (1 - 0.0099518), rtol=1e-5)


@pytest.mark.parametrize("terminal_head", [False, True])
def test_recurrent_fn_reads_reward_from_g_and_prior_and_value_from_f_at_the_next_state(
        terminal_head):
    recurrent_fn = muzero.make_recurrent_fn(KnownModel(terminal_head), 10, 0.9)
    latent = jnp.asarray([[0.5, 7.0], [-1.0, 7.0]])
    out, next_latent = recurrent_fn(None, None, jnp.asarray([2, 0]), latent)
    np.testing.assert_allclose(next_latent, [[2.5, 9.0], [-1.0, 7.0]])
    np.testing.assert_allclose(out.reward, [3.0, 3.0], atol=1e-3)
    np.testing.assert_allclose(out.value, [0.2, 0.2], atol=5e-4)  # float32 inverse of h
    np.testing.assert_allclose(out.prior_logits, [[2.5, 5.0, -2.5], [-1.0, -2.0, 1.0]])
    # With the head the step's discount is gamma (1 - P(end)) = 0.9 sigmoid(-s0'):
    # 0.9 / (1 + e^2.5) = 0.0682724 and 0.9 / (1 + e^-1) = 0.6579527.
    expected = [0.0682724, 0.6579527] if terminal_head else [0.9, 0.9]
    np.testing.assert_allclose(out.discount, expected, rtol=1e-5)


@pytest.mark.parametrize("search", ["muzero", "gumbel"])
def test_actor_step_searches_and_returns_a_policy(search):
    config = muzero.default_config()
    config.search = search
    config.num_simulations = 4
    config.replay_capacity, config.min_replay_items = 8, 8
    config.rollout_length = 3
    agent = agents.make(config, SPEC)
    state = agent.init(jax.random.PRNGKey(0), SPEC)
    timestep = TimeStep(step_type=jnp.zeros(5, jnp.int32), reward=jnp.zeros(5),
                        discount=jnp.ones(5), observation=jnp.zeros((5, 10, 5)))
    params = agent.actor_params(state)
    action, _, extras = agent.actor_step(params, (), timestep, jax.random.PRNGKey(1))
    assert action.shape == (5,) and action.dtype == jnp.int32
    assert extras["policy"].shape == (5, 3) and set(extras) == {"policy"}
    np.testing.assert_allclose(extras["policy"].sum(-1), 1.0, rtol=1e-5)
    greedy, _, extras = agent.actor_step(params, (), timestep, jax.random.PRNGKey(1),
                                         evaluation=True)
    if search == "muzero":  # PUCT evaluates by the most visited action (Gumbel's: its tests)
        np.testing.assert_array_equal(greedy, jnp.argmax(extras["policy"], -1))


def test_acting_temperature_follows_the_muzero_papers_schedule():
    # The MuZero paper acts at 1, 0.5 after 500K and 0.25 after 750K of its 1M training steps:
    # here `temperature` before half of `temperature_decay_updates`, 0.5 before three
    # quarters, then 0.25; 0 keeps `temperature` throughout.
    for updates, expected in [(0, 0.8), (499, 0.8), (500, 0.5), (749, 0.5), (750, 0.25),
                              (10**6, 0.25)]:
        got = muzero.temperature_at(jnp.asarray(updates), decay_updates=1000, temperature=0.8)
        assert float(got) == pytest.approx(expected), updates
    assert float(muzero.temperature_at(jnp.asarray(10**6), decay_updates=0,
                                       temperature=0.8)) == pytest.approx(0.8)
    # The actors sample with the temperature in force: an action is drawn in proportion to
    # the root's visit fractions w to the power 1/T (mctx), so the share of actions that
    # are a most visited one is mean(sum_top w^(1/T) / sum w^(1/T)), from the searches' own w.
    config = muzero.default_config()
    config.num_simulations, config.replay_capacity, config.rollout_length = 4, 8, 3
    config.min_replay_items, config.temperature_decay_updates = 8, 1000
    agent = agents.make(config, SPEC)
    state = agent.init(jax.random.PRNGKey(0), SPEC)
    b = 4096
    timestep = TimeStep(step_type=jnp.ones(b, jnp.int32), reward=jnp.zeros(b),
                        discount=jnp.ones(b), observation=jnp.zeros((b, 10, 5)))
    act = jax.jit(agent.actor_step)
    shares = []
    for updates, temperature in [(0, 1.0), (800, 0.25)]:
        params = agent.actor_params(state.replace(updates=jnp.asarray(updates)))
        assert float(params["temperature"]) == temperature
        action, _, extras = act(params, (), timestep, jax.random.PRNGKey(updates + 1))
        w = np.asarray(extras["policy"], np.float64)
        top = w >= w.max(-1, keepdims=True) - 1e-6
        powered = w ** (1 / temperature)
        expected = np.mean(np.where(top, powered, 0).sum(-1) / powered.sum(-1))
        got = np.mean(top[np.arange(b), np.asarray(action)])
        assert abs(got - expected) < 0.03, (temperature, got, expected)  # 4 sigma: 0.0078
        shares.append(expected)
    assert shares[1] - shares[0] > 0.15, shares  # the two temperatures are told apart


def _mid_episode_trajectory(t, b):
    """A [T+1, B] Catch-shaped trajectory of MID timesteps with uniform search policies."""
    return Trajectory(
        timestep=TimeStep(step_type=jnp.ones((t + 1, b), jnp.int32), reward=jnp.zeros((t + 1, b)),
                          discount=jnp.ones((t + 1, b)), observation=jnp.zeros((t + 1, b, 10, 5))),
        action=jnp.zeros((t, b), jnp.int32),
        extras={"policy": jnp.full((t, b, 3), 1 / 3)},
    )


@pytest.mark.parametrize("reanalyse_fraction", [0.0, 0.5])
def test_learner_step_inserts_the_trajectory_and_waits_for_enough_data(reanalyse_fraction):
    config = muzero.default_config()
    config.reanalyse_fraction = reanalyse_fraction
    config.unroll_steps, config.td_steps, config.hidden_sizes, config.latent_size = 1, 2, (16,), 16
    config.rollout_length, config.replay_capacity, config.min_replay_items = 3, 24, 8
    config.batch_size, config.num_simulations = 4, 2
    config.updates_per_step = 1
    agent = agents.make(config, SPEC)
    state = agent.init(jax.random.PRNGKey(0), SPEC)
    trajectory = _mid_episode_trajectory(t=3, b=4)
    step = jax.jit(lambda s, k: agent.learner_step(s, trajectory, k, axis_name=None))
    # K + n = 3 = T: the first window's 3 positions lie before the stream, so nothing is
    # sampleable until the second trajectory, which makes 3 positions per column.
    state, metrics = step(state, jax.random.PRNGKey(1))
    assert float(metrics["replay_size"]) == 0 and int(state.updates) == 0
    state, metrics = step(state, jax.random.PRNGKey(2))
    assert float(metrics["replay_size"]) == 12 and int(state.updates) == 1
    assert math.isfinite(float(metrics["loss"]))
    # Every step's search policy is uniform over 3 actions: entropy ln 3.
    np.testing.assert_allclose(float(metrics["search_entropy"]), math.log(3), rtol=1e-6)


def test_search_entropy_is_the_mean_entropy_of_the_masked_policies():
    policies = jnp.array([[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]],
                          [[0.25, 0.25, 0.5], [1 / 3, 1 / 3, 1 / 3]]])  # [T=2, B=2, A=3]
    entropies = np.array([[0.0, math.log(2)], [1.5 * math.log(2), math.log(3)]])  # by hand
    every = jnp.ones((2, 2), bool)
    np.testing.assert_allclose(float(muzero_learning.policy_entropy(policies, every)),
                               entropies.mean(), rtol=1e-6)
    some = jnp.array([[False, True], [True, False]])
    np.testing.assert_allclose(float(muzero_learning.policy_entropy(policies, some)),
                               (math.log(2) + 1.5 * math.log(2)) / 2, rtol=1e-6)
    assert float(muzero_learning.policy_entropy(policies, jnp.zeros((2, 2), bool))) == 0.0


def test_trajectory_length_must_match_the_replay_segments():
    config = muzero.default_config()
    config.rollout_length, config.replay_capacity, config.min_replay_items = 5, 8, 8
    agent = agents.make(config, SPEC)
    state = agent.init(jax.random.PRNGKey(0), SPEC)
    trajectory = _mid_episode_trajectory(t=3, b=2)
    with pytest.raises(ConfigError, match="agent.rollout_length"):
        agent.learner_step(state, trajectory, jax.random.PRNGKey(1), axis_name=None)


def test_shipped_muzero_configs_are_valid():
    import sebulba
    from experiments.configs import muzero_atari, muzero_cartpole

    assert anakin.validate(muzero_catch.get_config(), 8) == 8
    for module in (muzero_cartpole, muzero_atari):
        config = module.get_config()
        sebulba.validate(config, num_local_devices=1, num_processes=1)
        assert config.agent.rollout_length == config.rollout_length
    # The Atari agent builds (replay memory is checked against the device) without allocating.
    atari = muzero_atari.get_config()
    spec = EnvSpec(observation=ArraySpec((84, 84, 4), np.uint8), action=DiscreteSpec(6))
    agents.make(atari.agent, spec)


@pytest.mark.parametrize("agent", ["muzero", "efficientzero"])
def test_auto_reads_small_boards_with_one_convolution_and_atari_frames_with_the_resnet(agent):
    minatar = EnvSpec(observation=ArraySpec((10, 10, 4), np.bool_), action=DiscreteSpec(3))
    atari = EnvSpec(observation=ArraySpec((84, 84, 4), np.uint8), action=DiscreteSpec(6))
    vector = EnvSpec(observation=ArraySpec((4,), np.float32), action=DiscreteSpec(2))
    config = agents.default_config(agent)
    assert config.network == "auto"
    assert muzero_networks.resolve_network("auto", minatar) == "conv_mlp"
    assert muzero_networks.resolve_network("auto", atari) == "resnet"
    # Catch's 10 x 5 board has no channel axis to convolve over: the MLP, as for vectors.
    assert muzero_networks.resolve_network("auto", SPEC) == "mlp"
    assert muzero_networks.resolve_network("auto", vector) == "mlp"
    assert muzero_networks.resolve_network("resnet", minatar) == "resnet"
    assert muzero_networks.resolve_network("mlp", minatar) == "mlp"
    # One threshold for every agent's "auto": the actor-critic torsos' by its receptive field.
    assert muzero_networks.MIN_RESNET_SIDE == vtrace_networks.conv_min_size()
    # The default config on MinAtar's boards builds one 3 x 3 convolution (4 channels in, 32
    # filters) before Dense layers; on Catch's board none.
    def kernels(spec):
        params = jax.eval_shape(lambda k: agents.make(config, spec).init(k, spec),
                                jax.random.PRNGKey(0)).params
        return {str(path): leaf.shape for path, leaf in jax.tree_util.tree_leaves_with_path(params)
                if "kernel" in str(path)}
    board = kernels(minatar)
    assert [shape for shape in board.values() if len(shape) == 4] == [(3, 3, 4, 32)], board
    assert (3200, 128) in board.values(), board
    assert all(len(shape) == 2 for shape in kernels(SPEC).values())
    # The agent reports its choice, which runs record in place of "auto" (tests/test_workdir).
    # Widths left None are reported with what they became (128 for boards read flattened,
    # 64 otherwise; test_default_mlp_width_follows_the_observations checks the layers).
    # So is whether "auto" stores stacked frames once (uint8 images only).
    assert agents.choices(config, minatar) == {
        "network": "conv_mlp", "hidden_sizes": [128], "latent_size": 128,
        "store_frames_once": "off"}
    assert agents.choices(config, SPEC) == {
        "network": "mlp", "hidden_sizes": [64], "latent_size": 64, "store_frames_once": "off"}
    # The residual network's latent is planes: no latent width to report.
    assert agents.choices(config, atari) == {
        "network": "resnet", "hidden_sizes": [64], "store_frames_once": "on"}
    # Values set by hand are the config's own: nothing to report for them.
    config.hidden_sizes, config.latent_size, config.store_frames_once = (32,), 16, "off"
    assert agents.choices(config, minatar) == {"network": "conv_mlp"}


@pytest.mark.parametrize("agent", ["muzero", "efficientzero"])
@pytest.mark.parametrize("spec, widths", [
    # A board (by default its 10 x 10 x 32 convolution's 3,200 features, read flattened):
    # hidden layers and latent 128.
    (EnvSpec(observation=ArraySpec((10, 10, 4), np.bool_), action=DiscreteSpec(3)),
     [(3200, 128), (128, 128), (128 + 3, 128)]),
    # A 2-D array (50 inputs) and a vector: 64, as before.
    (SPEC, [(50, 64), (64, 64), (64 + 3, 64)]),
    (EnvSpec(observation=ArraySpec((4,), np.float32), action=DiscreteSpec(2)),
     [(4, 64), (64, 64), (64 + 2, 64)]),
])
def test_default_mlp_width_follows_the_observations(agent, spec, widths):
    config = agents.default_config(agent)
    assert config.hidden_sizes is None and config.latent_size is None
    shapes = kernel_shapes(config, spec)
    # Representation: inputs -> hidden -> latent; dynamics: latent + one-hot action -> hidden.
    assert all(shape in shapes for shape in widths), shapes
    inputs, width = widths[0]
    assert [shape for shape in shapes if shape[0] == inputs] == [(inputs, width)], shapes


def test_widths_set_by_hand_apply_to_boards_and_the_resnet_heads_keep_64():
    minatar = EnvSpec(observation=ArraySpec((10, 10, 4), np.bool_), action=DiscreteSpec(3))
    config = muzero.default_config()
    config.hidden_sizes, config.latent_size = (32,), 16
    shapes = kernel_shapes(config, minatar)
    assert (3200, 32) in shapes and (32, 16) in shapes and (3200, 128) not in shapes, shapes
    config.network = "mlp"
    shapes = kernel_shapes(config, minatar)
    assert (400, 32) in shapes and (32, 16) in shapes and (400, 128) not in shapes, shapes
    # Atari frames get the resnet: its heads' hidden layer stays 64 wide.
    atari = EnvSpec(observation=ArraySpec((84, 84, 4), np.uint8), action=DiscreteSpec(6))
    hidden, _ = muzero_networks.mlp_widths(muzero.default_config(), atari)
    assert hidden == (64,)


def test_parameter_count_of_the_mlp_board_network():
    """`podracer.agent.parameter_count` on a MinAtar-sized board read flattened by
    `network="mlp"` (400 inputs, 5 actions), by hand from the default widths (128) and the
    21-bin supports (support_size 10). Each Dense
    has a bias; each MLP layer a LayerNorm (scale and bias); heads end in zeros, with biases.
      representation  400*128+128 + 256 + 128*128+128 + 256  = 68,352
      dynamics        (128+5)*128+128 + 256 + 128*128+128 + 256 = 34,176
      reward head     128*128+128 + 128*21+21                = 19,221
      policy head     128*128+128 + 128*5+5                  = 17,157
      value head      128*128+128 + 128*21+21                = 19,221
      terminal head   128*128+128 + 128*1+1                  = 16,641
    """
    minatar = EnvSpec(observation=ArraySpec((10, 10, 4), np.bool_), action=DiscreteSpec(5))
    config = muzero.default_config()
    config.network = "mlp"
    agent = agents.make(config, minatar)
    assert parameter_count(agent, minatar) == (68_352 + 34_176 + 19_221 + 17_157 + 19_221
                                               + 16_641)


def test_parameter_count_of_the_default_board_network():
    """`network="conv_mlp"`, what "auto" picks for MinAtar's boards: a 3x3 convolution with
    32 filters (the default `channels`, with
    biases, "SAME" padding, stride 1) turns the 10x10x4 board into 10x10x32 = 3,200 features
    that the representation MLP reads flattened; every other layer is the MLP network's above.
      convolution     3*3*4*32+32                                 =   1,184
      representation  3200*128+128 + 256 + 128*128+128 + 256      = 426,752
      dynamics, reward, policy, value and terminal heads as above: 34,176 + 19,221 +
      17,157 + 19,221 + 16,641
    """
    minatar = EnvSpec(observation=ArraySpec((10, 10, 4), np.bool_), action=DiscreteSpec(5))
    agent = agents.make(muzero.default_config(), minatar)
    assert parameter_count(agent, minatar) == (1_184 + 426_752 + 34_176 + 19_221 + 17_157
                                               + 19_221 + 16_641)


@pytest.mark.parametrize("network", ["conv_mlp", "resnet"])
def test_convolutional_networks_on_boards_without_channels_name_the_field(network):
    # SPEC's observations are Catch's 10 x 5 board, with no channel axis for a convolution.
    config = muzero.default_config()
    config.network = network
    with pytest.raises(ConfigError, match="agent.network.*images"):
        agents.make(config, SPEC)


def test_unknown_network_names_the_field():
    config = muzero.default_config()
    config.network = "transformer"
    with pytest.raises(ConfigError, match="agent.network: unknown value 'transformer'.*use one "
                                          "of: .*'conv_mlp'"):
        agents.make(config, SPEC)


@pytest.mark.parametrize("field, bad", [("hidden_sizes", ()), ("hidden_sizes", (64, 0)),
                                        ("latent_size", 0), ("latent_size", 64.5)])
def test_bad_widths_name_the_field(field, bad):
    config = muzero.default_config()
    config[field] = bad
    with pytest.raises(ConfigError, match=f"agent.{field}"):
        agents.make(config, SPEC)


def test_replay_that_would_not_fit_fails_naming_the_field():
    config = muzero.default_config()
    config.replay_capacity = 10**12
    with pytest.raises(ConfigError, match="agent.replay_capacity"):
        agents.make(config, SPEC)


@pytest.mark.optimised
def test_muzero_anakin_learns_catch():
    config = muzero_catch.get_config()
    # Two of the suite's eight simulated devices: replicated (gradients averaged across
    # them) at a quarter of the learner work of all eight (the eight-device case is below).
    config.num_devices = 2
    result = anakin.train(config)
    returns = [h["episode_return"] for h in result.history]
    assert returns[0] < 0.0, returns  # started at random play
    assert result.final_metrics["episode_return"] >= 0.8, returns


def test_muzero_runs_replicated_on_eight_devices():
    config = muzero_catch.get_config()
    config.num_devices = 8
    config.num_envs = 64
    # Small and short: this checks replication, not learning.
    config.agent.unroll_steps, config.agent.num_simulations = 2, 2
    config.agent.hidden_sizes, config.agent.latent_size = (32,), 32
    config.agent.batch_size = 16
    config.agent.min_replay_items = 8
    config.updates_per_chunk = 3
    config.total_env_steps = 64 * 10 * 3 * 2
    result = anakin.train(config)
    state = result.state.learner_state
    params = replication.local_slices(state.params)
    for other in params[1:]:
        for a, b in zip(jax.tree.leaves(params[0]), jax.tree.leaves(other)):
            np.testing.assert_array_equal(a, b)
    # Each device keeps its own replay shard: 6 insertions of its 8 environments' columns.
    assert [int(a) for a in np.asarray(state.replay.adds)] == [6] * 8
    assert [int(i) for i in np.asarray(state.replay.next_index)] == [48] * 8
    observations = replication.local_slices(state.replay.items["observation"])
    assert not np.array_equal(observations[0], observations[1])
    assert int(np.asarray(state.updates)[0]) > 0


@pytest.mark.optimised
@pytest.mark.parametrize("name, search", [("muzero", "muzero"), ("gumbel_muzero", "gumbel")])
def test_muzero_sebulba_improves_on_cartpole(name, search):
    """MuZero (PUCT, its default search) and the registered Gumbel MuZero, each on envpool
    CartPole-v1 with Sebulba (actor device 0, learner device 1) at `muzero_cartpole.py`'s
    settings: over the last 10K of 40K environment steps the mean episode return is >= 75
    (seed 0 on a 2-core Intel Xeon: PUCT 111, Gumbel 195); a uniformly random policy scores
    about 22 and the first log line is near that."""
    import sebulba
    from experiments.configs import muzero_cartpole

    config = muzero_cartpole.get_config()
    config.agent.name, config.agent.search = name, search
    config.actor_device_ids = (0,)
    config.learner_device_ids = (1,)
    result = sebulba.train(config)
    late = [r for r in result.history if r["env_steps"] > 30_000 and r["episodes"]]
    mean_late = (sum(r["episode_return"] * r["episodes"] for r in late)
                 / sum(r["episodes"] for r in late))
    curve = [round(r["episode_return"]) for r in result.history]
    assert result.history[0]["episode_return"] < 40, curve
    assert mean_late >= 75, curve


def test_muzero_sebulba_logs_the_default_terminal_heads_loss_and_the_search_entropy():
    """MuZero's default model has a terminal head. Under Sebulba (actor device 0, learner
    device 1) its loss and the acting search's entropy reach every record after learning
    starts, finite; the entropy lies in [0, ln 2] over CartPole's two actions (0 once both
    of the 2 simulations visit one child) and is not 0 throughout."""
    import sebulba

    config = tiny_sebulba_muzero_config(actor_device_ids=(0,), learner_device_ids=(1,),
                                        total_env_steps=64 * 30, log_every_updates=5,
                                        checkpoint_every_updates=0, eval_every_updates=0)
    config.agent.terminal_head = muzero.default_config().terminal_head
    assert config.agent.terminal_head
    result = sebulba.train(config)
    learning = [r for r in result.history if r["updates"] > 0]
    assert learning, result.history
    for record in learning:
        assert math.isfinite(record["terminal_loss"]) and record["terminal_loss"] > 0, record
        assert 0.0 <= record["search_entropy"] <= math.log(2) + 1e-6, record
    assert max(r["search_entropy"] for r in learning) > 0.1, learning


def _frame_stacked_stream(num_steps, num_stack=4, shape=(3, 2), seed=0):
    """What envpool's frame stacker (newest frame last) produces over a stream with game
    resets, which fill the stack with the first frame, and life losses, which start a new
    training episode (FIRST) but only push the frame: observations and step types."""
    rng = np.random.default_rng(seed)
    stack, observations, step_types = None, [], []
    for t in range(num_steps):
        frame = rng.integers(0, 255, shape, dtype=np.uint8)
        event = rng.random()
        reset = t == 0 or event < 0.1
        life_lost = not reset and event < 0.25
        stack = [frame] * num_stack if reset else stack[1:] + [frame]
        observations.append(np.stack(stack, -1))
        step_types.append(StepType.FIRST if reset or life_lost else StepType.MID)
    return np.array(observations), np.array(step_types, np.int32)


def test_frame_stacks_rebuilt_from_one_frame_per_step_are_exact_across_life_losses():
    observations, step_types = _frame_stacked_stream(80)
    frames = jnp.asarray(observations[..., -1])
    restarts = muzero.stack_restarts(jnp.asarray(observations))
    # The stream has life losses: FIRST steps whose stack is not one repeated frame.
    assert np.sum((step_types == StepType.FIRST) & ~np.asarray(restarts)) >= 5
    for t in range(80):
        rebuilt = muzero.frame_stack(frames, restarts, jnp.asarray(t), 4)
        np.testing.assert_array_equal(np.asarray(rebuilt), observations[t])


def test_image_replay_stores_each_frame_once_and_learns_from_rebuilt_stacks():
    spec = EnvSpec(observation=ArraySpec((12, 12, 4), np.uint8), action=DiscreteSpec(3))
    config = muzero.default_config()
    config.network = "resnet"  # "auto" reads boards this small with the MLP
    config.rollout_length, config.replay_capacity, config.min_replay_items = 4, 8, 3
    config.batch_size, config.num_simulations, config.channels = 2, 2, 8
    config.updates_per_step = 1
    config.num_blocks, config.hidden_sizes, config.unroll_steps, config.td_steps = 1, (16,), 1, 2
    agent = agents.make(config, spec)
    state = agent.init(jax.random.PRNGKey(0), spec)
    assert "observation" not in state.replay.items
    # 2 windows of H + K + n + T = 3 + 3 + 4 timesteps, one frame each.
    assert state.replay.items["frame"].shape == (2, 10, 12, 12)
    assert state.replay.items["frame"].dtype == jnp.uint8
    observations, step_types = _frame_stacked_stream(9, shape=(12, 12), seed=1)
    b = 2

    def trajectory(start):
        o = observations[start:start + 5]
        return Trajectory(
            timestep=TimeStep(
                step_type=jnp.broadcast_to(jnp.asarray(step_types[start:start + 5])[:, None],
                                           (5, b)),
                reward=jnp.zeros((5, b)), discount=jnp.ones((5, b)),
                observation=jnp.broadcast_to(jnp.asarray(o)[:, None], (5, b, 12, 12, 4))),
            action=jnp.zeros((4, b), jnp.int32),
            extras={"policy": jnp.full((4, b, 3), 1 / 3)},
        )

    step = jax.jit(lambda s, tr: agent.learner_step(s, tr, jax.random.PRNGKey(1),
                                                    axis_name=None))
    state, _ = step(state, trajectory(0))
    state, metrics = step(state, trajectory(4))
    assert int(state.updates) == 1 and math.isfinite(float(metrics["loss"]))
    # The second window of column 0 (slot 0 after the wrap) holds stream times -2 .. 7.
    np.testing.assert_array_equal(np.asarray(state.replay.items["frame"][0, 2:]),
                                  observations[:8, ..., -1])
    # What the learner reads at each of its positions is the stream's own stack: window
    # index i is stream time i - 2 (the stream restarts at time 0, before which no frame is
    # read).
    windows = {key: value[:1] for key, value in state.replay.items.items()}
    indices = jnp.arange(2, 10)[None]
    rebuilt = muzero_learning.observations_at(windows, indices, history=3)
    np.testing.assert_array_equal(np.asarray(rebuilt[0]), observations[:8])


class _ValueIsObservation:
    """A stand-in network for the target network: h(o) = o and f's value is o[0] exactly
    (logits log phi(o[0]), whose softmax is phi(o[0])), so targets show which observation
    each bootstrap read."""

    def apply(self, params, x, *args, method):
        del params, args
        assert method in ("represent", "predict"), method
        if method == "represent":
            return x
        logits = jnp.log(muzero.scalar_to_probs(x[:, 0], 10))
        return jnp.zeros((x.shape[0], 3)), logits


def _hand_worked_stream():
    """One environment, times 0..12, as three trajectories of T = 4 (o_4i .. o_4i+4):

        t        0  1   2   3    4  5   6   7    8  9   10  11  12
        step     F  M   M   L    F  M   M   L    F  M   M   M   M
        reward   0  .1  .2  1    0  .5  .6  2    0  .9  1   1.1 1.2
        discount 1  1   1   0    1  1   1   1    1  1   1   1   1
                            ^ terminal       ^ truncated (time limit)

    o_t = [10 + t] (so the stand-in value of o_t is 10 + t), a_t = t mod 3 and the stored
    search policy pi_t = [t + 1, 1, 1] / (t + 3)."""
    t = np.arange(13)
    step = np.array([0, 1, 1, 2, 0, 1, 1, 2, 0, 1, 1, 1, 1])
    reward = np.array([0, .1, .2, 1, 0, .5, .6, 2, 0, .9, 1, 1.1, 1.2], np.float32)
    discount = np.where(t == 3, 0.0, 1.0).astype(np.float32)
    policy = np.stack([t + 1, np.ones(13), np.ones(13)], -1) / (t + 3)[:, None]
    trajectories = []
    for i in range(3):
        s = slice(4 * i, 4 * i + 5)
        trajectories.append(Trajectory(
            timestep=TimeStep(step_type=jnp.asarray(step[s])[:, None],
                              reward=jnp.asarray(reward[s])[:, None],
                              discount=jnp.asarray(discount[s])[:, None],
                              observation=jnp.asarray(10.0 + t[s], jnp.float32)[:, None, None]),
            action=jnp.asarray(t[4 * i:4 * i + 4] % 3, jnp.int32)[:, None],
            extras={"policy": jnp.asarray(policy[4 * i:4 * i + 4], jnp.float32)[:, None]},
        ))
    return trajectories, policy


def _targets(*, reward, value, policy, reward_mask, value_mask, policy_mask):
    return {"reward": reward, "value": value, "policy": policy, "reward_mask": reward_mask,
            "value_mask": value_mask, "policy_mask": policy_mask}


@pytest.mark.parametrize("past_end", ["masked", "absorbing"])
@pytest.mark.parametrize("target_positions", ["bootstrap", "window"])
def test_unroll_targets_across_window_edges_a_terminal_and_a_truncation(target_positions,
                                                                        past_end):
    spec = EnvSpec(observation=ArraySpec((1,), np.float32), action=DiscreteSpec(3))
    config = muzero.default_config()
    config.unroll_steps, config.td_steps, config.discount = 3, 2, 0.5
    config.rollout_length, config.replay_capacity = 4, 12
    config.target_positions = target_positions
    config.past_end_targets = past_end
    replay, example, history = muzero.make_replay(config, spec)
    state = replay.init(jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), example))
    trajectories, policy = _hand_worked_stream()
    for trajectory in trajectories:
        steps, sampleable = muzero.to_replay_steps(trajectory, frames_once=False)
        state = replay.add(state, steps, sampleable)
    sample = replay.sample(state, jax.random.PRNGKey(0), 400, alpha=0.0, beta=1.0)
    targets = muzero.batch_targets(_ValueIsObservation(), None, sample.windows, None,
                                   muzero.learn_config(config), history=history)
    tau = np.asarray(sample.windows["observation"])[:, 0, 0] - 10
    # Positions t = 0..6 can be sampled (t + K + n <= 11, the last stored timestep) except
    # the LAST ones, 3: 0, 1, 2, 4, 5, 6.
    assert set(tau.astype(int).tolist()) == {0, 1, 2, 4, 5, 6}
    uniform = np.full(3, 1 / 3)
    g = 0.5
    expected = {
        # tau = 1: the window o_1 .. o_6 crosses the first trajectory edge; the episode ends
        # in a terminal at o_3 (k = 2): bootstraps b_k = (o_3, o_3, o_3, o_6), o_3 worth 0.
        # z_0 = r_2 + g r_3 = .2 + .5; z_1 = r_3 = 1; z_2 = 0 (terminal);
        # k = 3 is the absorbing state: reward 0, value 0, uniform policy, all trained.
        1: _targets(reward=[0, .2, 1, 0], value=[.2 + g * 1, 1, 0, 0],
                    policy=[policy[1], policy[2], uniform, uniform],
                    reward_mask=[0, 1, 1, 1], value_mask=[1, 1, 1, 1], policy_mask=[1, 1, 1, 1]),
        # tau = 5: o_5 .. o_10 crosses the second edge; the episode is truncated at o_7
        # (k = 2), which bootstraps from its own value 17:
        # z_0 = r_6 + g r_7 + g^2 17 = .6 + 1 + 4.25; z_1 = r_7 + g 17 = 2 + 8.5; z_2 = 17;
        # o_7 keeps its stored search policy; past a truncation nothing is trained (k = 3).
        5: _targets(reward=[0, .6, 2, 0], value=[.6 + g * 2 + g * g * 17, 2 + g * 17, 17, 0],
                    policy=[policy[5], policy[6], policy[7], uniform],
                    reward_mask=[0, 1, 1, 0], value_mask=[1, 1, 1, 0], policy_mask=[1, 1, 1, 0]),
        # tau = 6: o_6 .. o_11; k = 1 is the truncated o_7, then the next episode's o_8, o_9
        # are not this episode's: masked. z_0 = r_7 + g 17 = 10.5; z_1 = 17.
        6: _targets(reward=[0, 2, 0, 0], value=[2 + g * 17, 17, 0, 0],
                    policy=[policy[6], policy[7], uniform, uniform],
                    reward_mask=[0, 1, 0, 0], value_mask=[1, 1, 0, 0], policy_mask=[1, 1, 0, 0]),
        # tau = 2: o_2 .. o_7; z_0 = r_3 = 1 (terminal next), then o_3 terminal and two
        # absorbing steps.
        2: _targets(reward=[0, 1, 0, 0], value=[1, 0, 0, 0],
                    policy=[policy[2], uniform, uniform, uniform],
                    reward_mask=[0, 1, 1, 1], value_mask=[1, 1, 1, 1], policy_mask=[1, 1, 1, 1]),
        # tau = 4: o_4 .. o_9, all n-step: b = (o_6, o_7, o_7, o_7), the truncation at o_7 cuts
        # steps 2.., so z_0 = r_5 + g r_6 + g^2 16 = .5 + .3 + 4; z_1 = r_6 + g r_7 + g^2 17;
        # z_2 = r_7 + g 17; z_3 = 17.
        4: _targets(reward=[0, .5, .6, 2], value=[.5 + .3 + 4, .6 + 1 + 4.25, 2 + 8.5, 17],
                    policy=[policy[4], policy[5], policy[6], policy[7]],
                    reward_mask=[0, 1, 1, 1], value_mask=[1, 1, 1, 1], policy_mask=[1, 1, 1, 1]),
    }
    # Whether the episode has ended in a true terminal by step k (a terminal head's target,
    # whatever `past_end`): from o_3 on; a truncation (o_7) ends nothing.
    for position, ended in {1: [0, 0, 1, 1], 2: [0, 1, 1, 1], 4: [0, 0, 0, 0],
                            5: [0, 0, 0, 0], 6: [0, 0, 0, 0]}.items():
        expected[position]["terminal"] = ended
    if past_end == "masked":
        # EfficientZero's reference: at the terminal its value 0 and the reward into it are
        # trained, its policy is not (no action is taken there); nothing after it is.
        expected[1].update(reward_mask=[0, 1, 1, 0], value_mask=[1, 1, 1, 0],
                           policy_mask=[1, 1, 0, 0])
        expected[2].update(reward_mask=[0, 1, 0, 0], value_mask=[1, 1, 0, 0],
                           policy_mask=[1, 0, 0, 0])
    for position, fields in expected.items():
        i = int(np.flatnonzero(tau == position)[0])
        for name, value in fields.items():
            np.testing.assert_allclose(np.asarray(getattr(targets, name))[i], value,
                                       rtol=1e-3, atol=1e-4, err_msg=f"tau={position} {name}")
        # The unroll feeds the actions a_tau .. a_tau+2 to the dynamics.
        np.testing.assert_array_equal(np.asarray(sample.windows["action"])[i, :3],
                                      (position + np.arange(3)) % 3)


def test_frame_stacks_rebuilt_exactly_on_a_real_atari_stream_with_episodic_life():
    """envpool Breakout under the IMPALA protocol (episodic life): a life loss ends the
    training episode but the stack is refilled only at a game reset. From what the replay
    stores (one frame and a restart flag per step) every observation the actor saw is
    rebuilt exactly."""
    from sebulba import envpool_env

    task = "Breakout-v5"
    env = envpool_env.EnvpoolEnv(task, 1, seed=0, num_threads=1,
                                 options=envpool_env.make_options(task, "impala"))
    rng = np.random.default_rng(0)
    timesteps = [env.reset()]
    for _ in range(600):
        timesteps.append(env.step(rng.integers(0, 4, 1)))
    env.close()
    observation = np.stack([envpool_env.to_agent_layout(t.observation) for t in timesteps])
    step_type = np.stack([t.step_type for t in timesteps])  # [601, 1]
    game_over = np.stack([t.extras["game_over"] for t in timesteps])[:, 0]
    n = len(timesteps) - 1
    trajectory = Trajectory(
        timestep=TimeStep(step_type=jnp.asarray(step_type), reward=jnp.zeros((n + 1, 1)),
                          discount=jnp.ones((n + 1, 1)), observation=jnp.asarray(observation)),
        action=jnp.zeros((n, 1), jnp.int32), extras={"policy": jnp.full((n, 1, 4), 0.25)})
    steps, _ = muzero.to_replay_steps(trajectory, frames_once=True)
    frames, restarts = steps["frame"][:, 0], steps["stack_restart"][:, 0]
    assert frames.shape == (n, 84, 84) and frames.dtype == jnp.uint8
    # Several lives lost within games: FIRST steps after a LAST that was not a game over,
    # whose stacks still hold the previous life's frames.
    life_lost = np.flatnonzero((step_type[1:, 0] == StepType.FIRST) & ~game_over[:-1]) + 1
    life_lost = life_lost[life_lost < n]
    assert len(life_lost) >= 3, life_lost
    assert not np.any(np.all(observation[life_lost, 0] == observation[life_lost, 0][..., -1:],
                             axis=(1, 2, 3)))
    rebuilt = jax.jit(jax.vmap(lambda t: muzero.frame_stack(frames, restarts, t, 4)))(
        jnp.arange(n))
    np.testing.assert_array_equal(np.asarray(rebuilt), observation[:n, 0])


@pytest.mark.parametrize("reanalyse_value,search", [("target_network", "muzero"),
                                                    ("root", "muzero"),
                                                    ("target_network", "gumbel")])
def test_reanalyse_moves_policy_targets_to_the_target_networks_search(reanalyse_value, search):
    config = muzero.default_config()
    config.search = search
    config.unroll_steps, config.td_steps, config.rollout_length = 1, 1, 3
    config.replay_capacity, config.reanalyse_fraction, config.num_simulations = 12, 1.0, 8
    config.reanalyse_value = reanalyse_value
    # mctx's own Q normalisation and unvisited-child Q (and Gumbel's floor on the range of
    # Q), as the reference search below.
    config.q_transform, config.unvisited_q = "parent_and_siblings", "min"
    config.gumbel_q_floor = 1e-8
    config.hidden_sizes, config.latent_size = (16,), 16
    network = muzero.make_network(config, SPEC)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1, 10, 5)), jnp.zeros((1,), jnp.int32))
    # Random output layers too (they start at zero): a model whose values are not all 0.
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    params = jax.tree.unflatten(treedef, [x + 0.3 * jax.random.normal(k, x.shape)
                                          for x, k in zip(leaves, keys)])
    replay, example, history = muzero.make_replay(config, SPEC)
    state = replay.init(jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), example))
    for i in range(2):  # the actors' searches put all mass on action 0
        trajectory = _mid_episode_trajectory(t=3, b=2)
        obs = jax.random.uniform(jax.random.PRNGKey(10 + i), (4, 2, 10, 5))
        trajectory = trajectory.replace(
            timestep=trajectory.timestep.replace(observation=obs),
            extras={"policy": jnp.zeros((3, 2, 3)).at[..., 0].set(1.0)})
        steps, sampleable = muzero.to_replay_steps(trajectory, frames_once=False)
        state = replay.add(state, steps, sampleable)
    sample = replay.sample(state, jax.random.PRNGKey(2), 4, alpha=0.0, beta=1.0)
    key = jax.random.PRNGKey(3)
    targets = muzero.batch_targets(network, params, sample.windows, key,
                                   muzero.learn_config(config), history=history)
    # Reference: mctx's PUCT (or Gumbel) search with the target network at o_tau, o_tau+1 (the policy
    # targets) and, for root values, the bootstrap observations o_tau+1, o_tau+2 (n = 1), in
    # one batch.
    where = jnp.array([0, 1, 1, 2] if reanalyse_value == "root" else [0, 1])
    obs = sample.windows["observation"][:, where].reshape(4 * len(where), 10, 5)
    latent = network.apply(params, obs, method="represent")
    prior, value_logits = network.apply(params, latent, method="predict")
    root = mctx.RootFnOutput(prior_logits=prior, embedding=latent, value=muzero.probs_to_scalar(
        jax.nn.softmax(value_logits), config.support_size))
    recurrent_fn = muzero.make_recurrent_fn(network, config.support_size, config.discount)
    if search == "gumbel":  # the improved policy of a search with acting's Gumbel noise
        out = mctx.gumbel_muzero_policy(params, key, root, recurrent_fn, num_simulations=8,
                                        max_num_considered_actions=16, gumbel_scale=1.0)
    else:
        out = mctx.muzero_policy(
            params, key, root, recurrent_fn, num_simulations=8,
            dirichlet_fraction=config.dirichlet_fraction,
            dirichlet_alpha=config.dirichlet_alpha, temperature=config.temperature)
    searched = np.asarray(out.action_weights).reshape(4, len(where), 3)
    np.testing.assert_allclose(np.asarray(targets.policy), searched[:, :2], rtol=1e-5)
    # 8 simulations over 3 actions never all go to action 0: the targets moved.
    assert np.all(np.asarray(targets.policy)[..., 0] < 0.99)
    # Value targets z_k = r + g v(o_k+1) with r = 0 inside these episodes: v the searches'
    # root values, or the target network's own value of o_k+1.
    if reanalyse_value == "root":
        bootstrap = np.asarray(out.search_tree.summary().value).reshape(4, 4)[:, 2:]
    else:
        bootstrap = np.asarray(muzero.probs_to_scalar(jax.nn.softmax(network.apply(
            params, network.apply(params, sample.windows["observation"][:, 1:3].reshape(
                8, 10, 5), method="represent"), method="predict")[1]),
            config.support_size)).reshape(4, 2)
    np.testing.assert_allclose(np.asarray(targets.value), config.discount * bootstrap,
                               rtol=1e-4, atol=1e-5)


def test_hyperparameters_are_held_in_the_learner_state_and_sweepable():
    config = muzero.default_config()
    config.rollout_length, config.replay_capacity, config.min_replay_items = 3, 24, 24
    agent = agents.make(config, SPEC)
    assert set(agent.sweepable) == {"learning_rate", "max_grad_norm", "weight_decay",
                                    "value_cost", "priority_exponent", "importance_exponent"}
    state = agent.init(jax.random.PRNGKey(0), SPEC)
    state = agent.set_hparams(state, {"learning_rate": 0.5, "priority_exponent": 0.6})
    assert float(state.opt_state.hyperparams["learning_rate"]) == 0.5
    np.testing.assert_allclose(float(state.hparams["priority_exponent"]), 0.6)
    with pytest.raises(KeyError, match="discount"):
        agent.set_hparams(state, {"discount": 0.9})
    # One compiled Anakin program runs uniform and prioritised replay side by side.
    catch = muzero_catch.get_config()
    catch.num_devices, catch.num_envs, catch.updates_per_chunk = 1, 8, 3
    catch.total_env_steps = 8 * 10 * 3 * 2
    catch.agent.unroll_steps, catch.agent.num_simulations = 1, 2
    catch.agent.hidden_sizes, catch.agent.latent_size = (16,), 16
    catch.agent.batch_size, catch.agent.min_replay_items = 8, 8
    catch.sweep.seeds = (0, 0)
    catch.sweep.agent.priority_exponent = (0.0, 0.6)
    result = anakin.train(catch)
    hparams = result.state.learner_state.hparams["priority_exponent"]
    np.testing.assert_allclose(np.asarray(hparams).reshape(-1), [0.0, 0.6], rtol=1e-6)
    priorities = np.asarray(result.state.learner_state.replay.priorities).reshape(2, -1)
    # The same seed: only alpha differs, so the runs sampled (and re-prioritised) differently.
    assert not np.array_equal(priorities[0], priorities[1])


def _hand_tree():
    """A two-action tree: root 0 -a0-> node 1 -a0-> node 2; the other actions unvisited.
    Q(0, a0) = 1 + 0.5 * 2 = 2 and Q(1, a0) = 0 + 0.5 * (-2) = -1."""
    f = lambda x: jnp.asarray(x, jnp.float32)
    return mctx.Tree(
        node_visits=jnp.array([3, 2, 1], jnp.int32),
        raw_values=f([0.0, 0.0, -2.0]),
        node_values=f([1.0, 2.0, -2.0]),
        parents=jnp.array([-1, 0, 1], jnp.int32),
        action_from_parent=jnp.array([-1, 0, 0], jnp.int32),
        children_index=jnp.array([[1, -1], [2, -1], [-1, -1]], jnp.int32),
        children_prior_logits=f(np.zeros((3, 2))),
        children_visits=jnp.array([[2, 0], [1, 0], [0, 0]], jnp.int32),
        children_rewards=f([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]),
        children_discounts=f([[0.5, 0.0], [0.5, 0.0], [0.0, 0.0]]),
        children_values=f([[2.0, 0.0], [-2.0, 0.0], [0.0, 0.0]]),
        embeddings=f(np.zeros((3, 1))),
        root_invalid_actions=f([0.0, 0.0]),
        extra_data=None,
    )


def test_tree_min_max_q_and_parent_mean_q_match_a_hand_computation():
    tree = _hand_tree()
    # Visited edges' Q: {2, -1}: min -1, range 3.
    low, high = visited_q_bounds(tree)
    assert (float(low), float(high)) == pytest.approx((-1.0, 2.0))
    # Mean Q (EfficientZero's get_mean_q): root: 2 / 1 = 2; node 1: (2 + (-1)) / (1 + 1) = 0.5.
    assert float(muzero.mean_q(tree, jnp.asarray(0))) == pytest.approx(2.0)
    assert float(muzero.mean_q(tree, jnp.asarray(1))) == pytest.approx(0.5)
    q = lambda node, unvisited: np.asarray(muzero.qtransform(
        tree, jnp.asarray(node), scope="tree_min_max", unvisited=unvisited))
    # Root: a0 (2 + 1) / 3 = 1; a1 unvisited at the root's mean 2: 1 (clipped), or 0.
    np.testing.assert_allclose(q(0, "parent_mean"), [1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(q(0, "min"), [1.0, 0.0], atol=1e-6)
    # Node 1: a0 (-1 + 1) / 3 = 0; a1 at node 1's mean 0.5: (0.5 + 1) / 3 = 0.5.
    np.testing.assert_allclose(q(1, "parent_mean"), [0.0, 0.5], atol=1e-6)
    # A range below the floor 0.01 divides by the floor: Q(1, a0) = 1.995, range 0.005.
    narrow = _hand_tree().replace(children_values=jnp.asarray(
        [[2.0, 0.0], [3.99, 0.0], [0.0, 0.0]], jnp.float32))
    got = np.asarray(muzero.qtransform(narrow, jnp.asarray(1), scope="tree_min_max",
                                       unvisited="min"))
    np.testing.assert_allclose(got, [0.0, 0.0], atol=1e-5)  # the minimum edge
    got = np.asarray(muzero.qtransform(narrow, jnp.asarray(0), scope="tree_min_max",
                                       unvisited="min"))
    np.testing.assert_allclose(got, [0.005 / 0.01, 0.0], atol=1e-4)
    # mctx's own transform is what the default switches give.
    np.testing.assert_array_equal(
        np.asarray(muzero.qtransform(tree, jnp.asarray(1))),
        np.asarray(mctx.qtransform_by_parent_and_siblings(tree, jnp.asarray(1))))


def _search_with_efficientzeros_q(num_simulations: int, batch: int, seed: int,
                                  mean_q_method: str = "walk"):
    """A search of a small random MuZero network with PUCT's value term as EfficientZero's
    (`tree_min_max`, unvisited children at their parent's mean Q)."""
    config = muzero.default_config()
    config.hidden_sizes, config.latent_size = (16,), 16
    config.num_simulations = num_simulations
    config.q_transform, config.unvisited_q = "tree_min_max", "parent_mean"
    network = muzero.make_network(config, SPEC)
    obs = jax.random.uniform(jax.random.PRNGKey(seed), (batch, 10, 5))
    params = network.init(jax.random.PRNGKey(seed + 1), obs, jnp.zeros((batch,), jnp.int32))
    search_config = dataclasses.replace(muzero.search_config(config),
                                        mean_q_method=mean_q_method)
    return jax.jit(lambda p, o, k: muzero.run_search(network, p, o, k, search_config,
                                                    evaluation=False))(
        params, obs, jax.random.PRNGKey(seed + 2))


def _efficientzeros_mean_q(tree, node: int) -> float:
    """EfficientZero's get_mean_q of `node` in an unbatched NumPy tree, from the root down:
    root: the mean of its visited children's Q; below it, (the parent's mean Q + the sum of
    the visited children's Q) / (their number + 1)."""
    visited = tree.children_visits > 0
    q = tree.children_rewards + tree.children_discounts * tree.children_values
    sums, counts = np.where(visited, q, 0.0).sum(-1), visited.sum(-1)
    path = [int(node)]
    while path[-1] != 0:
        path.append(int(tree.parents[path[-1]]))
    mean = sums[0] / counts[0] if counts[0] else 0.0
    for n in reversed(path[:-1]):
        mean = (mean + sums[n]) / (counts[n] + 1)
    return mean


@pytest.mark.parametrize("method", ["walk", "jumps"])
def test_parent_mean_q_matches_efficientzeros_recursion_on_deep_searched_trees(method):
    # The trees of a real search (48 simulations, so paths many nodes deep), and the mean Q
    # of every expanded node by EfficientZero's recursion.
    trees = _search_with_efficientzeros_q(num_simulations=48, batch=4, seed=3).search_tree
    got = np.asarray(jax.vmap(lambda tree: jax.vmap(lambda i: muzero.mean_q(tree, i, method))(
        jnp.arange(tree.parents.shape[0])))(trees))
    deepest = 0
    for b in range(4):
        tree = jax.tree.map(lambda x, b=b: np.asarray(x[b]), trees)
        for node in np.flatnonzero(tree.node_visits > 0):
            np.testing.assert_allclose(got[b, node], _efficientzeros_mean_q(tree, node),
                                       rtol=1e-5, atol=1e-6)
            depth, walker = 0, int(node)
            while walker != 0:
                depth, walker = depth + 1, int(tree.parents[walker])
            deepest = max(deepest, depth)
    assert deepest >= 4  # the walk up crosses several levels


@pytest.mark.parametrize("num_nodes", [1, 2, 3, 5, 9, 16, 17, 18])
def test_parent_mean_q_by_jumps_reaches_the_root_from_the_deepest_possible_node(num_nodes):
    # A chain (node i's parent is i - 1), the deepest tree N nodes can make: its last node is
    # N - 1 levels down, which ceil(log2(N - 1)) rounds of pointer jumping must span (2^k
    # levels after k rounds: 17 nodes need 4, 18 need 5). Random Q and visits; a child that
    # is visited counts whether or not it is the chain's next node, as in EfficientZero. Few
    # visited children, so that each level scales the levels above it by 1 / (n + 1) = 1
    # mostly, and a level missed would show.
    rng = np.random.default_rng(num_nodes)
    actions = 3
    visits = (rng.random((num_nodes, actions)) < 0.15).astype(np.int32)
    visits[0, 0] = 1  # the root's mean is not 0
    tree = _hand_tree().replace(
        parents=jnp.arange(-1, num_nodes - 1, dtype=jnp.int32),
        children_visits=jnp.asarray(visits),
        children_rewards=jnp.asarray(rng.normal(size=(num_nodes, actions)), jnp.float32),
        children_discounts=jnp.full((num_nodes, actions), 0.9, jnp.float32),
        children_values=jnp.asarray(rng.normal(size=(num_nodes, actions)), jnp.float32))
    numpy_tree = jax.tree.map(np.asarray, tree)
    by_jumps = jax.jit(lambda tree, node: muzero.mean_q(tree, node, "jumps"))
    for node in range(num_nodes):
        got = float(by_jumps(tree, jnp.asarray(node)))
        assert got == pytest.approx(_efficientzeros_mean_q(numpy_tree, node), rel=1e-5,
                                    abs=1e-6), node


def test_parent_mean_q_by_jumps_has_no_loop_and_the_search_agrees_with_the_walk():
    # The pointer jumps are a fixed number of whole-tree steps: no while loop in the program
    # (the walk has one, run at every step down the tree).
    tree = _hand_tree()

    def loops(method):
        jaxpr = jax.make_jaxpr(lambda t, i: muzero.mean_q(t, i, method))(tree, jnp.asarray(1))
        return str(jaxpr).count("while[")

    assert (loops("jumps"), loops("walk")) == (0, 1)
    # Both methods give the same mean Q up to rounding, so the same search: the same
    # children expanded in the same order, visited as often. (Not the values: a random
    # network's values near 0 come out of the categorical support with rounding errors of
    # their own size, which differ between two compilations of the same network.)
    walk, jumps = (_search_with_efficientzeros_q(24, 4, seed=5, mean_q_method=m).search_tree
                   for m in ("walk", "jumps"))
    for field in ("children_index", "node_visits"):
        np.testing.assert_array_equal(np.asarray(getattr(walk, field)),
                                      np.asarray(getattr(jumps, field)))
    with pytest.raises(ValueError, match="method must be one of"):
        muzero.mean_q(tree, jnp.asarray(0), "walking")


def test_reference_search_switches_run_inside_a_batched_search():
    out = _search_with_efficientzeros_q(num_simulations=12, batch=3, seed=0)
    weights = np.asarray(out.action_weights)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    assert np.asarray(out.search_tree.node_visits)[:, 0].tolist() == [13, 13, 13]


def _bandit_search(q_transform: str, unvisited_q: str, num_simulations: int = 2):
    """PUCT (mctx's c1 = 1.25, c2 = 19652, no root noise) on a bandit of 3 actions with priors
    [0.5, 0.3, 0.2] (at every node) whose rewards are [1, 0, 0.8] and discount 0, so every
    Q = r + gamma v is its action's reward; the root's value is 0."""
    from agents.muzero.search import SearchConfig, search_with

    config = SearchConfig(search="muzero", num_simulations=num_simulations, support_size=10,
                          discount=0.0, dirichlet_alpha=0.25, dirichlet_fraction=0.25,
                          temperature=1.0, q_transform=q_transform, unvisited_q=unvisited_q,
                          max_num_considered_actions=3, gumbel_scale=1.0)
    log_prior = jnp.log(jnp.asarray([[0.5, 0.3, 0.2]]))
    root = mctx.RootFnOutput(prior_logits=log_prior, value=jnp.zeros(1),
                             embedding=jnp.zeros((1, 1)))

    def recurrent_fn(params, key, action, embedding):
        reward = jnp.asarray([1.0, 0.0, 0.8])[action]
        return mctx.RecurrentFnOutput(reward=reward, discount=jnp.zeros_like(reward),
                                      prior_logits=log_prior, value=jnp.zeros_like(reward)), \
            embedding

    return search_with(root, recurrent_fn, None, jax.random.PRNGKey(0), config,
                       evaluation=True)


@pytest.mark.parametrize("q_transform", ["parent_and_siblings", "tree_min_max"])
def test_unvisited_q_decides_the_second_simulation_of_a_bandit_search(q_transform):
    # Simulation 1: nothing visited, every value term 0 -> the largest prior, action 0
    # (reward 1). The root's value becomes (0 + 1) / 2 = 0.5 with 2 visits, and
    # sqrt(2) (1.25 + log(19655 / 19652)) = 1.76798, so the prior terms of simulation 2 are
    # 0.5 x 1.76798 / 2 = 0.442, 0.3 x 1.76798 = 0.530 and 0.2 x 1.76798 = 0.354.
    # "min": the unvisited children take the lowest value term, 0, against action 0's 1:
    # 1.442 > 0.530, action 0 again. "parent_mean": they take the root's mean Q over its
    # visited children, 1 (action 0's Q), which normalises to 1 like action 0's: 1.530 for
    # action 1 beats 1.442. Either scope gives this (in tree_min_max one visited edge leaves
    # the range empty, and Q stands as it is).
    visits = {unvisited: np.asarray(
        _bandit_search(q_transform, unvisited).search_tree.children_visits[0, 0]).tolist()
        for unvisited in ("min", "parent_mean")}
    assert visits == {"min": [2, 0, 0], "parent_mean": [1, 1, 0]}


def test_the_search_passes_the_agents_q_transform_and_unvisited_q_to_puct(monkeypatch):
    from agents.muzero import search as search_module

    seen = spy_on_keywords(monkeypatch, search_module, "qtransform")
    for scope, unvisited in [("tree_min_max", "parent_mean"), ("parent_and_siblings", "min"),
                             ("tree_min_max", "min")]:
        seen.clear()
        _bandit_search(scope, unvisited)
        assert seen and all(kw == {"scope": scope, "unvisited": unvisited,
                                    "mean_q_method": "walk"} for kw in seen)


def test_storing_frames_once_can_be_turned_off_and_a_bad_value_names_the_field():
    # The field holds a string ("auto" | "on" | "off"): "off" must mean off. (It was read
    # with bool(), so any value given on the command line, "off" or "False", turned it on.)
    atari = EnvSpec(observation=ArraySpec((84, 84, 4), np.uint8), action=DiscreteSpec(6))
    config = muzero.default_config()
    assert muzero.stores_frames_once(config, atari)  # "auto": on for uint8 images
    config.store_frames_once = "off"
    assert not muzero.stores_frames_once(config, atari)
    config.store_frames_once = "on"
    assert muzero.stores_frames_once(config, SPEC)
    config.store_frames_once = "False"
    with pytest.raises(ConfigError, match=r"agent\.store_frames_once.*'auto', 'on', 'off'"):
        muzero.validate(config)


def test_rewards_enter_the_replay_multiplied_by_reward_scale():
    trajectories, _ = _hand_worked_stream()
    steps, _ = muzero.to_replay_steps(trajectories[0], frames_once=False, reward_scale=10.0)
    # Rewards r_0..r_3 of the stream, 0, .1, .2, 1, times 10; nothing else changes.
    np.testing.assert_allclose(np.asarray(steps["reward"])[:, 0], [0, 1, 2, 10], rtol=1e-6)
    plain, _ = muzero.to_replay_steps(trajectories[0], frames_once=False)
    np.testing.assert_allclose(np.asarray(plain["reward"])[:, 0], [0, .1, .2, 1], rtol=1e-6)
    np.testing.assert_array_equal(steps["discount"], plain["discount"])
    # The agent passes its field through: one learner step stores the scaled rewards.
    spec = EnvSpec(observation=ArraySpec((1,), np.float32), action=DiscreteSpec(3))
    config = muzero.default_config()
    config.rollout_length, config.replay_capacity, config.reward_scale = 4, 12, 10.0
    config.batch_size, config.min_replay_items = 2, 12  # more than one add: no update
    agent = agents.make(config, spec)
    state = agent.init(jax.random.PRNGKey(0))
    state, _ = agent.learner_step(state, trajectories[0], jax.random.PRNGKey(1), axis_name=None)
    # A window is longer than T; after one add, the first window's last 4 slots hold it.
    np.testing.assert_allclose(np.asarray(state.replay.items["reward"])[0, -4:], [0, 1, 2, 10],
                               rtol=1e-6)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_a_bad_reward_scale_names_the_field(bad):
    config = muzero.default_config()
    config.reward_scale = bad
    with pytest.raises(ConfigError, match=r"agent\.reward_scale"):
        muzero.validate(config)


@pytest.mark.optimised
def test_the_terminal_head_learns_where_catch_ends():
    """Catch ends when the ball reaches the bottom row: from a board with the ball one row
    above it every action ends the game, and from the rows above none does. A model with a
    terminal head, trained on Catch, should say so (the environment's rule, not the code's)."""
    config = muzero_catch.get_config()
    config.agent.terminal_head = True
    # One device (seeds 0-2: every move from row 8 at least 0.97, rows 0-6 at most 0.0004).
    config.num_devices = 1
    config.total_env_steps = 16_000
    result = anakin.train(config)
    params = replication.local_slices(result.state.learner_state.params)[0]
    network = muzero_networks.make_network(config.agent, SPEC)
    boards = []
    for row in range(9):  # the ball in rows 0..8, each column, the paddle in column 2
        for column in range(5):
            board = np.zeros((10, 5), np.float32)
            board[row, column] = board[9, 2] = 1.0
            boards.append(board)
    obs = jnp.asarray(np.repeat(np.stack(boards), 3, axis=0))
    action = jnp.tile(jnp.arange(3), 45)
    latent = network.apply(params, obs, method="represent")
    _, next_latent = network.apply(params, latent, action, method="dynamics")
    p_end = np.asarray(jax.nn.sigmoid(
        network.apply(params, next_latent, method="terminal_logit"))).reshape(9, 15)
    assert p_end[8].min() > 0.8, p_end[8]  # every move from row 8 ends the game
    assert p_end[:7].max() < 0.1, p_end[:7].max(axis=1)  # none from rows 0..6 does
