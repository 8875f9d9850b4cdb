"""Shared types: array aliases, `StepType`, `TimeStep`, `Trajectory` and environment specs.

The transition layout (used by every environment, runner and agent)
--------------------------------------------------------------------
Environments follow the dm_env convention. `reset` returns a FIRST timestep; each `step`
returns the timestep that the action led to, with `reward` and `discount` received on
arriving there. An episode's end is a LAST timestep that still carries the episode's *final
observation*; its `discount` is 0 for a true terminal and 1 for a time-limit truncation, so
truncated episodes bootstrap from the final observation like any other. The step after a LAST
timestep starts a new episode: its action is ignored and it returns a FIRST timestep. This is
also what envpool does, so both runners produce the same layout.

A `Trajectory` of length T holds T+1 timesteps `o_0 .. o_T` (the last one is the first of the
next trajectory) and the T actions `a_0 .. a_{T-1}` with the actor's extras at each. The
transition `o_t -> o_{t+1}` is real unless `o_t` is LAST (then `o_{t+1}` is a reset and the
transition must be masked): see `Trajectory.transition_mask`.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
ArrayLike = chex.ArrayTree
PRNGKey = jax.Array
Params = Any
OptState = Any
Metrics = dict[str, jax.Array]
Extras = dict[str, Any]

# Device axis name used by every replicated program.
DEVICE_AXIS = "devices"


class StepType(enum.IntEnum):
    FIRST = 0
    MID = 1
    LAST = 2


@chex.dataclass(frozen=True)
class TimeStep:
    """What an environment returns from `reset` and `step` (batched or not)."""

    step_type: Array  # [...] int32, a `StepType`
    reward: Array  # [...] float32, received on arriving here; 0 on FIRST
    discount: Array  # [...] float32, 0 only at a true terminal; 1 on truncation and FIRST
    observation: Any  # [..., *obs_shape]
    extras: dict = dataclasses.field(default_factory=dict)  # e.g. episode statistics

    def first(self) -> Array:
        return self.step_type == StepType.FIRST

    def mid(self) -> Array:
        return self.step_type == StepType.MID

    def last(self) -> Array:
        return self.step_type == StepType.LAST


@chex.dataclass(frozen=True)
class Trajectory:
    """A time-major batch of experience. See the module docstring for the layout."""

    timestep: TimeStep  # [T+1, B, ...]  o_0 .. o_T
    action: Array  # [T, B]
    extras: dict  # [T, B, ...] what `actor_step` returned alongside each action

    def transition_mask(self) -> Array:
        """[T, B] float32: 1 where o_t -> o_{t+1} is a real transition (o_t is not LAST)."""
        return 1.0 - self.timestep.last()[:-1].astype(jnp.float32)


# ---------------------------------------------------------------------------------------------
# Specs.


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of an array, with optional bounds."""

    shape: tuple[int, ...]
    dtype: Any
    minimum: Any = None
    maximum: Any = None
    name: str = ""

    def zeros(self) -> np.ndarray:
        return np.zeros(self.shape, self.dtype)


@dataclasses.dataclass(frozen=True)
class DiscreteSpec:
    """A scalar integer action in [0, num_values)."""

    num_values: int
    dtype: Any = np.int32
    name: str = ""

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    def zeros(self) -> np.ndarray:
        return np.zeros((), self.dtype)


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know about an environment to build its networks."""

    observation: ArraySpec
    action: DiscreteSpec | ArraySpec
