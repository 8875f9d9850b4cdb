"""What Anakin and Sebulba share: types, the agent interface, replication, config and metrics."""

from podracer import config, metrics, replication, types
from podracer.agent import Agent
from podracer.config import ConfigError
from podracer.types import (
    DEVICE_AXIS,
    ArraySpec,
    DiscreteSpec,
    EnvSpec,
    StepType,
    TimeStep,
    Trajectory,
)

__all__ = [
    "DEVICE_AXIS",
    "Agent",
    "ArraySpec",
    "ConfigError",
    "DiscreteSpec",
    "EnvSpec",
    "StepType",
    "TimeStep",
    "Trajectory",
    "config",
    "metrics",
    "replication",
    "types",
]
