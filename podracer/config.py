"""Config validation helpers: one place that turns a bad `ConfigDict` into a clear error.

Runners validate their whole config once, before anything is compiled or started, with these
helpers; every error names the offending field and says how to fix it. The few checks that need
the shapes a learner step is traced with (a minibatch count against the transitions a device
receives) raise the same `ConfigError` from the agent's step as the runner compiles.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections


class ConfigError(ValueError):
    """A config field has a value the run cannot use. The message names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        super().__init__(f"config.{field}: {problem}. Fix: {fix}")


def get(config: ml_collections.ConfigDict, field: str) -> Any:
    """`config.a.b.c` for `field="a.b.c"`, or a ConfigError if it is missing."""
    node: Any = config
    for part in field.split("."):
        try:
            node = node[part]
        except (KeyError, AttributeError):
            raise ConfigError(field, "is missing", f"set --config.{field}=...") from None
    return node


def require_positive_number(field: str, value: Any, example: float,
                            fix: str | None = None) -> None:
    """`value` (the config's `field`, dotted) is a number > 0; `fix` replaces the suggestion
    to set `example`."""
    if not _is_number(value) or not value > 0:  # NaN fails too
        raise ConfigError(field, f"must be a positive number, got {value!r}",
                          fix or f"set e.g. --config.{field}={example}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require_whole_at_least(minimum: int):
    return lambda field, value, example: require_whole(field, value, minimum, example)


def _require_non_negative_number(field: str, value: Any, example: float) -> None:
    if not _is_number(value) or not value >= 0:  # NaN fails too
        raise ConfigError(field, f"must be a number >= 0, got {value!r}",
                          f"set e.g. --config.{field}={example}")


def _require_finite_number(field: str, value: Any, example: float) -> None:
    if not _is_number(value) or not math.isfinite(value):
        raise ConfigError(field, f"must be a finite number, got {value!r}",
                          f"set e.g. --config.{field}={example}")


def require_choice(config: ml_collections.ConfigDict, field: str, choices: Iterable[Any]) -> None:
    require_one_of(field, get(config, field), choices)


def require_one_of(field: str, value: Any, choices: Iterable[Any], also: str = "") -> None:
    """Raises `ConfigError` for `field` (its dotted name in a run's config, e.g.
    "agent.torso") when `value` is not one of `choices`, the closest choices named first;
    `also` is added to the fix (another way to set the field)."""
    choices = list(choices)
    if value in choices:
        return
    names = [choice for choice in choices if isinstance(choice, str)]
    hint = did_you_mean(value, names) if isinstance(value, str) else ""
    raise ConfigError(field, f"unknown value {value!r}" + (f" ({hint})" if hint else ""),
                      f"use one of: {', '.join(map(repr, choices))}{also}")


def require_whole(field: str, value: Any, minimum: int, example: int,
                  fix: str | None = None) -> None:
    """`value` (the config's `field`, dotted) is a whole number >= `minimum`; `fix` replaces
    the suggestion to set `example`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(field, f"must be a whole number >= {minimum}, got {value!r}",
                          fix or f"set e.g. --config.{field}={example}")


def _require_unit_interval(field: str, value: Any, fix: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise ConfigError(field, f"must be a number in [0, 1], got {value!r}", fix)


def require_fraction(field: str, value: Any, example: float) -> None:
    """`value` (the config's `field`, dotted) is a number in [0, 1], such as a lambda."""
    _require_unit_interval(field, value, f"set e.g. --config.{field}={example}")


# What each kind of number field must hold (`check_numbers`).
NUMBER_KINDS = {
    "count": _require_whole_at_least(1),  # a whole number >= 1: sizes, batch sizes, intervals
    "whole": _require_whole_at_least(0),  # a whole number >= 0
    "positive": require_positive_number,
    "non_negative": _require_non_negative_number,
    "fraction": require_fraction,
    "finite": _require_finite_number,  # any real number: loss weights, bounds
}


def check_numbers(config: ml_collections.ConfigDict, prefix: str,
                  rules: Mapping[str, tuple[str, Any]]) -> None:
    """Checks the number fields `rules` names, {field: (kind, example)} with a kind of
    `NUMBER_KINDS`, in `config` (whose fields errors name as `prefix.field`, e.g.
    "agent.batch_size"); a field `config` lacks is skipped, so agents built on another's
    config share one table."""
    for name, (kind, example) in rules.items():
        if name in config:
            NUMBER_KINDS[kind](f"{prefix}.{name}", config[name], example)


def require_numbers(config: ml_collections.ConfigDict,
                    rules: Mapping[str, tuple[str, Any]]) -> None:
    """Checks the number fields `rules` names, {dotted field: (kind, example)} with a kind of
    `NUMBER_KINDS`: a runner's sizes, counts and seed, each of which its config must hold (a
    missing one is a `ConfigError` too)."""
    for field, (kind, example) in rules.items():
        NUMBER_KINDS[kind](field, get(config, field), example)


def require_discount(value: Any, field: str = "agent.discount") -> None:
    """A discount is a number in [0, 1] (1: undiscounted): above 1 the returns grow without
    bound, below 0 they change sign at every step."""
    _require_unit_interval(field, value, f"set --config.{field} to e.g. 0.99 (1.0: undiscounted)")


def require_divisible(config: ml_collections.ConfigDict, field: str, divisor: int,
                      what: str) -> None:
    value = get(config, field)
    if value % divisor:
        lower = value - value % divisor
        raise ConfigError(
            field,
            f"{value} is not divisible by {what} ({divisor})",
            f"use a multiple of {divisor}, e.g. {max(lower, divisor)} or {lower + divisor}",
        )


# Fields every runner accepts for checkpoints, evaluation and XLA:CPU's pool of worker threads
# (`podracer.machine.set_cpu_worker_threads`) that a config may leave out, with the values a
# config without them gets (so that configs built by hand without them work).
# `anakin.default_config()` and `sebulba.default_config()` hold them at these same values.
RUN_OPTION_DEFAULTS: dict[str, Any] = {
    "checkpoint_every_updates": 0,  # 0: only at the end and on SIGTERM
    "checkpoint_keep": 3,
    "eval_every_updates": 0,  # 0: no evaluation
    "eval_episodes": 32,
    "eval_max_steps": 1000,
    "cpu_worker_threads": 0,  # 0: XLA's own choice, one per core the process may use
}


# The run's learner steps, which the runner counts from the sizes it uses (derived ones
# included), processes and devices. An agent's schedule over the whole run references it:
# `config.agent.anneal_lr_updates = config.get_ref("learner_steps")`.
LEARNER_STEPS_FIELD = "learner_steps"


def with_run_figures(config: ml_collections.ConfigDict, figures: Mapping[str, Any]
                     ) -> ml_collections.ConfigDict:
    """A copy of `config`, its field references resolved, holding `figures` ({dotted field:
    value}: the sizes a runner derived, `learner_steps`). They are in place while the
    references resolve, so that a field computed from them (a schedule over the run) reads what
    the run uses; `config` itself is left as it was. A figure its field's type refuses replaces
    the field in the copy instead."""
    replaced, restore = {}, []
    try:
        for field, value in figures.items():
            node, name = _parent(config, field)
            if name not in node:
                replaced[field] = value
                continue
            old = node[name]
            try:
                node[name] = value  # through the field's reference, where it has one
            except TypeError:
                replaced[field] = value
                continue
            restore.append((node, name, old))
        resolved = config.copy_and_resolve_references()
    finally:
        for node, name, old in reversed(restore):
            node[name] = old
    with resolved.unlocked():
        for field, value in replaced.items():
            node, name = _parent(resolved, field)
            if name in node:
                del node[name]
            node[name] = value
    return resolved


def _parent(config: ml_collections.ConfigDict, field: str
            ) -> tuple[ml_collections.ConfigDict, str]:
    """The ConfigDict holding dotted `field`, and the field's own name."""
    *parents, name = field.split(".")
    for parent in parents:
        config = config[parent]
    return config, name


def require_runner_field(config: ml_collections.ConfigDict, field: str, value: int) -> None:
    """`config.<field>` (a figure the runner sets) is absent, 0, or already `value`."""
    given = config.get(field, 0)
    if given not in (0, value):
        raise ConfigError(field, f"is set by the runner ({value} for this run), got {given!r}",
                          f"leave it at 0, and reference it where a field depends on it: "
                          f"config.get_ref({field!r})")


def run_option(config: ml_collections.ConfigDict, field: str) -> Any:
    """`config.<field>` for a field of `RUN_OPTION_DEFAULTS`, or its default when absent."""
    return config.get(field, RUN_OPTION_DEFAULTS[field])


def require_agent(config: ml_collections.ConfigDict, choices: Iterable[str]) -> None:
    """`config.agent` is set (a runner's `default_config()` leaves it None) and names one of
    `choices`."""
    choices = list(choices)
    if config.get("agent") is None:
        raise ConfigError("agent", "is not set",
                          "set it to an agent's default config, e.g. config.agent = "
                          "vtrace.default_config() after `from agents import vtrace` "
                          f"(registered agents: {', '.join(map(str, choices))})")
    require_choice(config, "agent.name", choices)


def did_you_mean(key: str, names: Iterable[str], prefix: str = "") -> str:
    """'did you mean <prefix>a or <prefix>b?' for the names closest to `key`; '' for none."""
    close = difflib.get_close_matches(key, list(names), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(prefix + name for name in close)}?" if close else ""


def require_config_dict(config: Any, runner: str) -> None:
    """`config` is an `ml_collections.ConfigDict`, as `<runner>.default_config()` returns."""
    if not isinstance(config, ml_collections.ConfigDict):
        raise TypeError(f"{runner}.train takes an ml_collections.ConfigDict (start from "
                        f"{runner}.default_config()), got {type(config).__name__}; a dict "
                        "converts with ml_collections.ConfigDict(d)")


def require_runner(config: ml_collections.ConfigDict, runner: str, other: str,
                   other_fields: Iterable[str]) -> None:
    """`config` was not written for the `other` runner: one of `other_fields` (fields only
    that runner's default config has) names it as such, before a field of `runner`'s is found
    missing."""
    for field in other_fields:
        try:
            value = get(config, field)
        except ConfigError:
            continue
        if value is not None:
            raise ConfigError(field, f"is a field of {other.capitalize()}'s config, not "
                              f"{runner.capitalize()}'s: the config is written for {other}",
                              f"run it with python -m experiments.{other} ({other}.train)")


def require_known_fields(config: ml_collections.ConfigDict,
                         reference: ml_collections.ConfigDict, *, whose: str, lists: str,
                         group: str = "", skip: Iterable[str] = ()) -> None:
    """Every field of `config` is one `reference` (a default config) has: a field misspelt in
    Python (`config.agent.learning_rat = 3e-4`) would otherwise be read by nothing, and the
    run would go on with the default, saying nothing. A group that `reference` holds empty
    (`env.kwargs`, `sweep.agent`) takes any fields: they are checked where they are used.
    `whose` names the config in the message, `lists` where its fields are listed; `skip`
    leaves top-level fields to other checks."""
    # References stay unresolved: a formula over a field the runner sets later (learner_steps)
    # cannot be evaluated yet.
    for key, value in config.items(preserve_field_references=True):
        if key in skip:
            continue
        name = f"{group}.{key}" if group else key
        if key not in reference:
            hint = did_you_mean(key, reference.keys(), f"{group}." if group else "")
            hint = f" ({hint})" if hint else ""
            raise ConfigError(name, f"is not a field of {whose}, so nothing would read it{hint}",
                              f"set one of the fields {lists} lists, or remove it")
        known = reference[key]
        if isinstance(known, ml_collections.ConfigDict) and len(known) and isinstance(
                value, ml_collections.ConfigDict):
            require_known_fields(value, known, whose=whose, lists=lists, group=name)


def require_rollout_length_tied(config: ml_collections.ConfigDict) -> None:
    """`config.agent.rollout_length`, where the agent has that field (it sizes what holds
    trajectories by it, e.g. a replay's period), equals the runner's `config.rollout_length`."""
    agent = config.get("agent")
    if agent is None or "rollout_length" not in agent:
        return
    if agent.rollout_length != config.rollout_length:
        raise ConfigError(
            "agent.rollout_length",
            f"is {agent.rollout_length} but the runner's rollout_length is "
            f"{config.rollout_length}: the agent sizes what holds its trajectories (a replay's "
            "period) by its own field, and receives the runner's",
            "set config.agent.rollout_length = config.get_ref('rollout_length')")


# The least value each field of `RUN_OPTION_DEFAULTS` takes: 1 where 0 would mean nothing
# (keeping no checkpoint, evaluating no episode or no step), 0 where 0 means "never" or "XLA's
# choice".
_RUN_OPTION_MINIMUM = {"checkpoint_keep": 1, "eval_episodes": 1, "eval_max_steps": 1}


def _whole_run_option(config: ml_collections.ConfigDict, field: str) -> int:
    """`config.<field>` of `RUN_OPTION_DEFAULTS`, checked to be a whole number at least its
    minimum."""
    value = run_option(config, field)
    require_whole(field, value, _RUN_OPTION_MINIMUM.get(field, 0), RUN_OPTION_DEFAULTS[field])
    return value


def cpu_worker_threads(config: ml_collections.ConfigDict) -> int:
    """`config.cpu_worker_threads` (0 when absent), checked before anything starts JAX's
    backends: a whole number >= 0."""
    return _whole_run_option(config, "cpu_worker_threads")


def validate_run_options(config: ml_collections.ConfigDict) -> None:
    """The checkpoint, evaluation and worker-thread fields: whole numbers >= 0, and >= 1 where
    0 means nothing."""
    for field in RUN_OPTION_DEFAULTS:
        _whole_run_option(config, field)
