"""Validation of an Anakin experiment config, done once before anything compiles."""

from __future__ import annotations

import ml_collections

import agents
import envs_jax
from podracer import config as cfg
from podracer.types import DiscreteSpec


def validate(config: ml_collections.ConfigDict, num_available_devices: int) -> int:
    """Checks `config` and returns the number of devices the run will use."""
    cfg.require_choice(config, "env.name", envs_jax.registered())
    cfg.require_choice(config, "agent.name", agents.registered())
    cfg.require_positive(config, "num_envs", "rollout_length", "updates_per_chunk",
                         "total_env_steps", "agent.learning_rate")
    cfg.require_non_negative(config, "num_devices", "env.max_episode_steps", "seed")
    num_devices = config.num_devices or num_available_devices
    if num_devices > num_available_devices:
        raise cfg.ConfigError(
            "num_devices",
            f"asks for {num_devices} devices but only {num_available_devices} are present",
            f"use at most {num_available_devices}, or 0 for all of them",
        )
    cfg.require_divisible(config, "num_envs", num_devices, "the number of devices")
    env = envs_jax.make(config.env.name, **config.env.get("kwargs", {}))
    if not isinstance(env.action_spec(), DiscreteSpec):
        raise cfg.ConfigError("env.name", f"{config.env.name!r} has continuous actions",
                              "choose an environment with discrete actions for this agent")
    return num_devices
