"""`envs_jax.diagnostics` against bsuite (the reference) and against hand-derived returns.

bsuite's environments auto-reset exactly as ours do (the step after LAST returns FIRST and
ignores its action), so each test drives ours (jitted, scanned, `AutoReset`) and bsuite's with
the same actions and compares every timestep. What bsuite draws from numpy per episode (the
memory chain's context and query, the umbrella chain's need and initial umbrella) is copied
from our state into bsuite's after each reset; what it draws from numpy per step and we from
JAX (the umbrella chain's noise rewards and distractors) is checked for its range only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from podracer.types import StepType

bsuite_envs = pytest.importorskip("bsuite.environments")
from bsuite.environments import bandit, deep_sea, memory_chain, umbrella_chain


def _rollout(env, actions: np.ndarray, seed: int = 0):
    """Ours under AutoReset: the reset, then one step per action; states (inner) included."""
    auto = envs_jax.AutoReset(env)

    def run(key, actions):
        state, timestep = auto.reset(key)

        def body(state, action):
            state, timestep = auto.step(state, action)
            return state, (timestep, state.env_state)

        _, (timesteps, states) = jax.lax.scan(body, state, actions)
        return timestep, state.env_state, timesteps, states

    return jax.device_get(jax.jit(run)(jax.random.PRNGKey(seed), jnp.asarray(actions)))


def _at(tree, t):
    return jax.tree.map(lambda x: x[t], tree)


def _compare(ours, theirs, where: str, *, observation=True) -> None:
    assert int(ours.step_type) == int(theirs.step_type), where
    if theirs.step_type != StepType.FIRST:
        np.testing.assert_allclose(ours.reward, theirs.reward, rtol=1e-6, atol=1e-7, err_msg=where)
        assert float(ours.discount) == float(theirs.discount), where
    if observation:
        np.testing.assert_allclose(
            ours.observation, theirs.observation, rtol=1e-6, atol=1e-7, err_msg=where
        )


@pytest.mark.parametrize("size, mapping_seed", [(5, 0), (10, 3)])
def test_deep_sea_matches_bsuite(size: int, mapping_seed: int):
    ours = envs_jax.DeepSea(size, mapping_seed=mapping_seed)
    theirs = deep_sea.DeepSea(size, mapping_seed=mapping_seed, seed=0)
    np.testing.assert_array_equal(ours.action_mapping, theirs._action_mapping)
    # Actions: "right" 90% of the time, so the far corner's reward is reached now and then;
    # chosen on a first pass through bsuite's environment, then replayed in both.
    rng = np.random.default_rng(0)
    actions = []
    theirs.reset()
    for _ in range(3000):
        row, column = theirs._row, theirs._column
        right = theirs._action_mapping[min(row, size - 1), column]
        action = int(right) if rng.random() < 0.9 else int(rng.integers(0, 2))
        actions.append(action)
        theirs.step(action)
    actions = np.asarray(actions, np.int32)
    first, _, timesteps, _ = _rollout(ours, actions)
    theirs = deep_sea.DeepSea(size, mapping_seed=mapping_seed, seed=0)
    _compare(first, theirs.reset(), "reset")
    found = 0
    for t, action in enumerate(actions):
        expected = theirs.step(int(action))
        _compare(_at(timesteps, t), expected, f"step {t}")
        found += int(expected.last() and expected.reward > 0.5)
    assert found > 10


def test_deep_sea_returns_by_hand():
    size = 10
    env = envs_jax.DeepSea(size, mapping_seed=7)
    state, timestep = env.reset(jax.random.PRNGKey(0))
    # Always "right": -0.01/N per step, +1 on the last step from the right-most column.
    rewards = []
    for _ in range(size):
        action = env.action_mapping[int(state.row), int(state.column)]
        state, timestep = env.step(state, jnp.asarray(action))
        rewards.append(float(timestep.reward))
    assert int(timestep.step_type) == StepType.LAST and float(timestep.discount) == 0.0
    np.testing.assert_allclose(sum(rewards), 1.0 - 0.01, rtol=1e-6)
    assert float(timestep.observation.sum()) == 0.0  # the end-of-episode null observation
    # Always "left": no cost, no reward, the same length.
    state, _ = env.reset(jax.random.PRNGKey(0))
    total = 0.0
    for _ in range(size):
        action = 1 - env.action_mapping[int(state.row), int(state.column)]
        state, timestep = env.step(state, jnp.asarray(action))
        total += float(timestep.reward)
    assert total == 0.0 and int(timestep.step_type) == StepType.LAST


@pytest.mark.parametrize("memory_length, num_bits", [(3, 1), (5, 2)])
def test_memory_chain_matches_bsuite(memory_length: int, num_bits: int):
    ours = envs_jax.MemoryChain(memory_length, num_bits=num_bits)
    actions = np.random.default_rng(1).integers(0, 2, 600)
    first, first_state, timesteps, states = _rollout(ours, actions)
    theirs = memory_chain.MemoryChain(memory_length, num_bits, seed=0)

    def sync(state):  # bsuite drew its own context and query: use ours
        theirs._context = np.asarray(state.context)
        theirs._query = int(state.query)
        return theirs._get_observation()

    reference = theirs.reset()
    _compare(first, reference._replace(observation=sync(first_state)), "reset")
    rewards = []
    for t, action in enumerate(actions):
        expected = theirs.step(int(action))
        if expected.first():
            expected = expected._replace(observation=sync(_at(states, t)))
        _compare(_at(timesteps, t), expected, f"step {t}")
        if expected.last():
            rewards.append(float(expected.reward))
    # Episodes of memory_length + 1 steps, then the reset step.
    assert len(rewards) == len(actions) // (memory_length + 2)
    assert set(rewards) == {-1.0, 1.0}


def test_memory_chain_rewards_remembering_by_hand():
    env = envs_jax.MemoryChain(4)
    for seed in range(6):
        state, timestep = env.reset(jax.random.PRNGKey(seed))
        bit = int(timestep.observation[0, 2] > 0)  # the context, as +-1, on FIRST only
        for t in range(5):
            state, timestep = env.step(state, jnp.asarray(bit))
        assert int(timestep.step_type) == StepType.LAST and float(timestep.reward) == 1.0


def test_umbrella_chain_matches_bsuite():
    chain_length = 6
    ours = envs_jax.UmbrellaChain(chain_length, n_distractor=3)
    actions = np.random.default_rng(2).integers(0, 2, 700)
    first, first_state, timesteps, states = _rollout(ours, actions)
    theirs = umbrella_chain.UmbrellaChain(chain_length, n_distractor=3, seed=0)

    def sync(state):
        theirs._need_umbrella = int(state.need_umbrella)
        theirs._has_umbrella = int(state.has_umbrella)
        return theirs._get_observation()

    theirs.reset()
    np.testing.assert_array_equal(first.observation[0, :3], sync(first_state)[0, :3])
    finals = []
    for t, action in enumerate(actions):
        expected = theirs.step(int(action))
        if expected.first():
            expected = expected._replace(observation=sync(_at(states, t)))
        ours_t = _at(timesteps, t)
        where = f"step {t}"
        assert int(ours_t.step_type) == int(expected.step_type), where
        # The first three entries are deterministic; distractors are random bits in both.
        np.testing.assert_allclose(
            ours_t.observation[0, :3],
            expected.observation[0, :3],
            rtol=1e-6,
            atol=1e-7,
            err_msg=where,
        )
        assert set(np.unique(ours_t.observation[0, 3:])) <= {0.0, 1.0}
        if expected.mid():
            assert float(ours_t.reward) in (-1.0, 1.0), where  # noise
        if expected.last():
            assert float(ours_t.reward) == float(expected.reward), where
            assert float(ours_t.discount) == 0.0
            finals.append(float(expected.reward))
    assert set(finals) == {-1.0, 1.0}


def test_umbrella_chain_pays_for_the_right_first_action_by_hand():
    env = envs_jax.UmbrellaChain(5)
    for seed in range(6):
        state, timestep = env.reset(jax.random.PRNGKey(seed))
        need = int(timestep.observation[0, 0])
        for t in range(5):
            state, timestep = env.step(state, jnp.asarray(need if t == 0 else 1 - need))
        assert int(timestep.step_type) == StepType.LAST and float(timestep.reward) == 1.0


@pytest.mark.parametrize("num_actions, mapping_seed", [(11, 0), (5, 4)])
def test_bandit_matches_bsuite(num_actions: int, mapping_seed: int):
    ours = envs_jax.Bandit(num_actions, mapping_seed=mapping_seed)
    theirs = bandit.SimpleBandit(mapping_seed=mapping_seed, num_actions=num_actions)
    np.testing.assert_allclose(ours.arm_rewards, theirs._rewards, rtol=1e-6)
    actions = np.random.default_rng(3).integers(0, num_actions, 200)
    first, _, timesteps, _ = _rollout(ours, actions)
    _compare(first, theirs.reset(), "reset")
    for t, action in enumerate(actions):
        _compare(_at(timesteps, t), theirs.step(int(action)), f"step {t}")
    # The arm rewards are 0, 0.1, ..., 1 in some order (bsuite's definition).
    np.testing.assert_allclose(np.sort(ours.arm_rewards), np.linspace(0, 1, num_actions), atol=1e-7)
