"""What a Sebulba run will do, worked out once from its config: `make_plan` validates the config
(`sebulba.config.validate`, which also builds the environment's options and spec) and returns a frozen
`SebulbaPlan` that `sebulba.train` reads instead of the config."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import ml_collections

import agents
from podracer import config as cfg
from podracer import metrics as metrics_lib
from podracer.agent import Agent
from podracer.config import run_option
from podracer.machine import Machine, detect
from podracer.workdir import recorded_config
from sebulba.config import (
    Environment,
    Sizes,
    Topology,
    require_sebulba_config,
    resolved,
    validate,
    with_sizes,
)


@dataclasses.dataclass(frozen=True)
class SebulbaPlan:
    """Devices, sizes, intervals, the environment and the agent of one Sebulba call."""

    config: dict[str, Any]  # the resolved config, as plain data (recorded, checked on resume)
    seed: int
    # DEVICES: this process's actor devices, and the learner devices of every process in the
    # learner mesh's order (process by process, each in `learner_device_ids`' order)
    topology: Topology
    actor_devices: tuple[jax.Device, ...]
    learner_devices: tuple[jax.Device, ...]
    local_learner_devices: tuple[jax.Device, ...]
    process_index: int
    num_processes: int
    # THE ENVIRONMENT AND THE AGENT, built once
    env: Environment
    env_threads: int  # envpool C++ threads per batch
    env_batches: int  # batches per actor thread, stepped in turn
    frame_skip: int  # env frames per env step
    agent: Agent
    agent_name: str
    agent_hparams: dict[str, Any]  # config values of the hyperparameters its state holds
    # SIZES
    envs_per_thread: int  # B: environments of one actor thread
    rollout_length: int  # T
    queue_size: int  # rollouts an actor thread may have waiting for the learner
    num_updates: int
    # STALENESS
    staleness: str  # "fixed" | "latest"
    policy_lag: int
    # INTERVALS (in updates; 0: none) AND LIMITS
    log_every: int
    checkpoint_every: int  # besides the end and SIGTERM
    checkpoint_keep: int
    eval_every: int
    eval_episodes: int
    eval_max_steps: int
    timeout_s: float  # longest any thread waits for another
    save_final_params: bool
    # WHAT THE SIZES WERE DERIVED FROM
    machine: Machine | None = None
    sizes: Sizes | None = None

    @property
    def is_main(self) -> bool:
        """Process 0 of the run: the one that writes records, evaluates and prints."""
        return self.process_index == 0

    @property
    def num_actor_threads(self) -> int:
        """Actor threads in one process."""
        return self.topology.num_actor_threads

    @property
    def steps_per_update(self) -> int:
        """Env steps of one update, over every process: T x B x actor threads x processes."""
        return self.num_processes * self.num_actor_threads * self.envs_per_thread * (
            self.rollout_length)

    @property
    def total_env_steps(self) -> int:
        """The steps of whole updates: `config.total_env_steps` rounded up."""
        return self.num_updates * self.steps_per_update

    @property
    def fixed(self) -> bool:
        """Fixed staleness: rollout k acts with exactly version max(k - 1 - lag, 0)."""
        return self.staleness == "fixed"


def _devices_of_process(process_index: int) -> list[jax.Device]:
    return sorted((d for d in jax.devices() if d.process_index == process_index),
                  key=lambda d: d.id)


def make_plan(config: ml_collections.ConfigDict) -> SebulbaPlan:
    """Validates `config` (a bad field raises `ConfigError`, naming it and the fix) and plans the
    run on this process's devices and those of the other processes of the run. The sizes the
    config leaves to the machine are derived here, once (`sebulba.config.derive_sizes`), and
    recorded in the plan's config as derived."""
    require_sebulba_config(config)
    machine = detect()
    given = config
    config, sizes = resolved(given, machine)
    topology = validate(config, machine=machine)
    env = topology.environment
    local = jax.local_devices()
    num_processes = jax.process_count()
    steps_per_update = (num_processes * topology.num_actor_threads
                        * config.envs_per_actor_thread * config.rollout_length)
    num_updates = max(1, math.ceil(config.total_env_steps / steps_per_update))
    cfg.require_runner_field(given, cfg.LEARNER_STEPS_FIELD, num_updates)
    config = with_sizes(given, sizes, learner_steps=num_updates)
    agent = agents.make(config.agent, env.spec)
    return SebulbaPlan(
        config=recorded_config(metrics_lib.config_to_dict(config),
                               agents.choices(config.agent, env.spec)),
        seed=config.seed,
        topology=topology,
        actor_devices=tuple(local[i] for i in topology.actor_device_ids),
        learner_devices=tuple(_devices_of_process(p)[i] for p in range(num_processes)
                              for i in topology.learner_device_ids),
        local_learner_devices=tuple(local[i] for i in topology.learner_device_ids),
        process_index=jax.process_index(),
        num_processes=num_processes,
        env=env,
        env_threads=config.env.num_threads,
        env_batches=config.env.get("batches", 1),
        frame_skip=int(env.options.get("frame_skip", 1)) if env.kind == "envpool" else 1,
        agent=agent,
        agent_name=config.agent.name,
        agent_hparams=({name: config.agent[name] for name in agent.sweepable}
                       if agent.set_hparams is not None else {}),
        envs_per_thread=config.envs_per_actor_thread,
        rollout_length=config.rollout_length,
        queue_size=config.queue_size,
        num_updates=num_updates,
        staleness=config.staleness,
        policy_lag=config.policy_lag,
        log_every=config.log_every_updates,
        checkpoint_every=run_option(config, "checkpoint_every_updates"),
        checkpoint_keep=run_option(config, "checkpoint_keep"),
        eval_every=run_option(config, "eval_every_updates"),
        eval_episodes=run_option(config, "eval_episodes"),
        eval_max_steps=run_option(config, "eval_max_steps"),
        timeout_s=config.timeout_s,
        save_final_params=bool(config.get("save_final_params", False)),
        machine=machine,
        sizes=sizes,
    )
