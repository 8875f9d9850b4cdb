"""Agents: one sub-package each, pure functions behind `podracer.agent.Agent`.

`make(config, env_spec)` builds the agent named by `config.name`; runners use only this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_collections
import numpy as np

from podracer.agent import Agent
from podracer.config import ConfigError
from podracer.types import DiscreteSpec, EnvSpec


def _vtrace(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    from agents import vtrace

    return vtrace.make_agent(config, env_spec)


def _ppo(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    from agents import ppo

    return ppo.make_agent(config, env_spec)


def _muzero(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    from agents import muzero

    return muzero.make_agent(config, env_spec)


def _efficientzero(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    from agents import efficientzero

    return efficientzero.make_agent(config, env_spec)


_FACTORIES: dict[str, Callable[[ml_collections.ConfigDict, EnvSpec], Agent]] = {
    "vtrace": _vtrace,
    "muzero": _muzero,
    "efficientzero": _efficientzero,
    "ppo": _ppo,
}

# Agents whose policies also take continuous actions (an `ArraySpec` of shape [D]).
_CONTINUOUS = frozenset({"ppo"})


def registered() -> list[str]:
    """Agent names accepted by `make`, sorted."""
    return sorted(_FACTORIES)


def accepts_continuous_actions(name: str) -> bool:
    """Whether agent `name` can act in an environment with continuous actions of shape [D]."""
    return name in _CONTINUOUS


def continuous_agents() -> list[str]:
    return sorted(_CONTINUOUS)


def check_action_spec(action_spec: Any, agent_name: str, *, field: str, env_name: str) -> None:
    """Raises `ConfigError` on `field` (the environment's config field) unless agent
    `agent_name` can act in `env_name`'s action space: one discrete action per step, or, for
    agents that take them, continuous actions of shape [D]. Both runners validate with it."""
    integer = np.issubdtype(np.dtype(action_spec.dtype), np.integer)
    continuous = not isinstance(action_spec, DiscreteSpec) and not integer
    shape = tuple(action_spec.shape)
    if continuous and not accepts_continuous_actions(agent_name):
        raise ConfigError(
            field, f"{env_name!r} has continuous actions",
            "choose an environment with discrete actions for this agent, or an agent that "
            f"takes continuous ones ({', '.join(continuous_agents())})")
    if continuous and len(shape) != 1:
        raise ConfigError(field, f"{env_name!r} takes continuous actions of shape {shape}",
                          "choose an environment whose actions are a vector [D]")
    if not continuous and (not isinstance(action_spec, DiscreteSpec) or shape != ()):
        raise ConfigError(
            field, f"{env_name!r} takes one discrete action per entry (shape {shape})",
            "choose an environment with a single discrete action per step for this agent")


def make(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the agent `config.name` for an environment with `env_spec`."""
    if config.name not in _FACTORIES:
        raise KeyError(f"Unknown agent {config.name!r}. Registered agents: {registered()}.")
    return _FACTORIES[config.name](config, env_spec)


__all__ = ["accepts_continuous_actions", "check_action_spec", "continuous_agents", "make",
           "registered"]
