"""`envs_jax.wrappers` and `envs_jax.registry` on small hand-made environments.

Expected values are derived by hand (or with numpy from the raw observations), never from the
wrappers themselves.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import registry
from podracer.types import ArraySpec, DiscreteSpec, StepType, TimeStep


@chex.dataclass(frozen=True)
class _CounterState:
    t: jax.Array


class _Counter(envs_jax.Environment):
    """Observation {"a": [t, 2t] float32, "b": [[t > 1]] bool}; reward t (per agent: [t, -t]);
    terminates (discount 0) on step `end`."""

    def __init__(self, end: int = 3, agents: int = 0):
        self.end, self.agents = end, agents

    def _timestep(self, t, step_type, discount):
        obs = {"a": jnp.stack([t, 2 * t]).astype(jnp.float32), "b": jnp.reshape(t > 1, (1, 1))}
        reward = t.astype(jnp.float32)
        if self.agents:
            reward = jnp.stack([reward, -reward])
        return TimeStep(
            step_type=jnp.asarray(step_type, jnp.int32),
            reward=jnp.where(step_type == StepType.FIRST, 0.0, reward),
            discount=jnp.asarray(discount, jnp.float32),
            observation=obs,
        )

    def reset(self, key):
        t = jnp.zeros((), jnp.int32)
        return _CounterState(t=t), self._timestep(t, StepType.FIRST, 1.0)

    def step(self, state, action):
        t = state.t + 1
        done = t == self.end
        return _CounterState(t=t), self._timestep(
            t, jnp.where(done, StepType.LAST, StepType.MID), jnp.where(done, 0.0, 1.0)
        )

    def observation_spec(self):
        return {
            "a": ArraySpec((2,), np.float32, 0.0, 100.0),
            "b": ArraySpec((1, 1), np.bool_, False, True),
        }

    def action_spec(self):
        return DiscreteSpec(2)

    def reward_spec(self):
        return ArraySpec((2,) if self.agents else (), np.float32)


def _steps(env, n, key=0):
    state, timestep = env.reset(jax.random.PRNGKey(key))
    out = [timestep]
    step = jax.jit(env.step)
    for _ in range(n):
        state, timestep = step(state, jnp.asarray(0))
        out.append(timestep)
    return out


def test_flatten_observation_concatenates_leaves_in_key_order():
    env = envs_jax.FlattenObservation(_Counter())
    timesteps = _steps(env, 2)
    # t = 2: a = [2, 4], b = [[True]] -> [2, 4, 1].
    np.testing.assert_array_equal(timesteps[2].observation, [2.0, 4.0, 1.0])
    np.testing.assert_array_equal(timesteps[0].observation, [0.0, 0.0, 0.0])
    spec = env.observation_spec()
    assert spec.shape == (3,) and spec.dtype == np.float32
    np.testing.assert_array_equal(spec.minimum, [0, 0, 0])
    np.testing.assert_array_equal(spec.maximum, [100, 100, 1])


def test_normalize_observation_uses_running_mean_and_variance():
    env = envs_jax.NormalizeObservation(
        envs_jax.wrap_for_training(envs_jax.FlattenObservation(_Counter(end=3)))
    )
    timesteps = _steps(env, 9)
    # The raw observations: t runs 0 1 2 3 | 0 1 2 3 | 0 1 (reset step -> t = 0).
    raw_t = np.array([0, 1, 2, 3, 0, 1, 2, 3, 0, 1], np.float64)
    raw = np.stack([raw_t, 2 * raw_t, (raw_t > 1).astype(np.float64)], axis=1)
    for i, ts in enumerate(timesteps):
        seen = raw[: i + 1]
        expected = (raw[i] - seen.mean(0)) / np.sqrt(seen.var(0) + 1e-8)
        np.testing.assert_allclose(
            ts.observation, np.clip(expected, -10, 10), rtol=1e-4, atol=1e-4, err_msg=f"step {i}"
        )


def test_episode_statistics_keep_one_return_per_agent():
    env = envs_jax.wrap_for_training(_Counter(end=3, agents=2))
    timesteps = _steps(env, 4)
    last = timesteps[3]
    assert int(last.step_type) == StepType.LAST
    np.testing.assert_array_equal(last.extras["episode_return"], [6.0, -6.0])  # 1 + 2 + 3
    assert int(last.extras["episode_length"]) == 3
    np.testing.assert_array_equal(timesteps[4].extras["episode_return"], [0.0, 0.0])


def test_a_terminal_on_the_time_limit_step_stays_a_terminal():
    timesteps = _steps(envs_jax.wrap_for_training(_Counter(end=3), max_episode_steps=3), 3)
    assert int(timesteps[3].step_type) == StepType.LAST
    assert float(timesteps[3].discount) == 0.0
    timesteps = _steps(envs_jax.wrap_for_training(_Counter(end=3), max_episode_steps=2), 3)
    assert int(timesteps[2].step_type) == StepType.LAST
    assert float(timesteps[2].discount) == 1.0
    assert int(timesteps[3].step_type) == StepType.FIRST


def test_frame_stack_holds_the_newest_observations_newest_last_and_refills_at_a_reset():
    # _Counter flattened observes [t, 2t, t > 1]; episodes of 3 steps, so under the automatic
    # reset t runs 0 1 2 3 | 0 1 2 3 | 0 ...
    env = envs_jax.wrap_for_training(envs_jax.FlattenObservation(_Counter(end=3)),
                                     frame_stack=3)
    spec = env.observation_spec()
    assert spec.shape == (9,) and spec.dtype == np.float32
    np.testing.assert_array_equal(spec.maximum, [100, 100, 1] * 3)
    timesteps = _steps(env, 6)
    raw = [[t, 2 * t, float(t > 1)] for t in (0, 1, 2, 3, 0, 1, 2)]
    # By hand: a stack starts as its first observation three times, then shifts one frame
    # per step; the reset (step 4) starts it afresh from that episode's first observation.
    expected = [raw[0] * 3, raw[0] * 2 + raw[1], raw[0] + raw[1] + raw[2],
                raw[1] + raw[2] + raw[3], raw[4] * 3, raw[4] * 2 + raw[5],
                raw[4] + raw[5] + raw[6]]
    for i, (timestep, want) in enumerate(zip(timesteps, expected)):
        np.testing.assert_array_equal(timestep.observation, want, err_msg=f"step {i}")
    assert int(timesteps[3].step_type) == StepType.LAST
    assert int(timesteps[4].step_type) == StepType.FIRST
    # One frame is no stack: the observation is unchanged.
    single = _steps(envs_jax.wrap_for_training(envs_jax.FlattenObservation(_Counter(end=3)),
                                               frame_stack=1), 2)
    np.testing.assert_array_equal(single[2].observation, raw[2])


def test_frame_stack_stacks_a_board_along_its_last_axis_and_refuses_a_structured_observation():
    env = envs_jax.FrameStack(envs_jax.make("catch"), 2)
    inner = envs_jax.make("catch").observation_spec()
    assert env.observation_spec().shape == inner.shape[:-1] + (2 * inner.shape[-1],)
    state, first = env.reset(jax.random.PRNGKey(0))
    state, second = env.step(state, jnp.asarray(1))
    c = inner.shape[-1]
    # Catch's ball falls one row per step: the newest frame (last channels) differs from the
    # oldest, which is the first observation.
    np.testing.assert_array_equal(second.observation[..., :c], first.observation[..., c:])
    assert not np.array_equal(second.observation[..., c:], first.observation[..., c:])
    with pytest.raises(TypeError, match="FlattenObservation"):
        envs_jax.FrameStack(_Counter(), 2)


def test_make_time_limits():
    assert registry.default_max_episode_steps("CartPole-v1") == 500
    assert registry.default_max_episode_steps("catch") is None
    assert not isinstance(envs_jax.make("catch"), envs_jax.TimeLimit)
    assert envs_jax.make("catch", max_episode_steps=5).max_episode_steps == 5
    with pytest.raises(ValueError, match="max_episode_steps"):
        envs_jax.make("catch", max_episode_steps=-1)


def test_a_missing_extra_is_named(monkeypatch):
    monkeypatch.setitem(
        registry._NAMESPACES,
        "nolib",
        registry._Namespace(
            library="surely_not_an_installed_module",
            adapter="envs_jax.adapters.gymnax",
            extra="nolib",
        ),
    )
    assert not registry.installed("nolib")
    assert not any(name.startswith("nolib:") for name in envs_jax.registered())
    with pytest.raises(ModuleNotFoundError, match=r"\.\[nolib\]"):
        envs_jax.make("nolib:Anything")
