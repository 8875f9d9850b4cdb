"""The gymnax adapter: every gymnax environment as `"gymnax:<id>"` (classic control, bsuite,
MinAtar, misc).

gymnax's own `step` resets automatically and returns the reset observation; this adapter calls
the environment's `step_env` and `reset_env` instead, so the LAST timestep keeps the final
observation and `envs_jax.AutoReset` resets one step later, as for every environment here.
gymnax reports its time limit (`params.max_steps_in_episode`) as truncation, separately from
termination: truncation becomes LAST with discount 1, termination LAST with discount 0.

`make(name, params=None, **kwargs)`: `kwargs` go to the gymnax constructor; `params` (a dict)
replaces fields of the environment's default `EnvParams`, e.g.
`envs_jax.make("gymnax:CartPole-v1", params={"max_steps_in_episode": 200})`.

`gymnax:MNISTBandit-bsuite` downloads MNIST when built, so it works only with network access.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.adapters._specs import concrete, specs_of, with_bounds
from envs_jax.base import Environment
from podracer.types import Array, ArraySpec, DiscreteSpec, PRNGKey, StepType, TimeStep


def names() -> list[str]:
    import gymnax

    return list(gymnax.registered_envs)


def make(name: str, *, params: dict[str, Any] | None = None, **kwargs: Any) -> GymnaxEnv:
    return GymnaxEnv(name, params=params, **kwargs)


@chex.dataclass(frozen=True)
class GymnaxState:
    env_state: Any  # gymnax's EnvState
    key: PRNGKey  # this episode's key; the reset and every step fold a counter into it
    steps: Array  # [] int32 steps taken in this episode


class GymnaxEnv(Environment[GymnaxState]):
    """One gymnax environment, with its (static) `EnvParams`."""

    def __init__(self, name: str, *, params: dict[str, Any] | None = None, **kwargs: Any):
        import gymnax

        self.name = name
        self.gymnax_env, default_params = gymnax.make(name, **kwargs)
        self.params = default_params.replace(**(params or {}))

    def reset(self, key: PRNGKey) -> tuple[GymnaxState, TimeStep]:
        # One hash per reset and per step (fold_in of a counter) rather than a split (two):
        # under automatic reset both run every step, and on cheap games hashing dominates.
        reset_key = jax.random.fold_in(key, 0)
        observation, env_state = self.gymnax_env.reset_env(reset_key, self.params)
        timestep = TimeStep(
            step_type=jnp.asarray(StepType.FIRST, jnp.int32),
            reward=jnp.zeros((), jnp.float32),
            discount=jnp.ones((), jnp.float32),
            observation=observation,
        )
        return GymnaxState(env_state=env_state, key=key, steps=jnp.zeros((), jnp.int32)), timestep

    def step(self, state: GymnaxState, action: Array) -> tuple[GymnaxState, TimeStep]:
        steps = state.steps + 1
        step_key = jax.random.fold_in(state.key, steps)
        observation, env_state, reward, terminated, _ = self.gymnax_env.step_env(
            step_key, state.env_state, action, self.params
        )
        truncated = self.gymnax_env.is_truncated(env_state, self.params)
        last = jnp.logical_or(terminated, truncated)
        timestep = TimeStep(
            step_type=jnp.where(last, StepType.LAST, StepType.MID).astype(jnp.int32),
            reward=jnp.asarray(reward, jnp.float32).reshape(()),
            discount=jnp.where(terminated, 0.0, 1.0).astype(jnp.float32),
            observation=observation,
        )
        return GymnaxState(env_state=env_state, key=state.key, steps=steps), timestep

    @concrete
    def observation_spec(self) -> ArraySpec:
        spec = specs_of(
            lambda key: self.gymnax_env.reset_env(key, self.params)[0], jax.random.PRNGKey(0)
        )
        space = self.gymnax_env.observation_space(self.params)
        return with_bounds(
            spec, getattr(space, "low", None), getattr(space, "high", None), name="observation"
        )

    @concrete
    def action_spec(self) -> DiscreteSpec | ArraySpec:
        space = self.gymnax_env.action_space(self.params)
        if hasattr(space, "n"):
            return DiscreteSpec(int(space.n), np.int32, name="action")
        shape = tuple(space.shape)
        return with_bounds(
            ArraySpec(shape, np.dtype(space.dtype)), space.low, space.high, name="action"
        )
