"""MuZero: transforms, targets, the model step used by search, replay insertion, learning."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import agents
import anakin
from agents import muzero
from experiments.configs import muzero_catch
from podracer import replication
from podracer.config import ConfigError
from podracer.types import DiscreteSpec, ArraySpec, EnvSpec, StepType, TimeStep, Trajectory

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
    assert latent.shape == (7, config.latent_size)
    np.testing.assert_allclose(latent.min(-1), 0.0, atol=1e-6)  # min-max normalised
    np.testing.assert_allclose(latent.max(-1), 1.0, atol=1e-4)
    recurrent_fn = muzero.make_recurrent_fn(network, config.support_size, 0.9)
    out, next_latent = recurrent_fn(params, None, jnp.arange(7) % 3, latent)
    assert next_latent.shape == latent.shape
    assert out.reward.shape == out.value.shape == out.discount.shape == (7,)
    assert out.prior_logits.shape == (7, 3)
    np.testing.assert_allclose(out.discount, 0.9)


@pytest.mark.parametrize("search", ["muzero", "gumbel"])
def test_actor_step_searches_and_returns_a_policy(search):
    config = muzero.default_config()
    config.search = search
    config.num_simulations = 4
    config.replay_capacity = 8
    config.rollout_length = 3
    agent = agents.make(config, SPEC)
    state = agent.init(jax.random.PRNGKey(0), SPEC)
    timestep = TimeStep(step_type=jnp.zeros(5, jnp.int32), reward=jnp.zeros(5),
                        discount=jnp.ones(5), observation=jnp.zeros((5, 10, 5)))
    action, _, extras = agent.actor_step(state.params, (), timestep, jax.random.PRNGKey(1))
    assert action.shape == (5,) and action.dtype == jnp.int32
    assert extras["policy"].shape == (5, 3) and extras["root_value"].shape == (5,)
    np.testing.assert_allclose(extras["policy"].sum(-1), 1.0, rtol=1e-5)
    greedy, _, extras = agent.actor_step(state.params, (), timestep, jax.random.PRNGKey(1),
                                         evaluation=True)
    np.testing.assert_array_equal(greedy, jnp.argmax(extras["policy"], -1))


def _mid_episode_trajectory(t, b):
    """A [T+1, B] Catch-shaped trajectory of MID timesteps with uniform search policies."""
    return Trajectory(
        timestep=TimeStep(step_type=jnp.ones((t + 1, b), jnp.int32), reward=jnp.zeros((t + 1, b)),
                          discount=jnp.ones((t + 1, b)), observation=jnp.zeros((t + 1, b, 10, 5))),
        action=jnp.zeros((t, b), jnp.int32),
        extras={"policy": jnp.full((t, b, 3), 1 / 3), "root_value": jnp.zeros((t, b))},
    )


@pytest.mark.parametrize("reanalyse_fraction", [0.0, 0.5])
def test_learner_step_inserts_the_trajectory_and_waits_for_enough_data(reanalyse_fraction):
    config = muzero.default_config()
    config.reanalyse_fraction = reanalyse_fraction
    config.unroll_steps, config.td_steps, config.hidden_sizes, config.latent_size = 1, 2, (16,), 16
    config.rollout_length, config.replay_capacity, config.min_replay_items = 3, 16, 8
    config.batch_size, config.num_simulations = 4, 2
    agent = agents.make(config, SPEC)
    state = agent.init(jax.random.PRNGKey(0), SPEC)
    trajectory = _mid_episode_trajectory(t=3, b=4)
    step = jax.jit(lambda s, k: agent.learner_step(s, trajectory, k, axis_name=None))
    state, metrics = step(state, jax.random.PRNGKey(1))
    assert int(state.replay.size) == 4 and int(state.updates) == 0  # 4 < 8: no update yet
    state, metrics = step(state, jax.random.PRNGKey(2))
    assert int(state.replay.size) == 8 and int(state.updates) == 1
    assert math.isfinite(float(metrics["loss"]))


def test_trajectory_length_must_match_the_replay_segments():
    config = muzero.default_config()
    config.rollout_length, config.replay_capacity = 5, 8
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


def test_replay_that_would_not_fit_fails_naming_the_field():
    config = muzero.default_config()
    config.replay_capacity = 10**12
    with pytest.raises(ConfigError, match="agent.replay_capacity"):
        agents.make(config, SPEC)


def test_muzero_anakin_learns_catch():
    result = anakin.train(muzero_catch.get_config())
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
    # Each device keeps its own replay shard: 8 envs x 6 insertions = 48 segments each.
    sizes = [int(s) for s in np.asarray(state.replay.size)]
    assert sizes == [48] * 8
    observations = replication.local_slices(state.replay.items["observation"])
    assert not np.array_equal(observations[0], observations[1])
    assert int(np.asarray(state.updates)[0]) > 0


def test_muzero_sebulba_improves_on_cartpole():
    """MuZero on envpool CartPole-v1 with Sebulba (actor device 0, learner device 1): over the
    last 10K of 40K environment steps the mean episode return is >= 75; a uniformly random
    policy scores about 22 and the first log line is near that."""
    import sebulba
    from experiments.configs import muzero_cartpole

    config = muzero_cartpole.get_config()
    config.actor_device_ids = (0,)
    config.learner_device_ids = (1,)
    result = sebulba.train(config)
    late = [r for r in result.history if r["env_steps"] > 30_000 and r["episodes"]]
    mean_late = (sum(r["episode_return"] * r["episodes"] for r in late)
                 / sum(r["episodes"] for r in late))
    curve = [round(r["episode_return"]) for r in result.history]
    assert result.history[0]["episode_return"] < 40, curve
    assert mean_late >= 75, curve


def _frame_stacked_stream(num_steps, num_stack=4, shape=(3, 2), seed=0):
    """What a frame stacker (newest frame last; a reset fills the stack with the first frame,
    as envpool does) produces over a stream with random resets: observations and step types."""
    rng = np.random.default_rng(seed)
    stack, observations, step_types = None, [], []
    for t in range(num_steps):
        frame = rng.integers(0, 255, shape, dtype=np.uint8)
        reset = t == 0 or rng.random() < 0.15
        stack = [frame] * num_stack if reset else stack[1:] + [frame]
        observations.append(np.stack(stack, -1))
        step_types.append(StepType.FIRST if reset else StepType.MID)
    return np.array(observations), np.array(step_types, np.int32)


def test_frame_stacks_rebuilt_from_one_frame_per_step_are_exact():
    observations, step_types = _frame_stacked_stream(60)
    for start in range(45):  # every window: starting mid-episode, on a reset, resets inside
        segment = observations[start:start + 11]
        rebuilt = muzero.rebuild_frame_stacks(jnp.asarray(segment[..., -1]),
                                              jnp.asarray(segment[0]),
                                              jnp.asarray(step_types[start:start + 11]))
        np.testing.assert_array_equal(np.asarray(rebuilt), segment)


def test_image_replay_stores_each_frame_once_and_learns_from_rebuilt_stacks():
    spec = EnvSpec(observation=ArraySpec((12, 12, 4), np.uint8), action=DiscreteSpec(3))
    config = muzero.default_config()
    config.rollout_length, config.replay_capacity, config.min_replay_items = 4, 8, 2
    config.batch_size, config.num_simulations, config.channels = 2, 2, 8
    config.num_blocks, config.hidden_sizes, config.unroll_steps, config.td_steps = 1, (16,), 1, 2
    agent = agents.make(config, spec)
    state = agent.init(jax.random.PRNGKey(0), spec)
    assert "observation" not in state.replay.items
    assert state.replay.items["frames"].shape == (8, 5, 12, 12)  # one frame per timestep
    assert state.replay.items["first_stack"].shape == (8, 12, 12, 4)
    assert state.replay.items["frames"].dtype == jnp.uint8
    observations, step_types = _frame_stacked_stream(5, shape=(12, 12), seed=1)
    b = 2
    trajectory = Trajectory(
        timestep=TimeStep(
            step_type=jnp.broadcast_to(jnp.asarray(step_types)[:, None], (5, b)),
            reward=jnp.zeros((5, b)), discount=jnp.ones((5, b)),
            observation=jnp.broadcast_to(jnp.asarray(observations)[:, None], (5, b, 12, 12, 4))),
        action=jnp.zeros((4, b), jnp.int32),
        extras={"policy": jnp.full((4, b, 3), 1 / 3), "root_value": jnp.zeros((4, b))},
    )
    state, metrics = jax.jit(lambda s: agent.learner_step(s, trajectory, jax.random.PRNGKey(1),
                                                          axis_name=None))(state)
    assert int(state.updates) == 1 and math.isfinite(float(metrics["loss"]))
    np.testing.assert_array_equal(np.asarray(state.replay.items["frames"][0]),
                                  observations[..., -1])
