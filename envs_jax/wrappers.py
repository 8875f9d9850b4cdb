"""Wrappers: automatic reset, time limit and episode statistics, all pure and jittable.

`wrap_for_training(env)` stacks them the way the runners expect.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp

from envs_jax.base import Environment, Wrapper
from podracer.types import Array, PRNGKey, StepType, TimeStep


def _select(pred: Array, on_true: Any, on_false: Any) -> Any:
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), on_true, on_false)


@chex.dataclass(frozen=True)
class AutoResetState:
    env_state: Any
    needs_reset: Array  # [] bool: the last timestep returned was LAST
    key: PRNGKey


class AutoReset(Wrapper[AutoResetState]):
    """Starts a new episode on the step after a LAST timestep (whose action is ignored).

    Exact, by select: both the step and a reset are computed and one is kept, so it vmaps
    without control flow. The LAST timestep keeps the episode's final observation.
    """

    def reset(self, key: PRNGKey) -> tuple[AutoResetState, TimeStep]:
        key, reset_key = jax.random.split(key)
        env_state, timestep = self.env.reset(reset_key)
        return AutoResetState(env_state=env_state, needs_reset=timestep.last(), key=key), timestep

    def step(self, state: AutoResetState, action: Array) -> tuple[AutoResetState, TimeStep]:
        key, reset_key = jax.random.split(state.key)
        stepped = self.env.step(state.env_state, action)
        reset = self.env.reset(reset_key)
        env_state, timestep = _select(state.needs_reset, reset, stepped)
        return AutoResetState(env_state=env_state, needs_reset=timestep.last(), key=key), timestep


@chex.dataclass(frozen=True)
class TimeLimitState:
    env_state: Any
    elapsed: Array  # [] int32 steps taken in this episode


class TimeLimit(Wrapper[TimeLimitState]):
    """Truncates episodes after `max_episode_steps` steps: LAST with the discount unchanged.

    A true terminal on the same step stays a terminal (discount 0).
    """

    def __init__(self, env: Environment[Any], max_episode_steps: int):
        super().__init__(env)
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}.")
        self.max_episode_steps = max_episode_steps

    def reset(self, key: PRNGKey) -> tuple[TimeLimitState, TimeStep]:
        env_state, timestep = self.env.reset(key)
        return TimeLimitState(env_state=env_state, elapsed=jnp.zeros((), jnp.int32)), timestep

    def step(self, state: TimeLimitState, action: Array) -> tuple[TimeLimitState, TimeStep]:
        env_state, timestep = self.env.step(state.env_state, action)
        elapsed = state.elapsed + 1
        truncated = elapsed >= self.max_episode_steps
        step_type = jnp.where(truncated, StepType.LAST, timestep.step_type).astype(jnp.int32)
        timestep = timestep.replace(step_type=step_type)
        return TimeLimitState(env_state=env_state, elapsed=elapsed), timestep


@chex.dataclass(frozen=True)
class EpisodeStatisticsState:
    env_state: Any
    episode_return: Array  # [] float32, so far in this episode
    episode_length: Array  # [] int32, so far in this episode


class EpisodeStatistics(Wrapper[EpisodeStatisticsState]):
    """Adds `episode_return` and `episode_length` (so far, this step included) to extras.

    On a LAST timestep they are the completed episode's figures; read them with
    `timestep.last()` as the mask.
    """

    def reset(self, key: PRNGKey) -> tuple[EpisodeStatisticsState, TimeStep]:
        env_state, timestep = self.env.reset(key)
        state = EpisodeStatisticsState(
            env_state=env_state,
            episode_return=jnp.zeros((), jnp.float32),
            episode_length=jnp.zeros((), jnp.int32),
        )
        return state, self._annotate(timestep, state)

    def step(
        self, state: EpisodeStatisticsState, action: Array
    ) -> tuple[EpisodeStatisticsState, TimeStep]:
        env_state, timestep = self.env.step(state.env_state, action)
        state = EpisodeStatisticsState(
            env_state=env_state,
            episode_return=state.episode_return + timestep.reward.astype(jnp.float32),
            episode_length=state.episode_length + 1,
        )
        return state, self._annotate(timestep, state)

    @staticmethod
    def _annotate(timestep: TimeStep, state: EpisodeStatisticsState) -> TimeStep:
        extras = dict(timestep.extras)
        extras["episode_return"] = state.episode_return
        extras["episode_length"] = state.episode_length
        return timestep.replace(extras=extras)


def wrap_for_training(env: Environment[Any], max_episode_steps: int | None = None) -> Environment:
    """Time limit (optional) -> episode statistics -> automatic reset."""
    if max_episode_steps is not None:
        env = TimeLimit(env, max_episode_steps)
    return AutoReset(EpisodeStatistics(env))
