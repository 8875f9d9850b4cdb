"""Validation of a Sebulba experiment config, done once before any thread, environment or
compilation starts, and the device topology it resolves to."""

from __future__ import annotations

import dataclasses

import jax
import ml_collections

import agents
from podracer import config as cfg
from sebulba import envpool_env

STALENESS = ("fixed", "latest")


@dataclasses.dataclass(frozen=True)
class Topology:
    """Which devices act and learn. Indices are local: the same in every process."""

    actor_device_ids: tuple[int, ...]
    learner_device_ids: tuple[int, ...]
    actor_threads_per_device: int
    num_processes: int
    environment: Environment | None = None  # the envpool task as validated (see below)

    @property
    def num_actor_threads(self) -> int:
        """Actor threads in one process."""
        return len(self.actor_device_ids) * self.actor_threads_per_device


def _device_ids(config: ml_collections.ConfigDict, field: str, num_local: int) -> tuple[int, ...]:
    ids = cfg.get(config, field)
    if isinstance(ids, int):
        ids = (ids,)
    ids = tuple(ids)
    if not ids:
        raise cfg.ConfigError(field, "names no device", "name at least one, e.g. (0,)")
    if any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        raise cfg.ConfigError(field, f"must be integer device indices, got {ids!r}",
                              "use local device indices such as (0, 1)")
    if len(set(ids)) != len(ids):
        raise cfg.ConfigError(field, f"names a device twice: {ids!r}", "list each device once")
    bad = [i for i in ids if not 0 <= i < num_local]
    if bad:
        raise cfg.ConfigError(
            field,
            f"names device(s) {bad} but this process has only {num_local} device(s) "
            f"(indices 0..{num_local - 1})",
            f"use indices below {num_local}, or run where more devices are present",
        )
    return ids


def validate(config: ml_collections.ConfigDict, num_local_devices: int | None = None,
             num_processes: int | None = None) -> Topology:
    """Checks `config` and returns the topology the run will use."""
    num_local = jax.local_device_count() if num_local_devices is None else num_local_devices
    num_processes = jax.process_count() if num_processes is None else num_processes

    cfg.require_choice(config, "agent.name", agents.registered())
    cfg.require_positive(config, "envs_per_actor_thread", "actor_threads_per_device",
                         "rollout_length", "total_env_steps", "queue_size", "log_every_updates",
                         "timeout_s", "agent.learning_rate")
    cfg.require_non_negative(config, "seed", "policy_lag", "env.num_threads")
    cfg.require_choice(config, "staleness", STALENESS)
    cfg.validate_run_options(config)  # checkpoint_* and eval_*

    # ENVIRONMENT
    task = cfg.get(config, "env.task")
    if task not in envpool_env.all_tasks():
        raise cfg.ConfigError("env.task", f"{task!r} is not an envpool task",
                              envpool_env.unknown_task_hint(task))
    protocol = cfg.get(config, "env.protocol")
    if envpool_env.is_atari(task):
        cfg.require_choice(config, "env.protocol", sorted(envpool_env.ATARI_PROTOCOLS))
    elif protocol not in ("", "none"):
        raise cfg.ConfigError("env.protocol", f"{protocol!r} applies to Atari tasks only",
                              f"set --config.env.protocol=none for {task!r}")
    options = envpool_env.make_options(task, protocol, config.env.get("kwargs", {}))
    try:
        spec = envpool_env.env_spec(task, options)
    except Exception as e:  # envpool rejects unknown or ill-typed options here
        raise cfg.ConfigError("env.kwargs", f"envpool rejects the options {options}: {e}",
                              "remove or correct the offending option") from e
    eval_options = {**options, **config.env.get("eval_kwargs", {})}
    try:
        eval_spec = envpool_env.env_spec(task, eval_options)
    except Exception as e:
        raise cfg.ConfigError("env.eval_kwargs", f"envpool rejects the options {eval_options}: "
                              f"{e}", "remove or correct the offending option") from e
    if eval_spec != spec:
        raise cfg.ConfigError("env.eval_kwargs", "change the observation or action spec "
                              f"({eval_spec} vs training's {spec})",
                              "only change options that keep the spec (e.g. episodic_life)")
    agents.check_action_spec(spec.action, config.agent.name, field="env.task", env_name=task)

    # DEVICES
    actor_ids = _device_ids(config, "actor_device_ids", num_local)
    learner_ids = _device_ids(config, "learner_device_ids", num_local)
    # Each actor thread splits its [T, B] trajectory along B, one shard per learner device.
    cfg.require_divisible(config, "envs_per_actor_thread", len(learner_ids),
                          "the number of learner devices")
    return Topology(actor_device_ids=actor_ids, learner_device_ids=learner_ids,
                    actor_threads_per_device=config.actor_threads_per_device,
                    num_processes=num_processes,
                    environment=Environment(task=task, protocol=protocol, options=options,
                                            eval_options=eval_options, spec=spec))


@dataclasses.dataclass(frozen=True)
class Environment:
    """The envpool task as `validate` checked it, built once: the training and evaluation
    options (evaluation's are training's with `env.eval_kwargs` on top) and their spec."""

    task: str
    protocol: str
    options: dict[str, object]
    eval_options: dict[str, object]
    spec: envpool_env.EnvSpec  # in agent layout; evaluation's is the same
