"""Agents: one sub-package each, pure functions behind `podracer.agent.Agent`.

`make(config, env_spec)` builds the agent named by `config.name`; runners use only this.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_collections

from podracer.agent import Agent
from podracer.types import EnvSpec


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


def make(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the agent `config.name` for an environment with `env_spec`."""
    if config.name not in _FACTORIES:
        raise KeyError(f"Unknown agent {config.name!r}. Registered agents: {registered()}.")
    return _FACTORIES[config.name](config, env_spec)


__all__ = ["accepts_continuous_actions", "continuous_agents", "make", "registered"]
