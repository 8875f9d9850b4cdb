"""Wrappers: automatic reset, time limit, episode statistics, frame stacking, observation
flattening and normalisation; all pure and jittable.

`wrap_for_training(env)` stacks them the way the runners expect:
`AutoReset(EpisodeStatistics(TimeLimit(FrameStack(env))))`, the time limit and the frame
stack optional.

The transition layout they produce (the dm_env convention of `podracer.types`):

    reset            -> FIRST  (reward 0, discount 1)
    step(a_0)        -> MID    reward r_1, discount 1
    ...
    step(a_{n-1})    -> LAST   reward r_n, discount 0 (true terminal) or 1 (truncated by
                                the time limit); the observation is the episode's final one
    step(ignored)    -> FIRST  of the next episode (reward 0, discount 1): the automatic reset

The pre-reset final observation is therefore never lost: it is the LAST timestep's own
observation, and the reset happens one step later. A learner bootstraps a truncated episode
from it (discount 1) and masks the LAST -> FIRST pseudo-transition
(`Trajectory.transition_mask`). Nothing is duplicated into `extras` for it: in this layout a
`final_observation` entry would be a copy of `observation` on every LAST step.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.base import Environment, Wrapper
from podracer.types import Array, ArraySpec, PRNGKey, StepType, TimeStep


def _select(pred: Array, on_true: Any, on_false: Any) -> Any:
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), on_true, on_false)


@chex.dataclass(frozen=True)
class AutoResetState:
    env_state: Any
    needs_reset: Array  # [] bool: the last timestep returned was LAST
    key: PRNGKey  # fixed for the wrapper's lifetime; reset keys fold a counter into it
    count: Array  # [] uint32 steps taken, so every step has its own reset key


class AutoReset(Wrapper[AutoResetState]):
    """Starts a new episode on the step after a LAST timestep (whose action is ignored).

    Exact, by select: both the step and a reset are computed and one is kept, so it vmaps
    without control flow. The LAST timestep keeps the episode's final observation.

    Keys: the reset computed at step t (kept or not) uses `fold_in(key, t)`, with `key` the one
    given to `reset` (whose own reset uses `t = 0`): one hash per step where a `split` chain costs
    two, and with a reset computed on every step that hash is a visible share of a cheap game's
    step.
    """

    def reset(self, key: PRNGKey) -> tuple[AutoResetState, TimeStep]:
        count = jnp.zeros((), jnp.uint32)
        env_state, timestep = self.env.reset(jax.random.fold_in(key, count))
        state = AutoResetState(env_state=env_state, needs_reset=timestep.last(), key=key,
                               count=count)
        return state, timestep

    def step(self, state: AutoResetState, action: Array) -> tuple[AutoResetState, TimeStep]:
        count = state.count + 1
        stepped = self.env.step(state.env_state, action)
        reset = self.env.reset(jax.random.fold_in(state.key, count))
        env_state, timestep = _select(state.needs_reset, reset, stepped)
        state = AutoResetState(env_state=env_state, needs_reset=timestep.last(), key=state.key,
                               count=count)
        return state, timestep


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
    episode_return: Array  # [] float32 (or [num_agents]), so far in this episode
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
            # One return per agent where the environment has several.
            episode_return=jnp.zeros(self.env.reward_spec().shape, jnp.float32),
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


class FlattenObservation(Wrapper[Any]):
    """Turns any observation (an array or a pytree of arrays) into one float32 vector.

    Leaves are raveled and concatenated in `jax.tree.leaves` order (dicts by sorted key);
    booleans and integers become 0/1 and their value as float32.
    """

    def reset(self, key: PRNGKey) -> tuple[Any, TimeStep]:
        state, timestep = self.env.reset(key)
        return state, self._flatten(timestep)

    def step(self, state: Any, action: Array) -> tuple[Any, TimeStep]:
        state, timestep = self.env.step(state, action)
        return state, self._flatten(timestep)

    @staticmethod
    def _flatten(timestep: TimeStep) -> TimeStep:
        leaves = jax.tree.leaves(timestep.observation)
        flat = jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in leaves])
        return timestep.replace(observation=flat)

    def observation_spec(self) -> ArraySpec:
        specs = jax.tree.leaves(self.env.observation_spec())
        size = sum(int(np.prod(spec.shape)) for spec in specs)
        bounded = all(s.minimum is not None and s.maximum is not None for s in specs)

        def bound(attr: str) -> np.ndarray | None:
            if not bounded:
                return None
            parts = [
                np.broadcast_to(np.asarray(getattr(s, attr), np.float32), s.shape).ravel()
                for s in specs
            ]
            return np.concatenate(parts)

        return ArraySpec((size,), np.float32, bound("minimum"), bound("maximum"), name="flat")


@chex.dataclass(frozen=True)
class FrameStackState:
    env_state: Any
    frames: Array  # [..., C * num_frames] the observation returned last


class FrameStack(Wrapper[FrameStackState]):
    """Concatenates the `num_frames` newest observations along their last axis, newest last
    (the order of envpool's Atari stack and of MuZero's `frame_stack`): `[..., C]` becomes
    `[..., C * num_frames]`, and channels `[-C:]` are the current observation. The last axis
    is the channels of a board (MinAtar's [10, 10, C]) and the features of a vector; an
    observation without a channel axis (Catch's [10, 5]) is stacked along its columns.

    A reset fills the stack with the episode's first observation repeated, as gymnasium's and
    envpool's stackers do; put it inside `AutoReset` (`wrap_for_training(env, frame_stack=N)`)
    so every episode starts afresh. For a game whose state the observation leaves partly out
    (MinAtar Freeway's chicken moves on a hidden timer; Atari's velocities) the stack shows
    what happened over the last steps. An agent with a replay (MuZero, EfficientZero) stores
    every stacked observation, `num_frames` times the memory of one.
    """

    def __init__(self, env: Environment[Any], num_frames: int):
        super().__init__(env)
        if not isinstance(env.observation_spec(), ArraySpec):
            raise TypeError("FrameStack stacks one array observation; flatten a structured "
                             "one first (FlattenObservation).")
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {num_frames}.")
        self.num_frames = num_frames

    def reset(self, key: PRNGKey) -> tuple[FrameStackState, TimeStep]:
        env_state, timestep = self.env.reset(key)
        frames = jnp.concatenate([timestep.observation] * self.num_frames, axis=-1)
        return FrameStackState(env_state=env_state, frames=frames), timestep.replace(
            observation=frames)

    def step(self, state: FrameStackState, action: Array) -> tuple[FrameStackState, TimeStep]:
        env_state, timestep = self.env.step(state.env_state, action)
        channels = timestep.observation.shape[-1]
        frames = jnp.concatenate([state.frames[..., channels:], timestep.observation], axis=-1)
        return FrameStackState(env_state=env_state, frames=frames), timestep.replace(
            observation=frames)

    def observation_spec(self) -> ArraySpec:
        spec = self.env.observation_spec()

        def tile(bound: Any) -> Any:
            if bound is None or np.ndim(bound) == 0:
                return bound
            return np.concatenate([np.broadcast_to(bound, spec.shape)] * self.num_frames, -1)

        shape = tuple(spec.shape[:-1]) + (spec.shape[-1] * self.num_frames,)
        return ArraySpec(shape, spec.dtype, tile(spec.minimum), tile(spec.maximum),
                         name=spec.name)


@chex.dataclass(frozen=True)
class NormalizeObservationState:
    env_state: Any
    count: Array  # [] float32 observations seen
    mean: Array  # [*obs_shape] float32 running mean
    m2: Array  # [*obs_shape] float32 running sum of squared deviations (Welford)


class NormalizeObservation(Wrapper[NormalizeObservationState]):
    """Standardises observations by their running mean and variance, clipped to +-`clip`.

    Every observation (FIRST included) updates the statistics before it is normalised. Put it
    *outside* `AutoReset` (`NormalizeObservation(wrap_for_training(env))`) so the statistics
    outlive episodes: a reset of this wrapper starts them afresh. Under `vmap` each copy keeps
    its own statistics, so a run stays a pure function of its key.
    """

    def __init__(self, env: Environment[Any], *, clip: float = 10.0, epsilon: float = 1e-8):
        super().__init__(env)
        self.clip = clip
        self.epsilon = epsilon

    def reset(self, key: PRNGKey) -> tuple[NormalizeObservationState, TimeStep]:
        env_state, timestep = self.env.reset(key)
        shape = self.env.observation_spec().shape
        state = NormalizeObservationState(
            env_state=env_state,
            count=jnp.zeros((), jnp.float32),
            mean=jnp.zeros(shape, jnp.float32),
            m2=jnp.zeros(shape, jnp.float32),
        )
        return self._update(state, timestep)

    def step(
        self, state: NormalizeObservationState, action: Array
    ) -> tuple[NormalizeObservationState, TimeStep]:
        env_state, timestep = self.env.step(state.env_state, action)
        return self._update(state.replace(env_state=env_state), timestep)

    def _update(
        self, state: NormalizeObservationState, timestep: TimeStep
    ) -> tuple[NormalizeObservationState, TimeStep]:
        x = timestep.observation.astype(jnp.float32)
        count = state.count + 1.0
        delta = x - state.mean
        mean = state.mean + delta / count
        m2 = state.m2 + delta * (x - mean)
        normalized = (x - mean) / jnp.sqrt(m2 / count + self.epsilon)
        state = state.replace(count=count, mean=mean, m2=m2)
        return state, timestep.replace(observation=jnp.clip(normalized, -self.clip, self.clip))

    def observation_spec(self) -> ArraySpec:
        spec = self.env.observation_spec()
        return ArraySpec(spec.shape, np.float32, -self.clip, self.clip, name=spec.name)


def wrap_for_training(env: Environment[Any], max_episode_steps: int | None = None, *,
                      frame_stack: int = 1) -> Environment:
    """Flattened observation (for structured ones) -> frame stack (`frame_stack` > 1: the
    newest `frame_stack` observations, `FrameStack`) -> time limit (optional) -> episode
    statistics -> automatic reset.

    A structured observation (a dict or other pytree of arrays, e.g. jumanji's) becomes one
    float32 vector (`FlattenObservation`), which every agent's networks read. `envs_jax.make`
    already applies an environment's standard time limit; `max_episode_steps` here adds
    another (the shorter one wins), for environments that have none.
    """
    if not isinstance(env.observation_spec(), ArraySpec):
        env = FlattenObservation(env)
    if frame_stack > 1:
        env = FrameStack(env, frame_stack)
    if max_episode_steps is not None:
        env = TimeLimit(env, max_episode_steps)
    return AutoReset(EpisodeStatistics(env))
