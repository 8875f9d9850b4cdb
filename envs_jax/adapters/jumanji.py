"""The jumanji adapter: every jumanji environment as `"jumanji:<id>"` (`"jumanji:Snake-v1"`).

jumanji already follows dm_env: its LAST timestep keeps the final observation, with discount 0
on termination and 1 on truncation (its `time_limit`), so the adapter only renames. Its
observations are structured (a NamedTuple per environment): the adapter moves the legal-action
mask, where there is one, to `timestep.extras["action_mask"]`, and gives the rest as a dict of
arrays (or the array itself where only one is left). Wrap in `envs_jax.FlattenObservation` for
agents that want one vector. The specs give shape and dtype; the action spec comes from
jumanji's (`DiscreteSpec`; `ArraySpec` of int32 with `minimum`/`maximum` for one choice per
entry; `ArraySpec` with bounds for continuous actions). jumanji's own `extras` (metrics, where
an environment reports any) are kept in `extras`.

Multi-agent environments (e.g. `LevelBasedForaging-v0`, `RobotWarehouse-v0`) keep jumanji's
per-agent rewards: `reward_spec()` then has shape `[num_agents]`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.adapters._specs import concrete, specs_of
from envs_jax.base import Environment
from podracer.types import Array, ArraySpec, DiscreteSpec, PRNGKey, TimeStep

_MASK = "action_mask"


def names() -> list[str]:
    import jumanji

    return sorted(jumanji.registered_environments())


def make(name: str, **kwargs: Any) -> JumanjiEnv:
    return JumanjiEnv(name, **kwargs)


def _as_dict(observation: Any) -> Any:
    if hasattr(observation, "_asdict"):  # NamedTuple
        return dict(observation._asdict())
    if dataclasses.is_dataclass(observation):
        return {f.name: getattr(observation, f.name) for f in dataclasses.fields(observation)}
    return observation


class JumanjiEnv(Environment[Any]):
    """One jumanji environment; its state (which holds its key) is the state here."""

    def __init__(self, name: str, **kwargs: Any):
        import jumanji

        self.name = name
        self.jumanji_env = jumanji.make(name, **kwargs)

    def _convert(self, timestep: Any) -> TimeStep:
        observation = _as_dict(timestep.observation)
        extras = dict(timestep.extras or {})
        if isinstance(observation, dict):
            observation = dict(observation)
            if _MASK in observation:
                extras[_MASK] = observation.pop(_MASK).astype(bool)
            if len(observation) == 1:
                (observation,) = observation.values()
        return TimeStep(
            step_type=jnp.asarray(timestep.step_type, jnp.int32),
            reward=jnp.asarray(timestep.reward, jnp.float32),
            discount=jnp.asarray(timestep.discount, jnp.float32),
            observation=observation,
            extras=extras,
        )

    def reset(self, key: PRNGKey) -> tuple[Any, TimeStep]:
        state, timestep = self.jumanji_env.reset(key)
        return state, self._convert(timestep)

    def step(self, state: Any, action: Array) -> tuple[Any, TimeStep]:
        state, timestep = self.jumanji_env.step(state, action)
        return state, self._convert(timestep)

    @concrete
    def observation_spec(self) -> Any:
        return specs_of(lambda key: self.reset(key)[1].observation, jax.random.PRNGKey(0))

    @concrete
    def reward_spec(self) -> ArraySpec:
        spec = self.jumanji_env.reward_spec
        return ArraySpec(tuple(spec.shape), np.float32, name="reward")

    @concrete
    def action_spec(self) -> DiscreteSpec | ArraySpec:
        from jumanji import specs

        spec = self.jumanji_env.action_spec
        if isinstance(spec, specs.DiscreteArray):
            return DiscreteSpec(int(spec.num_values), np.int32, name="action")
        if isinstance(spec, specs.MultiDiscreteArray):
            maximum = np.asarray(spec.num_values, np.int32) - 1
            return ArraySpec(
                tuple(spec.shape), np.int32, np.zeros_like(maximum), maximum, name="action"
            )
        if isinstance(spec, specs.BoundedArray):
            return ArraySpec(
                tuple(spec.shape),
                np.dtype(spec.dtype),
                np.asarray(spec.minimum),
                np.asarray(spec.maximum),
                name="action",
            )
        return ArraySpec(tuple(spec.shape), np.dtype(spec.dtype), name="action")
