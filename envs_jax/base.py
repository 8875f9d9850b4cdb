"""The JAX environment API: pure `reset`/`step`, the RNG key inside the state.

See `podracer.types` for the transition layout every environment follows.

Specs: `observation_spec()` is an `ArraySpec` (or, for an adapter of a library with structured
observations, a pytree of them: `envs_jax.FlattenObservation` turns it into one vector);
`action_spec()` is a `DiscreteSpec` or an `ArraySpec` (continuous, or one discrete choice per
entry with `minimum`/`maximum`); `reward_spec()` is a scalar float32 unless the environment
has several agents. Where a game has a legal-action mask it is `timestep.extras["action_mask"]`
(bool `[num_actions]`, present on every timestep, FIRST included).

Specs are static: the same, with concrete (numpy) bounds, whether or not they are asked for
under a JAX trace, because runners ask inside traced code (Anakin's per-device `init` calls
`env.spec()` under `jit`). Native environments build them from numpy and Python values; the
adapters evaluate their library's `jnp` bounds eagerly (`envs_jax.adapters._specs.concrete`).
"""

from __future__ import annotations

import abc
from typing import Any, Generic, TypeVar

import numpy as np

from podracer.types import Array, ArraySpec, DiscreteSpec, EnvSpec, PRNGKey, TimeStep

State = TypeVar("State")


class Environment(abc.ABC, Generic[State]):
    """An unbatched, pure-function environment; batch it with `jax.vmap`.

    Static parameters live on the instance (so they are constants under `jit`); everything
    that changes, the RNG key included, lives in the state pytree.
    """

    @abc.abstractmethod
    def reset(self, key: PRNGKey) -> tuple[State, TimeStep]:
        """Starts an episode: returns the state and a FIRST timestep."""

    @abc.abstractmethod
    def step(self, state: State, action: Array) -> tuple[State, TimeStep]:
        """Advances one step: returns the new state and a MID or LAST timestep."""

    @abc.abstractmethod
    def observation_spec(self) -> ArraySpec: ...

    @abc.abstractmethod
    def action_spec(self) -> DiscreteSpec | ArraySpec: ...

    def reward_spec(self) -> ArraySpec:
        """A scalar float32 unless overridden (multi-agent adapters give one per agent)."""
        return ArraySpec((), np.float32, name="reward")

    def spec(self) -> EnvSpec:
        return EnvSpec(observation=self.observation_spec(), action=self.action_spec())

    @property
    def unwrapped(self) -> Environment[Any]:
        return self


class Wrapper(Environment[State]):
    """Delegates everything to `env`; subclasses override what they change."""

    def __init__(self, env: Environment[Any]):
        self.env = env

    def reset(self, key: PRNGKey) -> tuple[State, TimeStep]:
        return self.env.reset(key)

    def step(self, state: State, action: Array) -> tuple[State, TimeStep]:
        return self.env.step(state, action)

    def observation_spec(self) -> ArraySpec:
        return self.env.observation_spec()

    def action_spec(self) -> DiscreteSpec | ArraySpec:
        return self.env.action_spec()

    def reward_spec(self) -> ArraySpec:
        return self.env.reward_spec()

    @property
    def unwrapped(self) -> Environment[Any]:
        return self.env.unwrapped
