"""Stochastic MuZero (Antonoglou et al., 2022): the search's wiring against a hand-worked
tree, the recurrent functions against the network's heads, the chance loss and the
straight-through code on hand-derived examples, config validation, and learning Catch under
both runners.

The hand-worked tree follows mctx's `stochastic_muzero_policy`: each simulation expands one
node; a node's value is the running mean of what its simulations backed up, a backed-up value
being r + gamma * (the child's); the edge into an afterstate has r = 0 and gamma = 1, so the
afterstate's first value is its Q; a chance node picks the outcome of largest
sigma(c) / (N(c) + 1).
"""

import functools
import math

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest
from conftest import POINT_TWO, THREE, spy_on_keywords, two_hot_logits

import agents
from agents import muzero
from agents import stochastic_muzero as smz
from podracer.config import ConfigError
from podracer.types import StepType

SIGMA = (0.6, 0.4)  # the afterstate's prior over its two chance outcomes
Q = (0.5, -0.5)  # the afterstate value of actions 0 and 1
ROOT_VALUE = 0.1
REWARD, VALUE = (1.0, -1.0), (0.2, 0.4)  # the reward into, and value of, each outcome's state
DISCOUNT = 0.9


def _toy_search(num_simulations, q_transform="parent_and_siblings", unvisited_q="min"):
    """`search_with` on a hand-made model: two actions, the prior (almost) all on action 0;
    its afterstate has sigma = SIGMA and value Q[a]; outcome c gives reward REWARD[c], the
    next state's value VALUE[c] and discount DISCOUNT."""

    def decision_fn(params, key, action, state):
        del params, key
        b = action.shape[0]
        return mctx.DecisionRecurrentFnOutput(
            chance_logits=jnp.log(jnp.broadcast_to(jnp.asarray(SIGMA), (b, 2))),
            afterstate_value=jnp.asarray(Q)[action]), state

    def chance_fn(params, key, outcome, afterstate):
        del params, key
        b = outcome.shape[0]
        return mctx.ChanceRecurrentFnOutput(
            action_logits=jnp.broadcast_to(jnp.asarray([10.0, -10.0]), (b, 2)),
            value=jnp.asarray(VALUE)[outcome], reward=jnp.asarray(REWARD)[outcome],
            discount=jnp.full((b,), DISCOUNT)), afterstate

    settings = muzero.SearchConfig(
        search="muzero", num_simulations=num_simulations, support_size=10, discount=0.97,
        dirichlet_alpha=0.3, dirichlet_fraction=0.25, temperature=1.0,
        q_transform=q_transform, unvisited_q=unvisited_q, max_num_considered_actions=16,
        gumbel_scale=1.0)
    root = mctx.RootFnOutput(prior_logits=jnp.asarray([[10.0, -10.0]]),
                             value=jnp.asarray([ROOT_VALUE]), embedding=jnp.zeros((1, 1)))
    return smz.search_with(root, decision_fn, chance_fn, None, jax.random.PRNGKey(0),
                           settings, evaluation=True)


@pytest.mark.parametrize("q_transform,unvisited_q", [("parent_and_siblings", "min"),
                                                      ("tree_min_max", "parent_mean")])
def test_search_backs_up_the_expectation_over_chance_outcomes(q_transform, unvisited_q):
    # The priors (10 against -10) choose action 0 whatever PUCT's value term says, so each
    # value term must give the same tree (that the search uses the one asked for:
    # `test_decision_nodes_use_the_agents_q_transform_and_unvisited_q`). Simulation 1 expands the afterstate of action 0 (node 1, value Q0 = 0.5): root value
    # (0.1 + 0.5) / 2 = 0.3. Simulation 2: action 0 again; at node 1 outcome 0 (0.6 / 1 >
    # 0.4 / 1) expands node 2; backed up 1 + 0.9 * 0.2 = 1.18: node 1 (0.5 + 1.18) / 2 =
    # 0.84, root (2 * 0.3 + 1.18) / 3. Simulation 3: outcome 1 (0.6 / 2 < 0.4 / 1) expands
    # node 3; backed up -1 + 0.9 * 0.4 = -0.64: node 1 (2 * 0.84 - 0.64) / 3, root
    # (3 * (1.78 / 3) - 0.64) / 4 = 0.285.
    out = _toy_search(3, q_transform, unvisited_q)
    tree = out.search_tree
    np.testing.assert_allclose(tree.node_values[0, :4],
                               [0.285, (2 * 0.84 - 0.64) / 3, 0.2, 0.4], rtol=1e-5)
    np.testing.assert_allclose(tree.summary().value, [0.285], rtol=1e-5)
    np.testing.assert_array_equal(tree.summary().visit_counts, [[3, 0]])
    np.testing.assert_allclose(out.action_weights, [[1.0, 0.0]])
    # The states below the chance node are its outcomes 0 and 1, with the rewards and
    # discounts of the chance function.
    np.testing.assert_array_equal(tree.parents[0, :4], [-1, 0, 1, 1])
    np.testing.assert_array_equal(tree.action_from_parent[0, :4], [-1, 0, 2, 3])  # A + c


def test_decision_nodes_use_the_agents_q_transform_and_unvisited_q(monkeypatch):
    from agents.stochastic_muzero import search as search_module

    seen = spy_on_keywords(monkeypatch, search_module, "qtransform")
    for scope, unvisited in [("tree_min_max", "parent_mean"), ("parent_and_siblings", "min")]:
        seen.clear()
        _toy_search(3, scope, unvisited)
        assert seen and all(kw == {"scope": scope, "unvisited": unvisited,
                                    "mean_q_method": "walk"} for kw in seen)


def test_search_with_four_simulations_reaches_a_decision_node_below_an_outcome():
    # Simulation 4: at node 1, outcome 0 (0.6 / 2 = 0.3 > 0.4 / 2) leads to node 2, an
    # expanded decision node, whose action 0 (prior 10 vs -10) expands
    # node 4, an afterstate worth Q0 = 0.5: backed up 0.5 into node 2, 1 + 0.9 * 0.5 = 1.45
    # into node 1, and the root becomes (4 * 0.285 + 1.45) / 5.
    tree = _toy_search(4).search_tree
    np.testing.assert_array_equal(tree.parents[0, :5], [-1, 0, 1, 1, 2])
    np.testing.assert_allclose(tree.node_values[0, 4], 0.5, rtol=1e-6)
    np.testing.assert_allclose(tree.node_values[0, 2], (0.2 + 0.5) / 2, rtol=1e-6)
    np.testing.assert_allclose(tree.summary().value, [(4 * 0.285 + 1.45) / 5], rtol=1e-5)


def _small_config(**changes):
    config = smz.default_config()
    config.hidden_sizes, config.latent_size = (16,), 16
    config.num_chance_outcomes, config.support_size = 3, 3
    for field, value in changes.items():
        config[field] = value
    return config


def _catch_spec():
    import envs_jax

    return envs_jax.make("catch").spec()


class _KnownStochasticModel:
    """A stand-in model with outputs worked by hand, on the support [-10, 10]: afterstate(s,
    a) = s + a; at an afterstate x, sigma's logits [x0, -x0, 0] and Q = 0 (all mass on bin
    0); dynamics(x, code) = (reward 3: h(3) = 1.003, mass 0.997 / 0.003 on bins +1 / +2;
    the next state x + [1, 2, 3] . code); at a state y, the prior logits [y0, 2 y0, -y0],
    value 0.2 (h(0.2) = 0.0956451: mass 0.904355 / 0.0956451 on bins 0 / +1) and the
    terminal head's logit y0."""

    num_chance_outcomes = 3
    terminal_head = True

    def apply(self, params, x, *args, method):
        del params
        batch = x.shape[0]
        if method == "afterstate":
            return x + args[0][:, None]
        if method == "afterstate_predict":
            return (jnp.stack([x[:, 0], -x[:, 0], jnp.zeros(batch)], axis=-1),
                    two_hot_logits({10: 1.0}, batch))
        if method == "dynamics":
            shift = args[0] @ jnp.asarray([1.0, 2.0, 3.0])
            return two_hot_logits(THREE, batch), x + shift[:, None]
        if method == "predict":
            return (jnp.stack([x[:, 0], 2 * x[:, 0], -x[:, 0]], axis=-1),
                    two_hot_logits(POINT_TWO, batch))
        assert method == "terminal_logit", method
        return x[:, 0]


def test_recurrent_functions_read_the_afterstate_and_chance_heads():
    model = _KnownStochasticModel()
    state = jnp.asarray([[0.5, 7.0], [-1.0, 7.0]])
    decision, afterstate = smz.make_decision_recurrent_fn(model, 10)(
        None, None, jnp.asarray([0, 2]), state)
    np.testing.assert_allclose(afterstate, [[0.5, 7.0], [1.0, 9.0]])
    np.testing.assert_allclose(decision.chance_logits, [[0.5, -0.5, 0.0], [1.0, -1.0, 0.0]])
    np.testing.assert_allclose(decision.afterstate_value, [0.0, 0.0], atol=5e-4)
    chance, next_state = smz.make_chance_recurrent_fn(model, 10, 0.9)(
        None, None, jnp.asarray([1, 2]), afterstate)
    np.testing.assert_allclose(next_state, [[2.5, 9.0], [4.0, 12.0]])  # + 2, + 3
    np.testing.assert_allclose(chance.reward, [3.0, 3.0], atol=1e-3)
    np.testing.assert_allclose(chance.value, [0.2, 0.2], atol=5e-4)  # float32 inverse of h
    np.testing.assert_allclose(chance.action_logits, [[2.5, 5.0, -2.5], [4.0, 8.0, -4.0]])
    # gamma (1 - P(end)) = 0.9 sigmoid(-y0): 0.9 / (1 + e^2.5) and 0.9 / (1 + e^4).
    np.testing.assert_allclose(chance.discount, [0.0682724, 0.0161876], rtol=1e-5)


def test_the_code_is_the_argmax_one_hot_passed_straight_through():
    encoding = jnp.asarray([[0.2, 0.5, 0.1], [0.9, 0.3, 0.0]])
    np.testing.assert_array_equal(smz.quantise(encoding), [[0, 1, 0], [1, 0, 0]])
    weights = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    grad = jax.grad(lambda e: jnp.sum(weights * smz.quantise(e)))(encoding)
    np.testing.assert_allclose(grad, weights)  # the identity backwards


def _hand_example(chance_mask, prior_to_encoder=False):
    # K = 2, C = 3, S = 1 (3 bins). Value targets 0: two-hot on the middle bin; uniform Q
    # logits: CE ln 3 per step. sigma's logits: zeros (CE ln 3 against code 1) and (ln 2,
    # 0, 0) (CE -ln(2 / 4) = ln 2 against code 0). Commitment: |(0,1,0) - (.2,.5,.1)|^2 =
    # 0.30 and |(1,0,0) - (.9,.3,0)|^2 = 0.10.
    encodings = jnp.asarray([[0.2, 0.5, 0.1], [0.9, 0.3, 0.0]])
    chance_logits = jnp.asarray([[0.0, 0.0, 0.0], [math.log(2.0), 0.0, 0.0]])
    return functools.partial(
        smz.chance_loss, jnp.zeros((2, 3)), chance_logits, value_targets=jnp.zeros(3),
        value_mask=jnp.asarray([1.0, 1.0, 0.0]), chance_mask=jnp.asarray(chance_mask),
        support_size=1, afterstate_value_cost=1.0, chance_cost=0.5, commitment_cost=0.25,
        prior_to_encoder=prior_to_encoder), encodings


def test_chance_loss_matches_a_hand_computation():
    loss_fn, encodings = _hand_example([1.0, 1.0])
    out = loss_fn(encodings)
    ln2, ln3 = math.log(2.0), math.log(3.0)
    np.testing.assert_allclose(out.afterstate_value_loss, 2 * ln3, rtol=1e-5)
    np.testing.assert_allclose(out.chance_loss, ln3 + ln2, rtol=1e-5)
    np.testing.assert_allclose(out.commitment_loss, 0.40, rtol=1e-5)
    np.testing.assert_allclose(out.loss, (2 * ln3 + 0.5 * (ln3 + ln2) + 0.25 * 0.40) / 3,
                               rtol=1e-5)
    # A transition past the episode's end is not learnt: the second step drops out.
    masked = _hand_example([1.0, 0.0])[0](encodings)
    np.testing.assert_allclose(masked.chance_loss, ln3, rtol=1e-5)
    np.testing.assert_allclose(masked.commitment_loss, 0.30, rtol=1e-5)


@pytest.mark.parametrize("prior_to_encoder", [False, True])
def test_the_encoder_learns_from_the_commitment_and_from_sigma_only_when_switched_on(
        prior_to_encoder):
    loss_fn, encodings = _hand_example([1.0, 1.0], prior_to_encoder)
    grad = jax.grad(lambda e: loss_fn(e).loss)(encodings)
    # d/dc^e of beta |c - c^e|^2 / (K + 1) = -2 beta (c - c^e) / 3.
    commitment = -2 * 0.25 * (smz.quantise(encodings) - encodings) / 3
    if not prior_to_encoder:
        np.testing.assert_allclose(grad, commitment, rtol=1e-5, atol=1e-7)
    else:
        # Through the straight-through code, CE's gradient w.r.t. the target is -log p.
        log_p = jax.nn.log_softmax(jnp.asarray([[0.0, 0.0, 0.0], [math.log(2.0), 0, 0]]))
        np.testing.assert_allclose(grad, commitment - 0.5 * log_p / 3, rtol=1e-5, atol=1e-7)


def test_transition_mask_and_code_entropy_by_hand():
    first, mid, last = StepType.FIRST, StepType.MID, StepType.LAST
    # o_0 -> o_1 and o_1 -> o_2 (o_2 the episode's end) are learnt; o_2 -> o_3 is a reset.
    np.testing.assert_array_equal(
        smz.transition_mask(jnp.asarray([first, mid, last, first]), 3), [1, 1, 0])
    codes = jnp.asarray([[1, 0], [0, 1], [1, 0], [1, 0], [0, 1]], jnp.float32)
    mask = jnp.asarray([1, 1, 1, 1, 0])
    np.testing.assert_allclose(smz.code_entropy(codes, mask),
                               -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), rtol=1e-6)
    np.testing.assert_allclose(smz.code_entropy(codes[:1], mask[:1]), 0.0, atol=1e-7)


@pytest.mark.parametrize("field,value", [
    ("search", "gumbel"), ("num_chance_outcomes", 0), ("encoder_input", "both"),
    ("encoder_output", "tanh"), ("commitment_cost", -1.0), ("encoder_hidden_sizes", ()),
    ("q_transform", "minmax"),
])
def test_bad_fields_fail_naming_the_field(field, value):
    config = smz.default_config()
    config[field] = value
    with pytest.raises(ConfigError, match=f"agent.{field}"):
        smz.validate(config)


def test_registered_and_sweepable_over_its_loss_weights():
    assert "stochastic_muzero" in agents.registered()
    config = agents.default_config("stochastic_muzero")
    assert config.name == "stochastic_muzero" and config.search == "muzero"
    assert {"commitment_cost", "chance_cost", "afterstate_value_cost"} <= set(smz.SWEEPABLE)


def test_every_search_has_twice_the_simulations_of_the_muzero_search_beside_it():
    """A simulation expands a state or an afterstate (the hand-worked tree above), so twice
    MuZero's simulations expand about as many states as MuZero's: the agent's default
    against MuZero's, and each shipped config against the MuZero config it is built from."""
    from experiments.configs import (muzero_catch, muzero_minatar, stochastic_muzero_catch,
                                     stochastic_muzero_minatar)

    assert smz.default_config().num_simulations == 2 * muzero.default_config().num_simulations
    for stochastic, plain in ((stochastic_muzero_catch, muzero_catch),
                              (stochastic_muzero_minatar, muzero_minatar)):
        assert (stochastic.get_config().agent.num_simulations
                == 2 * plain.get_config().agent.num_simulations)


@pytest.mark.optimised
def test_stochastic_muzero_learns_catch_under_anakin():
    """The shipped config on plain Catch (no drift): a random policy scores about -0.6; after
    32K environment steps the training return is >= 0.3 (0.89, 0.96 and 0.95 on seeds 0, 1, 2
    on a 2-core Intel Xeon, which were at 0.54, 0.60 and 0.77 after 24K)."""
    import anakin
    from experiments.configs import stochastic_muzero_catch

    config = stochastic_muzero_catch.get_config()
    config.env.name = "catch"
    config.num_devices, config.total_env_steps = 1, 32_000
    result = anakin.train(config)
    returns = [h["episode_return"] for h in result.history]
    assert returns[0] < 0.0, returns
    assert result.final_metrics["episode_return"] >= 0.3, returns


@pytest.mark.optimised
def test_stochastic_muzero_learns_catch_under_sebulba():
    """The same agent on `envs_jax:catch` stepped on the host (actor device 0, learner
    device 1), the actors waiting for each update: the mean return over the last quarter of
    32K steps is >= 0.3."""
    import sebulba
    from experiments.configs import sebulba_stochastic_muzero_catch

    config = sebulba_stochastic_muzero_catch.get_config()
    config.env.task = "envs_jax:catch"
    config.actor_device_ids, config.learner_device_ids = (0,), (1,)
    config.total_env_steps, config.log_every_updates = 32_000, 10
    config.checkpoint_every_updates, config.eval_every_updates = 0, 0
    result = sebulba.train(config)
    late = [r for r in result.history if r["env_steps"] > 24_000 and r["episodes"]]
    mean_late = (sum(r["episode_return"] * r["episodes"] for r in late)
                 / sum(r["episodes"] for r in late))
    curve = [round(r["episode_return"], 2) for r in result.history]
    assert result.history[0]["episode_return"] < 0.0, curve
    assert mean_late >= 0.3, curve


def test_shipped_configs_are_valid():
    import anakin
    import sebulba
    from experiments.configs import sebulba_stochastic_muzero_catch, stochastic_muzero_catch

    config = stochastic_muzero_catch.get_config()
    assert anakin.validate(config, 8) == 8
    assert config.agent.name == "stochastic_muzero" and config.env.name == "stochastic_catch"
    sebulba_config = sebulba_stochastic_muzero_catch.get_config()
    sebulba.validate(sebulba_config, num_local_devices=1, num_processes=1)
    assert sebulba_config.agent.rollout_length == sebulba_config.rollout_length
