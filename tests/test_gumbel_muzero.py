"""Gumbel MuZero (MuZero with `search="gumbel"`): the policy target, acting, evaluation and
learning Catch at 2 simulations.

The expected values are derived by hand from the paper's definitions (Danihelka et al., 2022:
Sequential Halving with Gumbel at the root, the mixed value of its appendix D, the improved
policy softmax(logits + sigma(completed Q)) with sigma(q) = (c_visit + max_b N(b)) c_scale q on
min-max normalised Q), at mctx's constants c_visit = 50 and c_scale = 0.1, and the least range
of Q the normalisation divides by at mctx's 1e-8 unless a test sets it.
"""

import functools

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

import anakin
from agents import muzero
from experiments.configs import gumbel_muzero_catch
from podracer.config import ConfigError
from podracer.types import TimeStep

C_VISIT, C_SCALE = 50.0, 0.1
MCTX_FLOOR = 1e-8  # mctx's least range of Q for the min-max normalisation (its `epsilon`)
LOGITS = np.array([1.0, 0.5, 0.0])  # the prior at the root: a0 first, then a1, then a2


def _softmax(x):
    e = np.exp(x - np.max(x))
    return e / e.sum()


def _bandit_search(params, observation, key, evaluation, *, c_visit=C_VISIT, c_scale=C_SCALE,
                   q_floor=MCTX_FLOOR):
    """`search(params, observation, key, evaluation)` of MuZero's `search_with` (Gumbel, 2
    simulations) on a one-step bandit with params {"q": [3], "v": []}: the root's prior is
    `LOGITS` and its value v; taking a at the root gives reward q[a] and discount 0, so
    Q(a) = q[a] exactly."""
    del observation

    def recurrent_fn(params, key, action, embedding):
        del key
        out = mctx.RecurrentFnOutput(
            reward=jnp.where(embedding == 0, params["q"][action], 0.0),
            discount=jnp.zeros_like(embedding), prior_logits=jnp.zeros((1, 3)),
            value=jnp.zeros_like(embedding))
        return out, embedding + 1

    settings = muzero.SearchConfig(
        search="gumbel", num_simulations=2, support_size=10, discount=0.97,
        dirichlet_alpha=0.3, dirichlet_fraction=0.25, temperature=1.0,
        q_transform="parent_and_siblings", unvisited_q="min", max_num_considered_actions=16,
        gumbel_scale=1.0, gumbel_value_scale=c_scale, gumbel_maxvisit_init=c_visit,
        gumbel_q_floor=q_floor)
    root = mctx.RootFnOutput(prior_logits=jnp.asarray(LOGITS, jnp.float32)[None],
                             value=params["v"][None], embedding=jnp.zeros((1,), jnp.float32))
    return muzero.search_with(root, recurrent_fn, params, key, settings, evaluation=evaluation)


_SEARCH = jax.jit(_bandit_search, static_argnums=3)
_ACTOR_STEP = jax.jit(muzero.make_actor_step(_bandit_search, kind="gumbel"),
                      static_argnames="evaluation")


def _improved_policy(q, raw_value, visits, *, c_visit=C_VISIT, c_scale=C_SCALE,
                     q_floor=MCTX_FLOOR):
    """softmax(logits + sigma(completed Q)) by hand: unvisited actions take the mixed value
    v_mix = (v + sum N * sum_{visited} pi q / sum_{visited} pi) / (1 + sum N); Q is min-max
    normalised over the completed Q of the root's children, divided by their range or
    `q_floor`, whichever is larger; sigma scales it by (c_visit + max N) c_scale. Also
    returns sigma."""
    q, visits = np.asarray(q, np.float64), np.asarray(visits)
    pi, seen = _softmax(LOGITS), visits > 0
    weighted = np.sum(np.where(seen, pi * q, 0.0)) / np.sum(np.where(seen, pi, 0.0))
    v_mix = (raw_value + visits.sum() * weighted) / (1 + visits.sum())
    completed = np.where(seen, q, v_mix)
    normalised = (completed - completed.min()) / max(completed.max() - completed.min(), q_floor)
    sigma = (c_visit + visits.max()) * c_scale * normalised
    return _softmax(LOGITS + sigma), sigma


def _bandit(q, raw_value):
    return {"q": jnp.asarray(q, jnp.float32), "v": jnp.asarray(raw_value, jnp.float32)}


def _act(q, raw_value, *, evaluation, key=0, actor_step=_ACTOR_STEP):
    timestep = TimeStep(step_type=jnp.zeros(1, jnp.int32), reward=jnp.zeros(1),
                        discount=jnp.ones(1), observation=jnp.zeros((1, 1)))
    action, _, extras = actor_step(_bandit(q, raw_value), (), timestep,
                                    jax.random.PRNGKey(key), evaluation=evaluation)
    return int(action[0]), np.asarray(extras["policy"][0])


def test_the_policy_target_is_the_improved_policy_of_completed_q():
    # Without Gumbel noise (evaluation), Sequential Halving at 2 simulations over 3 actions
    # visits the two of highest logits + sigma(q): before any visit every child's completed
    # Q is v and sigma is 0, so a0; then a1 (a1 and a2 share v_mix). Visits (1, 1, 0).
    q, v = [0.1, 0.6, 0.9], 0.2
    action, policy = _act(q, v, evaluation=True)
    expected, sigma = _improved_policy(q, v, [1, 1, 0])
    np.testing.assert_allclose(policy, expected, rtol=1e-5)
    # The target is not the visit counts (1/2, 1/2, 0): a2, never visited, keeps mass.
    assert policy[2] > 0.01
    # Acting: the argmax of logits + sigma over the most visited (a0, a1): a1.
    assert np.argmax((LOGITS + sigma)[:2]) == 1 and action == 1


@pytest.mark.parametrize("key", [0, 1, 2, 3])
def test_acting_takes_sequential_halvings_action_under_the_gumbel_draw(key):
    q, v = [0.3, -0.2, 0.8], 0.1
    out = _SEARCH(_bandit(q, v), None, jax.random.PRNGKey(key), False)
    action, policy = _act(q, v, evaluation=False, key=key)
    visits = np.asarray(out.search_tree.summary().visit_counts[0])
    gumbel = np.asarray(out.search_tree.extra_data.root_gumbel[0])
    assert visits.sum() == 2 and visits.max() == 1  # two distinct actions tried once
    expected, sigma = _improved_policy(q, v, visits)
    np.testing.assert_allclose(policy, expected, rtol=1e-5)
    # The first visit is the top of g + logits (the Gumbel-top-k sample's head) ...
    assert visits[np.argmax(gumbel + LOGITS)] == 1
    # ... and the action the best visited one by g + logits + sigma(q): no sampling from
    # visit counts, no temperature.
    score = np.where(visits == visits.max(), gumbel + LOGITS + sigma, -np.inf)
    assert action == int(np.argmax(score))


def test_evaluation_acts_with_sequential_halvings_choice_not_the_targets_argmax():
    # The two visited actions (a0, a1) turn out worse than the root's value v = 1: the mixed
    # value completing a2 is the highest Q, so the improved policy's argmax is a2, an action
    # the search never tried. Evaluation (g = 0) acts as the paper does: a0, the best of the
    # visited by logits + sigma(q).
    q, v = [0.1, 0.0, -1.0], 1.0
    action, policy = _act(q, v, evaluation=True)
    expected, sigma = _improved_policy(q, v, [1, 1, 0])
    np.testing.assert_allclose(policy, expected, rtol=1e-5)
    assert np.argmax(expected) == 2
    assert np.argmax((LOGITS + sigma)[:2]) == 0 and action == 0
    # Deterministic: no Gumbel noise when evaluating.
    assert all(_act(q, v, evaluation=True, key=k)[0] == 0 for k in range(4))


def test_sigmas_constants_are_switches():
    # The paper's c_visit and c_scale, here 10 and 1.0 instead of mctx's 50 and 0.1.
    search = functools.partial(_bandit_search, c_visit=10.0, c_scale=1.0)
    actor_step = jax.jit(muzero.make_actor_step(search, kind="gumbel"),
                         static_argnames="evaluation")
    q, v = [0.1, 0.6, 0.9], 0.2
    _, policy = _act(q, v, evaluation=True, actor_step=actor_step)
    expected, _ = _improved_policy(q, v, [1, 1, 0], c_visit=10.0, c_scale=1.0)
    np.testing.assert_allclose(policy, expected, rtol=1e-5)
    assert not np.allclose(policy, _improved_policy(q, v, [1, 1, 0])[0], rtol=1e-2)
    config = muzero.default_config()
    config.gumbel_value_scale, config.gumbel_maxvisit_init = 1.0, 10.0
    settings = muzero.search_config(config)
    assert (settings.gumbel_value_scale, settings.gumbel_maxvisit_init) == (1.0, 10.0)


def test_sigmas_floor_keeps_a_small_q_gap_from_taking_its_full_scale():
    # Q gaps of 0.03 and 0.01 (v_mix, completing a2, lies between the two visited Q): without
    # a floor the min-max normalisation stretches them to 0 .. 1, so sigma spreads its full
    # (50 + 1) 0.1 = 5.1 over the three children; with the floor at 0.1 the spread is
    # 5.1 x 0.03 / 0.1 = 1.53 and the prior's logits still count.
    q, v = [0.50, 0.53, 0.0], 0.52
    search = functools.partial(_bandit_search, q_floor=0.1)
    actor_step = jax.jit(muzero.make_actor_step(search, kind="gumbel"),
                         static_argnames="evaluation")
    _, policy = _act(q, v, evaluation=True, actor_step=actor_step)
    expected, sigma = _improved_policy(q, v, [1, 1, 0], q_floor=0.1)
    np.testing.assert_allclose(policy, expected, rtol=1e-5)
    np.testing.assert_allclose(np.ptp(sigma), 51 * 0.1 * 0.03 / 0.1, rtol=1e-3)
    floorless, floorless_sigma = _improved_policy(q, v, [1, 1, 0])
    np.testing.assert_allclose(np.ptp(floorless_sigma), 5.1, rtol=1e-6)
    np.testing.assert_allclose(_act(q, v, evaluation=True)[1], floorless, rtol=1e-5)
    # The floorless target puts 95% of its mass on a1, whose Q is 0.03 higher; the floored
    # one 61%, leaving a0, the prior's favourite, 22%.
    assert floorless[1] > 0.9 and expected[1] < 0.7 and expected[0] > 0.2


def test_the_agents_gumbel_floor_reaches_the_search_and_is_validated():
    config = muzero.default_config()
    assert muzero.search_config(config).gumbel_q_floor == config.gumbel_q_floor == 0.1
    config.gumbel_q_floor = 0.5
    assert muzero.search_config(config).gumbel_q_floor == 0.5
    for bad in (0.0, -1.0, None, True):
        config.gumbel_q_floor = bad
        with pytest.raises(ConfigError, match=r"agent\.gumbel_q_floor: must be a positive"):
            muzero.validate(config)


def test_an_unknown_search_names_the_field():
    config = muzero.default_config()
    config.search = "gumble"
    with pytest.raises(ConfigError, match=r"agent\.search: unknown value 'gumble' \(did you "
                                          r"mean gumbel\?\)"):
        muzero.validate(config)


@pytest.mark.optimised
def test_gumbel_muzero_learns_catch_with_two_simulations():
    """Gumbel MuZero at 2 simulations on Anakin Catch: a random policy scores about -0.6;
    after 40K environment steps the training return is >= 0.5 (PUCT at 2 simulations stays
    below 0 through 64K on seeds 0, 1, 2: docs/gumbel_muzero.md)."""
    config = gumbel_muzero_catch.get_config()
    assert config.agent.search == "gumbel" and config.agent.num_simulations == 2
    config.num_devices = 1
    config.total_env_steps = 40_000
    result = anakin.train(config)
    returns = [h["episode_return"] for h in result.history]
    assert returns[0] < 0.0, returns  # started at random play
    assert result.final_metrics["episode_return"] >= 0.5, returns


def test_gumbel_muzero_is_a_registered_agent_with_the_gumbel_search():
    import agents
    from podracer.types import ArraySpec, DiscreteSpec, EnvSpec

    assert "gumbel_muzero" in agents.registered()
    config = agents.default_config("gumbel_muzero")
    assert config.name == "gumbel_muzero" and config.search == "gumbel"
    # Every other field is MuZero's default.
    mz = muzero.default_config()
    assert {k: v for k, v in config.items() if k not in ("name", "search")} == {
        k: v for k, v in mz.items() if k not in ("name", "search")}
    spec = EnvSpec(observation=ArraySpec((5,), np.float32), action=DiscreteSpec(3))
    agents.make(config, spec)
    config.search = "muzero"
    with pytest.raises(ConfigError, match="agent.search.*use the muzero agent"):
        agents.make(config, spec)
