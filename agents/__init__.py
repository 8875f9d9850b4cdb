"""Agents: one sub-package each, pure functions behind `podracer.agent.Agent`.

`make(config, env_spec)` builds the agent named by `config.name`; runners use only this, and
`choices` and `introduced` for what a run records and checks on resume. Every agent is
registered with `register` — the built-in ones below, a researcher's own from their script or
notebook — and is then selected like any other, `config.agent = <default_config>()`.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import ml_collections
import numpy as np

from podracer.agent import Agent
from podracer import config as cfg
from podracer.config import ConfigError
from podracer.types import DiscreteSpec, EnvSpec

MakeAgent = Callable[[ml_collections.ConfigDict, EnvSpec], Agent]
Choices = Callable[[ml_collections.ConfigDict, EnvSpec], Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class _Registration:
    make_agent: MakeAgent
    default_config: Callable[[], ml_collections.ConfigDict]
    continuous_actions: bool
    choices: Choices | None
    introduced: Callable[[], Mapping[str, Any]]  # read when first needed (built-ins: lazily)
    serial: int  # distinct for every registration, so a replaced one is told apart


_REGISTRY: dict[str, _Registration] = {}
_SERIALS = itertools.count(1)


def register(name: str, make_agent: MakeAgent, *,
             default_config: Callable[[], ml_collections.ConfigDict],
             continuous_actions: bool = False, choices: Choices | None = None,
             introduced: Mapping[str, Any] | None = None, replace: bool = False) -> None:
    """Makes agent `name` available to both runners: `make_agent(config, env_spec)` builds it
    (a `podracer.Agent`), `default_config()` returns its `ConfigDict` with `name` set to
    `name`, and `continuous_actions` says whether it also acts in environments with continuous
    actions of shape [D]. A name registered already is refused unless `replace=True` (a
    notebook cell that defines and registers an agent can then be rerun after an edit).

    Two optional declarations keep a run's workdir resumable as the agent changes:
    `choices(config, env_spec) -> {field: value}` says what the agent chose for the config
    fields it was left to choose ("auto", or None for its default), which runs record in
    config.json in their place; `introduced` ({field: value}) names config fields added to
    the agent after runs were made without them, each with the value under which the agent
    behaves as it did before, so that such a run resumes at that value and is refused, naming
    the value to pass, at any other."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"An agent's name must be a non-empty string, got {name!r}.")
    if name in _REGISTRY and not replace:
        raise ValueError(f"Agent {name!r} is already registered. Pass replace=True to replace "
                         "it (e.g. after editing it in a notebook), or choose another name.")
    if not callable(make_agent) or not callable(default_config):
        raise TypeError("register takes make_agent(config, env_spec) -> Agent and "
                        "default_config() -> ConfigDict, both callables.")
    if choices is not None and not callable(choices):
        raise TypeError("register's choices is a function (config, env_spec) -> {field: "
                        f"value}} (or None), got {choices!r}.")
    if introduced is not None and not isinstance(introduced, Mapping):
        raise TypeError("register's introduced is a mapping {field: value} (or None), got "
                        f"{introduced!r}.")
    fields = MappingProxyType(dict(introduced or {}))
    _register(name, make_agent, default_config, continuous_actions, choices, lambda: fields)


def _register(name: str, make_agent: MakeAgent,
              default_config: Callable[[], ml_collections.ConfigDict], continuous_actions: bool,
              choices: Choices | None, introduced: Callable[[], Mapping[str, Any]]) -> None:
    _REGISTRY[name] = _Registration(make_agent, default_config, bool(continuous_actions),
                                    choices, introduced, next(_SERIALS))


def _builtin(name: str, module: str, *, continuous_actions: bool = False) -> None:
    # The module (its make_agent, default_config, choices and INTRODUCED) is imported when
    # first used, so that `import agents` stays cheap.
    def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
        return importlib.import_module(module).make_agent(config, env_spec)

    def default_config() -> ml_collections.ConfigDict:
        return importlib.import_module(module).default_config()

    def choices(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Mapping[str, Any]:
        return importlib.import_module(module).choices(config, env_spec)

    def introduced() -> Mapping[str, Any]:
        return importlib.import_module(module).INTRODUCED

    _register(name, make_agent, default_config, continuous_actions, choices, introduced)


_builtin("vtrace", "agents.vtrace")
_builtin("muzero", "agents.muzero")
_builtin("gumbel_muzero", "agents.gumbel_muzero")
_builtin("efficientzero", "agents.efficientzero")
_builtin("stochastic_muzero", "agents.stochastic_muzero")
_builtin("sampled_muzero", "agents.sampled_muzero", continuous_actions=True)
_builtin("ppo", "agents.ppo", continuous_actions=True)
_builtin("dqn", "agents.dqn")
_builtin("pqn", "agents.pqn")


def registration_id(name: str) -> int:
    """A number that differs for every registration of agent `name` (0 if unknown): what was
    compiled from one registration is not reused for the next."""
    registration = _REGISTRY.get(name)
    return 0 if registration is None else registration.serial


def default_config(name: str) -> ml_collections.ConfigDict:
    """The registered agent `name`'s default config."""
    if name not in _REGISTRY:
        raise KeyError(f"Unknown agent {name!r}. Registered agents: {registered()}.")
    return _REGISTRY[name].default_config()


def require_known_fields(config: ml_collections.ConfigDict) -> None:
    """Every field of an agent's `config` is one its registered default config has (a
    `ConfigError` naming a misspelt field and the closest it has, otherwise)."""
    name = config.name
    cfg.require_known_fields(config, default_config(name), whose=f"the {name!r} agent's config",
                             lists=f"agents.default_config({name!r})", group="agent")


def registered() -> list[str]:
    """Agent names accepted by `make`, sorted."""
    return sorted(_REGISTRY)


def accepts_continuous_actions(name: str) -> bool:
    """Whether agent `name` can act in an environment with continuous actions of shape [D]."""
    return name in _REGISTRY and _REGISTRY[name].continuous_actions


def continuous_agents() -> list[str]:
    return sorted(n for n, r in _REGISTRY.items() if r.continuous_actions)


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
    if config.name not in _REGISTRY:
        raise KeyError(f"Unknown agent {config.name!r}. Registered agents: {registered()}.")
    return _REGISTRY[config.name].make_agent(config, env_spec)


def choices(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> dict[str, Any]:
    """What agent `config.name` chose for `env_spec` for its config fields left to it ("auto",
    or None), {field: value}, as declared by its registration (`register(choices=...)`); {}
    when it declares none. Runs record these in config.json in place of "auto"."""
    if config.name not in _REGISTRY:
        raise KeyError(f"Unknown agent {config.name!r}. Registered agents: {registered()}.")
    declared = _REGISTRY[config.name].choices
    return {} if declared is None else dict(declared(config, env_spec))


def introduced(name: str) -> dict[str, Any]:
    """The config fields agent `name` gained after runs were made without them, each with the
    value under which it behaves as before, {field: value}, as declared by its registration
    (`register(introduced=...)`); {} when it declares none."""
    if name not in _REGISTRY:
        raise KeyError(f"Unknown agent {name!r}. Registered agents: {registered()}.")
    return dict(_REGISTRY[name].introduced())


__all__ = ["Choices", "MakeAgent", "accepts_continuous_actions", "check_action_spec", "choices",
           "continuous_agents", "default_config", "introduced", "make", "register", "registered",
           "registration_id"]
