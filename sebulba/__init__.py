"""Sebulba: envpool environments on the host, actor threads per actor device, trajectories sent
device-to-device to learner devices, a replicated learner, parameters pushed back to the actors.
"""

from sebulba.config import STALENESS, Topology, validate
from sebulba.envpool_env import ATARI_PROTOCOLS, EnvpoolEnv, env_spec, make_options
from sebulba.runner import (
    ParamsStore,
    StallError,
    ThreadFailure,
    TrainResult,
    make_evaluator,
    save_params,
    train,
)

__all__ = [
    "ATARI_PROTOCOLS",
    "STALENESS",
    "EnvpoolEnv",
    "ParamsStore",
    "StallError",
    "ThreadFailure",
    "Topology",
    "TrainResult",
    "env_spec",
    "make_evaluator",
    "make_options",
    "save_params",
    "train",
    "validate",
]
