"""What Anakin and Sebulba share: types, the agent interface, replication, config validation,
metrics, checkpoints and optimisers (`podracer.optim`: Clipped LARS), re-exported here; the
on-device replays of positions (`podracer.position_replay`) and of transitions
(`podracer.transition_replay`), the replay agents' shared loop (`podracer.replay_loop`)
and multi-process start-up (`podracer.distributed`) are imported by their module names."""

from podracer import checkpoint, config, metrics, optim, replication, types
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
    "optim",
    "replication",
    "types",
]
