"""What an Anakin run will do, worked out once from its config: `make_plan` validates the config
(`anakin.config.check`, which builds the environment and the agent once) and returns a frozen
`RunPlan` that the host loop reads instead of the config."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections

import agents
import envs_jax
from anakin.config import Run, check, option, sweep_runs
from podracer import metrics as metrics_lib
from podracer.agent import Agent
from podracer.machine import Machine
from podracer.workdir import recorded_config


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Devices, sizes and intervals of one Anakin call (a sweep's runs included)."""

    config: dict[str, Any]  # the resolved config, as plain data (recorded, checked on resume)
    agent_name: str
    env_name: str
    env: envs_jax.Environment  # wrapped for training (time limit, auto-reset)
    agent: Agent
    num_devices: int
    num_envs: int
    rollout_length: int
    updates_per_chunk: int
    num_chunks: int
    runs: tuple[Run, ...]  # one per run: a single run is a sweep of one, `sweep=False`
    sweep: bool  # the programs are vmapped over `runs`
    eval_every: int  # updates; 0: no evaluation
    eval_episodes: int
    eval_max_steps: int
    checkpoint_every: int  # updates; 0: only at the end and on SIGTERM
    checkpoint_keep: int
    is_main: bool  # process 0 of the run: the one that writes records and prints
    machine: Machine | None = None  # what num_envs was derived from (None: the config set it)

    @property
    def num_runs(self) -> int:
        return len(self.runs)

    @property
    def steps_per_chunk(self) -> int:
        """Environment steps in one compiled chunk, over every device."""
        return self.updates_per_chunk * self.rollout_length * self.num_envs

    @property
    def total_env_steps(self) -> int:
        """The steps of whole chunks: `config.total_env_steps` rounded up."""
        return self.num_chunks * self.steps_per_chunk

    @property
    def seeds(self) -> list[int]:
        return [run.seed for run in self.runs]

    def describe(self) -> str:
        """'seed 3' or 'a sweep of 4 runs'."""
        return f"a sweep of {self.num_runs} runs" if self.sweep else f"seed {self.runs[0].seed}"


def make_plan(config: ml_collections.ConfigDict, num_available_devices: int) -> RunPlan:
    """Validates `config` (a bad field raises `ConfigError`, naming it and the fix) and plans the
    run on `num_available_devices` devices."""
    checked = check(config, num_available_devices)
    config = checked.config  # num_envs and learner_steps set, references resolved
    runs = sweep_runs(config)
    return RunPlan(
        config=recorded_config(metrics_lib.config_to_dict(config),
                               agents.choices(config.agent, checked.env.spec())),
        agent_name=config.agent.name,
        env_name=config.env.name,
        env=checked.env,
        agent=checked.agent,
        num_devices=checked.num_devices,
        num_envs=checked.num_envs,
        rollout_length=config.rollout_length,
        updates_per_chunk=config.updates_per_chunk,
        num_chunks=config.learner_steps // config.updates_per_chunk,
        runs=tuple(runs or [Run(seed=config.seed, hparams={})]),
        sweep=runs is not None,
        eval_every=option(config, "eval_every_updates"),
        eval_episodes=option(config, "eval_episodes"),
        eval_max_steps=option(config, "eval_max_steps"),
        checkpoint_every=option(config, "checkpoint_every_updates"),
        checkpoint_keep=option(config, "checkpoint_keep"),
        is_main=jax.process_index() == 0,
        machine=checked.machine,
    )
