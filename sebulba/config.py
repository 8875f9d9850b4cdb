"""Validation of a Sebulba experiment config, done once before any thread, environment or
compilation starts, and the device topology it resolves to."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
import numpy as np

import agents
from podracer import config as cfg
from podracer.machine import Machine, detect
from sebulba import envpool_env, host_env

STALENESS = ("fixed", "latest")


def default_config() -> ml_collections.ConfigDict:
    """Every field the Sebulba runner reads, at its default. An experiment config starts here,
    sets `agent` (left None) and changes only what the experiment needs; the checkpoint and
    evaluation fields hold the values a config without them gets
    (`podracer.config.RUN_OPTION_DEFAULTS`)."""
    config = ml_collections.ConfigDict()
    config.seed = 0  # with config and devices, fixes a fixed-lag run (README: Determinism)
    config.env = ml_collections.ConfigDict()
    # An envpool task id, "gymnasium:<id>" (any id in gymnasium's registry) or
    # "envs_jax:<name>" (any name envs_jax.make accepts): sebulba.host_env.
    config.env.task = "CartPole-v1"
    config.env.protocol = "none"  # Atari only: a name in sebulba.ATARI_PROTOCOLS
    # envpool options over the protocol's, or gymnasium.make's / envs_jax.make's (recorded)
    config.env.kwargs = ml_collections.ConfigDict()
    # Evaluation's options over those (recorded, and kept to the training spec), e.g.
    # episodic_life=False for whole games.
    config.env.eval_kwargs = ml_collections.ConfigDict()
    # envpool C++ threads per batch; 0 = derived from the machine (`derive_sizes`)
    config.env.num_threads = 0
    # Each actor thread's envs_per_actor_thread environments as this many batches of equal
    # size, stepped in turn: while one steps (on envpool's threads, which each batch has
    # env.num_threads of), the thread chooses the next one's actions. 1: act, then step.
    config.env.batches = 1
    # gymnasium: worker processes per actor thread (and for the evaluation's batch), each
    # stepping its share of the batch; 0 = a SyncVectorEnv in the actor thread
    config.env.num_workers = 0
    config.env.autoreset_mode = "next_step"  # gymnasium's vector env: next_step|same_step|disabled
    config.agent = None  # the experiment sets it, e.g. config.agent = vtrace.default_config()
    # Devices are indices into each process's local devices; the same ones may act and learn
    # (on an 8-GPU host, e.g. actor_device_ids=(0, 1) and learner_device_ids=(2, ..., 7)).
    # The sizes below left at () or 0 are derived from the host's cores and devices
    # (`derive_sizes`; on a CPU: device 0 for both, 1 thread x 32 envs, 1 envpool thread per
    # 2 cores), printed at the start and recorded in config.json as derived.
    config.actor_device_ids = ()  # where the actor threads choose actions
    config.learner_device_ids = ()  # the replicated learner, one shard of each batch each
    config.actor_threads_per_device = 0  # each with its own env.batches batches of environments
    config.envs_per_actor_thread = 0  # B; must be divisible by the number of learner devices
    config.rollout_length = 32  # T: steps per trajectory
    config.staleness = "fixed"  # "fixed": exactly policy_lag versions behind | "latest"
    config.policy_lag = 1  # fixed protocol: rollout k acts with version max(k - 1 - lag, 0)
    config.queue_size = 1  # trajectories each actor thread may have waiting for the learner
    config.total_env_steps = 500_000  # agent steps over all processes
    # Set by the runner: the run's learner updates (from total_env_steps and the sizes, derived
    # ones included). A schedule over the run references it, e.g.
    # config.agent.anneal_lr_updates = config.get_ref("learner_steps"); leave it at 0.
    config.learner_steps = 0
    config.log_every_updates = 20  # one metrics.jsonl line (and progress line) per this many
    config.timeout_s = 300.0  # longest any thread waits for another before the run fails
    config.save_final_params = False  # write <workdir>/final_params.process<i>.npz at the end
    # With a --workdir, learner updates between checkpoints in <workdir>/checkpoints; 0 = none
    # but the one at the end and on SIGTERM.
    config.checkpoint_every_updates = 0
    config.checkpoint_keep = 3  # the newest checkpoints kept
    # Fields a resumed run may change on purpose (none that reshapes the saved state), e.g.
    # ('agent.learning_rate',); any other difference from the checkpoint refuses to resume.
    config.resume_allow_changes = ()
    # Learner updates between greedy evaluations on separate environments; 0 = none. It
    # pauses the learner while it plays: up to eval_max_steps inferences per evaluation.
    config.eval_every_updates = 0
    config.eval_episodes = 32  # one episode on each of this many environments
    config.eval_max_steps = 1000  # an evaluation episode still running here counts as it stands
    # XLA:CPU's worker threads, sized before JAX's backends start (podracer.machine); 0 = one
    # per core the process may use.
    config.cpu_worker_threads = 0
    return config


# THE SIZES DERIVED FROM THE MACHINE

SIZE_FIELDS = ("actor_device_ids", "learner_device_ids", "actor_threads_per_device",
               "envs_per_actor_thread", "env.num_threads")
CPU_ENVS_PER_THREAD = 32  # B on a CPU: what every run here was sized and measured with
ACCELERATOR_ENVS_PER_THREAD = 128  # B with accelerators (the Podracer paper's actor batch)
MAX_THREADS_PER_DEVICE = 4


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The sizes of a Sebulba run in one process, each set by the config or derived."""

    actor_device_ids: tuple[int, ...]
    learner_device_ids: tuple[int, ...]
    actor_threads_per_device: int
    envs_per_actor_thread: int
    env_threads: int  # envpool C++ threads per batch (config.env.num_threads)
    derived: tuple[str, ...] = ()  # the fields of SIZE_FIELDS left to `derive_sizes`
    machine: Machine | None = None  # what they were derived on

    def fields(self) -> dict[str, Any]:
        """{config field: value} for every field of SIZE_FIELDS."""
        return dict(zip(SIZE_FIELDS, (self.actor_device_ids, self.learner_device_ids,
                                      self.actor_threads_per_device, self.envs_per_actor_thread,
                                      self.env_threads)))


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def derive_sizes(machine: Machine, *, actor_device_ids: tuple[int, ...] = (),
                 learner_device_ids: tuple[int, ...] = (), actor_threads_per_device: int = 0,
                 envs_per_actor_thread: int = 0, env_threads: int = 0) -> Sizes:
    """The sizes of one process on `machine`: each argument left at () or 0 is derived, the
    others are kept (and the derived ones follow from them).

    On a CPU (simulated CPU devices share the host's cores, so splitting them gains nothing):
    device 0 acts and learns, 1 actor thread of 32 environments, and envpool gets half the
    cores, shared among the actor threads (1 thread on 2 cores). With D accelerators: the
    first max(1, D // 4) act and the rest learn (one device does both); each actor device
    gets one actor thread per 8 cores it has (1 to 4: while one thread's environments step,
    another's inference runs), each of 128 environments (rounded up to a multiple of the
    learner devices), and envpool the cores left after one per actor thread and one for the
    learner, shared among the actor threads."""
    derived = tuple(field for field, value in zip(
        SIZE_FIELDS, (actor_device_ids, learner_device_ids, actor_threads_per_device,
                      envs_per_actor_thread, env_threads)) if not value)
    d = machine.num_devices
    if machine.accelerated and d >= 2:
        num_actors = max(1, d // 4)
        split = tuple(range(num_actors)), tuple(range(num_actors, d))
    else:
        split = (0,), (0,)
    actors = tuple(actor_device_ids) or split[0]
    learners = tuple(learner_device_ids) or split[1]
    a, cores = len(actors), machine.cores
    if machine.accelerated:
        threads = actor_threads_per_device or min(MAX_THREADS_PER_DEVICE,
                                                  max(1, cores // (8 * a)))
        envs = envs_per_actor_thread or _round_up(ACCELERATOR_ENVS_PER_THREAD, len(learners))
        env_threads = env_threads or max(1, (cores - a * threads - 1) // (a * threads))
    else:
        threads = actor_threads_per_device or 1
        envs = envs_per_actor_thread or _round_up(CPU_ENVS_PER_THREAD, len(learners))
        env_threads = env_threads or max(1, cores // (2 * a * threads))
    return Sizes(actor_device_ids=actors, learner_device_ids=learners,
                 actor_threads_per_device=threads, envs_per_actor_thread=envs,
                 env_threads=env_threads, derived=derived, machine=machine)


def _size_or_auto(config: ml_collections.ConfigDict, field: str) -> int:
    value = cfg.get(config, field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise cfg.ConfigError(field, f"must be a whole number >= 0, got {value!r}",
                              f"set --config.{field} to a positive integer, or 0 to derive it "
                              "from the machine")
    return value


def resolve_sizes(config: ml_collections.ConfigDict, machine: Machine) -> Sizes:
    """`config`'s sizes on `machine`, those left at () or 0 derived (`derive_sizes`)."""
    ids = {}
    for field in ("actor_device_ids", "learner_device_ids"):
        value = cfg.get(config, field)
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value,)
        if not isinstance(value, (tuple, list)):
            raise cfg.ConfigError(field, f"must be a tuple of device indices, got {value!r}",
                                  "use local device indices such as (0, 1), or () to derive "
                                  "them from the machine")
        ids[field] = tuple(value)
    return derive_sizes(machine, **ids,
                        actor_threads_per_device=_size_or_auto(config, "actor_threads_per_device"),
                        envs_per_actor_thread=_size_or_auto(config, "envs_per_actor_thread"),
                        env_threads=_size_or_auto(config, "env.num_threads"))


def with_sizes(config: ml_collections.ConfigDict, sizes: Sizes,
               learner_steps: int | None = None) -> ml_collections.ConfigDict:
    """A copy of `config` holding `sizes` in place of what it left to the machine (and the
    run's `learner_steps`, once counted), its references resolved: a field computed from them
    reads what the run uses."""
    figures = dict(sizes.fields())
    if learner_steps is not None:
        figures[cfg.LEARNER_STEPS_FIELD] = learner_steps
    return cfg.with_run_figures(config, figures)


def require_sebulba_config(config: Any) -> None:
    """`config` is a `ConfigDict` written for Sebulba (not for Anakin): what to run otherwise,
    before a Sebulba field is found missing."""
    cfg.require_config_dict(config, "sebulba")
    cfg.require_runner(config, "sebulba", "anakin", ("env.name", "updates_per_chunk"))


def resolved(config: ml_collections.ConfigDict, machine: Machine | None = None
             ) -> tuple[ml_collections.ConfigDict, Sizes]:
    """`config` with its sizes resolved on `machine` (this process's by default), and the
    sizes."""
    sizes = resolve_sizes(config, detect() if machine is None else machine)
    return with_sizes(config, sizes), sizes


@dataclasses.dataclass(frozen=True)
class Topology:
    """Which devices act and learn. Indices are local: the same in every process."""

    actor_device_ids: tuple[int, ...]
    learner_device_ids: tuple[int, ...]
    actor_threads_per_device: int
    num_processes: int
    environment: Environment | None = None  # the task as validated (see below)
    sizes: Sizes | None = None  # every size, and which were derived from `machine`
    machine: Machine | None = None

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


# The run's number fields, {field: (kind, example)} (`podracer.config.NUMBER_KINDS`).
RUN_NUMBERS = {"rollout_length": ("count", 32), "total_env_steps": ("count", 500_000),
               "queue_size": ("count", 1), "log_every_updates": ("count", 20),
               "timeout_s": ("positive", 300.0), "seed": ("whole", 0),
               "policy_lag": ("whole", 1), "agent.learning_rate": ("positive", 3e-4)}


def validate(config: ml_collections.ConfigDict, num_local_devices: int | None = None,
             num_processes: int | None = None, machine: Machine | None = None) -> Topology:
    """Checks `config` and returns the topology the run will use, its sizes left to the machine
    derived on `machine` (this process's by default; `num_local_devices` replaces its device
    count)."""
    require_sebulba_config(config)
    if machine is None:
        machine = detect()
    if num_local_devices is not None:
        machine = dataclasses.replace(machine, num_devices=num_local_devices)
    num_local = machine.num_devices
    num_processes = jax.process_count() if num_processes is None else num_processes

    cfg.require_agent(config, agents.registered())
    cfg.require_known_fields(config, default_config(), whose="Sebulba's config",
                             lists="sebulba.default_config()", skip=("agent",))
    agents.require_known_fields(config.agent)
    config, sizes = resolved(config, machine)
    cfg.require_numbers(config, RUN_NUMBERS)
    cfg.require_rollout_length_tied(config)
    cfg.require_choice(config, "staleness", STALENESS)
    cfg.validate_run_options(config)  # checkpoint_* and eval_*

    # ENVIRONMENT
    environment = _environment(config)
    agents.check_action_spec(environment.spec.action, config.agent.name, field="env.task",
                             env_name=environment.task)

    # DEVICES
    actor_ids = _device_ids(config, "actor_device_ids", num_local)
    learner_ids = _device_ids(config, "learner_device_ids", num_local)
    # Each actor thread splits its [T, B] trajectory along B, one shard per learner device.
    cfg.require_divisible(config, "envs_per_actor_thread", len(learner_ids),
                          "the number of learner devices")
    batches = _env_batches(config)
    if config.envs_per_actor_thread % batches:
        raise cfg.ConfigError("env.batches", f"{batches} batches cannot split "
                              f"envs_per_actor_thread={config.envs_per_actor_thread} evenly",
                              "set env.batches to a divisor of envs_per_actor_thread, or 1")
    return Topology(actor_device_ids=actor_ids, learner_device_ids=learner_ids,
                    actor_threads_per_device=config.actor_threads_per_device,
                    num_processes=num_processes,
                    environment=environment, sizes=sizes, machine=machine)


def _env_batches(config: ml_collections.ConfigDict) -> int:
    """`config.env.batches`, checked: a whole number >= 1 (1 when the config predates it)."""
    batches = config.env.get("batches", 1)
    cfg.require_whole("env.batches", batches, 1, 1,
                      fix="use 1 (one batch per actor thread) or 2 (two, stepped in turn)")
    return batches


def _stepping(config: ml_collections.ConfigDict, kind: str) -> host_env.Stepping:
    """The stepping fields of `kind` (the others' are left as they are, unread)."""
    num_workers = config.env.get("num_workers", 0)
    mode = config.env.get("autoreset_mode", "next_step")
    if kind == "gymnasium":
        cfg.require_whole("env.num_workers", num_workers, 0, 0,
                          fix="use 0 (step in the actor thread) or a number of worker processes")
        if mode not in host_env.AUTORESET_MODES:
            raise cfg.ConfigError("env.autoreset_mode", f"{mode!r} is not an autoreset mode",
                                  f"use one of {host_env.AUTORESET_MODES}")
    return host_env.Stepping(num_threads=config.env.num_threads, num_workers=num_workers,
                             autoreset_mode=mode)


def _environment(config: ml_collections.ConfigDict) -> Environment:
    """The task, its training and evaluation options and its spec, checked before anything is
    compiled; a bad task or option names its field and the fix."""
    task = cfg.get(config, "env.task")
    protocol = cfg.get(config, "env.protocol")
    if not isinstance(task, str) or not task:
        raise cfg.ConfigError("env.task", f"must be a task name, got {task!r}",
                              "set e.g. --config.env.task=CartPole-v1, gymnasium:<id> or "
                              "envs_jax:<name>")
    kind, name = host_env.parse_task(task)
    stepping = _stepping(config, kind)
    if kind == "envpool":
        options, eval_options, spec = _envpool_environment(config, task, protocol)
    else:
        if protocol not in ("", "none"):
            raise cfg.ConfigError("env.protocol", f"{protocol!r} applies to envpool's Atari "
                                  "tasks only", f"set --config.env.protocol=none for {task!r}")
        options = dict(config.env.get("kwargs", {}))
        eval_options = {**options, **config.env.get("eval_kwargs", {})}
        spec = _host_spec(kind, name, task, options, "env.kwargs")
        eval_spec = _host_spec(kind, name, task, eval_options, "env.eval_kwargs")
        _require_same_spec(spec, eval_spec)
    return Environment(task=task, protocol=protocol, options=options,
                       eval_options=eval_options, spec=spec, kind=kind, name=name,
                       stepping=stepping)


def _host_spec(kind: str, name: str, task: str, options: dict[str, object],
               field: str) -> envpool_env.EnvSpec:
    """The spec of a gymnasium or envs_jax task (one environment is built)."""
    if kind == "gymnasium":
        try:
            gymnasium_env = host_env.gymnasium_module()
        except ModuleNotFoundError as e:
            raise cfg.ConfigError("env.task", f"{task!r} needs gymnasium, not installed",
                                  host_env.GYMNASIUM_INSTALL) from e
        if not gymnasium_env.registered(name):
            raise cfg.ConfigError("env.task", f"{name!r} is not in gymnasium's registry",
                                  gymnasium_env.unknown_id_hint(name))
        make = gymnasium_env.env_spec
    else:
        from sebulba import envs_jax_env

        if not envs_jax_env.known(name):
            raise cfg.ConfigError("env.task", f"{name!r} is not an envs_jax environment",
                                  envs_jax_env.unknown_name_hint(name))
        make = envs_jax_env.env_spec
    try:
        return make(name, options)
    except KeyError as e:  # an adapter's library does not know the name
        raise cfg.ConfigError("env.task", f"{task!r} is unknown: {e}",
                              "use a name the library registers") from e
    except Exception as e:  # the library rejects an unknown or ill-typed option or space
        if not options:  # nothing but the task to blame
            raise cfg.ConfigError("env.task", f"{task!r} cannot be built: {e}",
                                  "use a task its library builds") from e
        raise cfg.ConfigError(field, f"{task!r} with the options {options} fails: {e}",
                              "remove or correct the offending option") from e


def _same_spec(a: envpool_env.EnvSpec, b: envpool_env.EnvSpec) -> bool:
    """Field by field, bounds compared as arrays (`==` on specs holding arrays of several
    entries is ambiguous)."""
    for x, y in ((a.observation, b.observation), (a.action, b.action)):
        if type(x) is not type(y):
            return False
        for field in dataclasses.fields(x):
            u, v = getattr(x, field.name), getattr(y, field.name)
            if (u is None) != (v is None) or (u is not None and not np.array_equal(u, v)):
                return False
    return True


def _require_same_spec(spec: envpool_env.EnvSpec, eval_spec: envpool_env.EnvSpec) -> None:
    if not _same_spec(spec, eval_spec):
        raise cfg.ConfigError("env.eval_kwargs", "change the observation or action spec "
                              f"({eval_spec} vs training's {spec})",
                              "only change options that keep the spec (e.g. episodic_life)")


def _envpool_environment(config: ml_collections.ConfigDict, task: str, protocol: str
                         ) -> tuple[dict[str, object], dict[str, object], envpool_env.EnvSpec]:
    if task not in envpool_env.all_tasks():
        raise cfg.ConfigError("env.task", f"{task!r} is not an envpool task",
                              envpool_env.unknown_task_hint(task) + " (or, for another kind of "
                              "environment, 'gymnasium:<id>' or 'envs_jax:<name>')")
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
    _require_same_spec(spec, eval_spec)
    return options, eval_options, spec


@dataclasses.dataclass(frozen=True)
class Environment:
    """The task as `validate` checked it, built once: its kind (`sebulba.host_env`), the
    training and evaluation options (evaluation's are training's with `env.eval_kwargs` on top)
    and their spec, and how its batches are stepped."""

    task: str  # config.env.task
    protocol: str
    options: dict[str, object]  # envpool's options, or gymnasium.make's / envs_jax.make's
    eval_options: dict[str, object]
    spec: envpool_env.EnvSpec  # in agent layout; evaluation's is the same
    kind: str = "envpool"  # one of host_env.KINDS
    name: str = ""  # the task without its kind's prefix
    stepping: host_env.Stepping = dataclasses.field(default_factory=host_env.Stepping)
