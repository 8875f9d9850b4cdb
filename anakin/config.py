"""Validation of an Anakin experiment config, done once before anything compiles."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

import agents
import envs_jax
from podracer import config as cfg
from podracer.agent import Agent
from podracer.machine import Machine, detect

# The checkpoint and evaluation fields, shared with Sebulba (see `podracer.config`).
DEFAULTS: dict[str, Any] = cfg.RUN_OPTION_DEFAULTS
option = cfg.run_option


def default_config() -> ml_collections.ConfigDict:
    """Every field the Anakin runner reads, at its default. An experiment config starts here,
    sets `agent` (left None) and changes only what the experiment needs; the checkpoint and
    evaluation fields hold the values a config without them gets (`DEFAULTS`)."""
    config = ml_collections.ConfigDict()
    config.seed = 0  # with the config and device count, fixes the run (README: Determinism)
    config.num_devices = 0  # devices to replicate over; 0 = every device of every process
    config.env = ml_collections.ConfigDict()
    config.env.name = "catch"  # any name in envs_jax.registered()
    config.env.kwargs = ml_collections.ConfigDict()  # passed to envs_jax.make
    config.env.max_episode_steps = 0  # time limit added by the runner; 0 = none
    config.env.frame_stack = 1  # observations stacked along the last axis; 1 = none
    config.agent = None  # the experiment sets it, e.g. config.agent = vtrace.default_config()
    # 32 x 16 = 512 transitions per update: about 2,000 updates per million steps, with
    # which every shipped agent's defaults learn Catch and classic control (docs/results.md).
    # For throughput on many devices raise num_envs (the benchmarks use 256 per device), or set
    # 0 to derive it from the machine (`derive_num_envs`: 32 on a CPU, 256 per accelerator).
    config.num_envs = 32  # environments in total, split evenly over the devices
    config.rollout_length = 16  # T: steps per trajectory (and per update)
    config.updates_per_chunk = 50  # K: updates per compiled call; one log line per chunk
    config.total_env_steps = 2_000_000  # agent steps of the run, rounded up to whole chunks
    # Set by the runner: the run's learner updates (whole chunks of total_env_steps at the
    # num_envs used, derived or not). A schedule over the run references it, e.g.
    # config.agent.anneal_lr_updates = config.get_ref("learner_steps"); leave it at 0.
    config.learner_steps = 0
    # With a --workdir, learner updates between checkpoints in <workdir>/checkpoints, taken at
    # the first chunk end past each multiple; 0 = none but the one at the end and on SIGTERM.
    config.checkpoint_every_updates = 0
    config.checkpoint_keep = 3  # the newest checkpoints kept
    # Fields a resumed run may change on purpose (none that reshapes the saved state), e.g.
    # ('agent.learning_rate',); any other difference from the checkpoint refuses to resume.
    config.resume_allow_changes = ()
    config.eval_every_updates = 0  # greedy evaluation on separate environments; 0 = none
    config.eval_episodes = 32  # one episode on each of this many fresh environments
    config.eval_max_steps = 1000  # an evaluation episode still running here counts as it stands
    # XLA:CPU's worker threads, sized before JAX's backends start (podracer.machine); 0 = one
    # per core the process may use.
    config.cpu_worker_threads = 0
    # Sweeps: R independent runs vmapped inside one compiled program, logged in run_<i>/.
    config.sweep = ml_collections.ConfigDict()
    config.sweep.seeds = ()  # one seed per run; () = config.seed for every run
    # Agent fields in the agent's `sweepable`, e.g. learning_rate = (1e-3, 3e-4): one value
    # per run, zipped with the seeds.
    config.sweep.agent = ml_collections.ConfigDict()
    return config


@dataclasses.dataclass(frozen=True)
class Run:
    """One of the independent runs that a sweep vmaps inside one program."""

    seed: int
    hparams: dict[str, float]  # agent config field -> this run's value


def sweep_runs(config: ml_collections.ConfigDict) -> list[Run] | None:
    """The runs of `config.sweep`, or None when it asks for none (a plain single run).

    `sweep.seeds` and every `sweep.agent.<field>` are sequences zipped together: run i has
    seed `seeds[i]` (or `config.seed` when `seeds` is empty) and `agent.<field> = values[i]`.
    """
    sweep = config.get("sweep")
    if sweep is None:
        return None
    seeds = list(sweep.get("seeds", ()) or ())
    hparams = dict(sweep.get("agent", {}) or {})
    if not seeds and not hparams:
        return None
    lengths = {len(seeds)} if seeds else set()
    lengths |= {len(v) for v in hparams.values()}
    num_runs = max(lengths)
    if not seeds:
        seeds = [config.seed] * num_runs
    return [Run(seed=int(seeds[i]), hparams={k: float(v[i]) for k, v in hparams.items()})
            for i in range(num_runs)]


def _validate_sweep(config: ml_collections.ConfigDict, sweepable: tuple[str, ...],
                    agent_name: str) -> None:
    sweep = config.get("sweep")
    if sweep is None:
        return
    seeds = sweep.get("seeds", ()) or ()
    if not isinstance(seeds, (tuple, list)) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise cfg.ConfigError("sweep.seeds", f"must be a sequence of seeds >= 0, got {seeds!r}",
                              "set e.g. --config.sweep.seeds='(0, 1, 2, 3)'")
    lengths = {"sweep.seeds": len(seeds)} if seeds else {}
    for field, values in (sweep.get("agent", {}) or {}).items():
        name = f"sweep.agent.{field}"
        if field not in sweepable:
            raise cfg.ConfigError(
                name, f"the {agent_name!r} agent cannot sweep {field!r}",
                f"sweep one of {list(sweepable)}" if sweepable
                else "sweep seeds only (this agent keeps no hyperparameters in its state)")
        if not isinstance(values, (tuple, list)) or not values or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise cfg.ConfigError(name, f"must be a non-empty sequence of numbers, got "
                                  f"{values!r}", f"set e.g. {name} = (1e-3, 3e-4)")
        if field == "learning_rate" and min(values) <= 0:
            raise cfg.ConfigError(name, f"learning rates must be > 0, got {values!r}",
                                  "use positive values")
        lengths[name] = len(values)
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{k} has {n}" for k, n in lengths.items())
        raise cfg.ConfigError(next(iter(lengths)), f"sweep sequences differ in length ({listed})",
                              "give every swept field one value per run (they are zipped)")
    first: dict[tuple, int] = {}
    for i, run in enumerate(sweep_runs(config) or ()):
        key = (run.seed, tuple(sorted(run.hparams.items())))
        if key in first:
            what = ", ".join([f"seed {run.seed}"]
                             + [f"{name} {value:g}" for name, value in key[1]])
            raise cfg.ConfigError(
                next(iter(lengths)), f"runs {first[key]} and {i} are the same run ({what}): "
                "the sweep would compute it twice",
                "give each run its own seed or values (e.g. --config.sweep.seeds='(0, 1, 2)')")
        first[key] = i


def _validate_swept_values(config: ml_collections.ConfigDict, env_spec) -> None:
    """Each run's values pass the agent's own checks, as the config's values did: a swept
    discount of 1.5 is refused before compiling like `--config.agent.discount=1.5`."""
    seen = set()
    for i, run in enumerate(sweep_runs(config) or ()):
        values = tuple(sorted(run.hparams.items()))
        if not values or values in seen:
            continue
        seen.add(values)
        agent_config = config.agent.copy_and_resolve_references()
        with agent_config.ignore_type():
            for name, value in values:
                agent_config[name] = value
        try:
            agents.make(agent_config, env_spec)
        except cfg.ConfigError as error:
            swept = error.field.removeprefix("agent.")
            field = f"sweep.agent.{swept}" if swept in run.hparams else error.field
            raise cfg.ConfigError(field, f"run {i}'s values are refused by the agent ({error})",
                                  f"give every run of {field} a value the agent accepts"
                                  ) from None


CPU_NUM_ENVS = 32  # environments in total on a CPU: the default every result here used
ACCELERATOR_ENVS_PER_DEVICE = 256


def derive_num_envs(machine: Machine, num_devices: int) -> int:
    """`num_envs` left to the machine (0): on a CPU 32 in total (rounded up to a multiple of the
    devices; simulated CPU devices share the host's cores), with accelerators 256 per device.
    It is the learner batch too (num_envs x rollout_length per update): schedules counted in
    updates move with it."""
    if machine.accelerated:
        return ACCELERATOR_ENVS_PER_DEVICE * num_devices
    return -(-CPU_NUM_ENVS // num_devices) * num_devices


def learner_updates(config: ml_collections.ConfigDict, num_envs: int) -> int:
    """The learner updates of a run of `num_envs` environments: `total_env_steps` rounded up to
    whole chunks of `updates_per_chunk` updates of `num_envs` x `rollout_length` steps."""
    steps_per_chunk = config.updates_per_chunk * config.rollout_length * num_envs
    return -(-config.total_env_steps // steps_per_chunk) * config.updates_per_chunk


def validate(config: ml_collections.ConfigDict, num_available_devices: int) -> int:
    """Checks `config` and returns the number of devices the run will use."""
    return check(config, num_available_devices).num_devices


@dataclasses.dataclass(frozen=True)
class Checked:
    """What validating a config built: the run's device count, its environment (wrapped for
    training) and its agent, each built once."""

    num_devices: int
    env: envs_jax.Environment
    agent: Agent
    num_envs: int = 0  # config.num_envs, or derived from `machine` where it is 0
    machine: Machine | None = None  # set where num_envs was derived
    # The config the run uses: num_envs and learner_steps set, field references resolved.
    config: ml_collections.ConfigDict | None = None


# The run's number fields, {field: (kind, example)} (`podracer.config.NUMBER_KINDS`).
RUN_NUMBERS = {"rollout_length": ("count", 16), "updates_per_chunk": ("count", 50),
               "total_env_steps": ("count", 2_000_000), "num_envs": ("whole", 32),
               "num_devices": ("whole", 0), "env.max_episode_steps": ("whole", 0),
               "seed": ("whole", 0), "agent.learning_rate": ("positive", 3e-4)}


def check(config: ml_collections.ConfigDict, num_available_devices: int,
          machine: Machine | None = None) -> Checked:
    """Checks `config` (a bad field raises `ConfigError`, naming it and the fix) and returns
    the device count, environment and agent it describes; a `num_envs` of 0 is derived on
    `machine` (this process's by default)."""
    cfg.require_config_dict(config, "anakin")
    cfg.require_runner(config, "anakin", "sebulba", ("env.task", "actor_device_ids"))
    env_name = cfg.get(config, "env.name")
    extra = envs_jax.missing_extra(env_name) if isinstance(env_name, str) else None
    if extra is not None:
        raise cfg.ConfigError(
            "env.name", f"{env_name!r} comes from a library that is not installed",
            f"install this project's {extra!r} extra: pip install -e '.[{extra}]'")
    if env_name not in envs_jax.registered(adapters=False):
        # Listing the adapters imports their libraries (seconds): only for non-native names.
        cfg.require_choice(config, "env.name", envs_jax.registered())
    cfg.require_agent(config, agents.registered())
    cfg.require_known_fields(config, default_config(), whose="Anakin's config",
                             lists="anakin.default_config()", skip=("agent",))
    agents.require_known_fields(config.agent)
    cfg.require_numbers(config, RUN_NUMBERS)
    cfg.require_rollout_length_tied(config)
    frame_stack = config.env.get("frame_stack", 1)
    cfg.require_whole("env.frame_stack", frame_stack, 1, 4,
                      fix="set --config.env.frame_stack=4 to stack the 4 newest observations, "
                      "or 1 for none")
    cfg.validate_run_options(config)
    num_devices = config.num_devices or num_available_devices
    if num_devices > num_available_devices:
        raise cfg.ConfigError(
            "num_devices",
            f"asks for {num_devices} devices but only {num_available_devices} are present",
            f"use at most {num_available_devices}, or 0 for all of them",
        )
    num_envs = config.num_envs
    if num_envs:
        cfg.require_divisible(config, "num_envs", num_devices, "the number of devices")
    else:
        machine = detect() if machine is None else machine
        num_envs = derive_num_envs(machine, num_devices)
    given_num_envs = config.num_envs
    learner_steps = learner_updates(config, num_envs)
    cfg.require_runner_field(config, cfg.LEARNER_STEPS_FIELD, learner_steps)
    config = cfg.with_run_figures(config, {"num_envs": num_envs,
                                           cfg.LEARNER_STEPS_FIELD: learner_steps})
    kwargs = dict(config.env.get("kwargs", {}) or {})
    try:
        env = envs_jax.make(config.env.name, **kwargs)
    except TypeError as error:  # an argument the environment does not take
        raise cfg.ConfigError("env.kwargs", f"{config.env.name!r} refuses {kwargs!r}: {error}",
                              "pass only the keyword arguments its constructor takes") from None
    env = envs_jax.wrap_for_training(env, config.env.max_episode_steps or None,
                                     frame_stack=frame_stack)
    action_spec = env.action_spec()
    agents.check_action_spec(action_spec, config.agent.name, field="env.name",
                             env_name=config.env.name)
    reward_shape = tuple(env.reward_spec().shape)
    if reward_shape != ():
        raise cfg.ConfigError(
            "env.name", f"{config.env.name!r} gives one reward per agent (shape "
            f"{reward_shape})",
            "choose a single-agent environment: the agents here learn from one scalar reward")
    agent = agents.make(config.agent, env.spec())
    if config.get("sweep") is not None:
        sweepable = agent.sweepable if agent.set_hparams is not None else ()
        _validate_sweep(config, sweepable, config.agent.name)
        _validate_swept_values(config, env.spec())
    return Checked(num_devices=num_devices, env=env, agent=agent, num_envs=num_envs,
                   machine=None if given_num_envs else machine, config=config)
