"""What Anakin and Sebulba share: types, the agent interface, replication, config, metrics and
checkpoints."""

from podracer import checkpoint, config, metrics, replication, types
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
    "checkpoint",
    "config",
    "metrics",
    "replication",
    "types",
]
