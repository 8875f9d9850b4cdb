"""Sebulba: environments on the host (envpool's, gymnasium's or envs_jax's: `sebulba.host_env`),
actor threads per actor device, trajectories sent device-to-device to learner devices, a
replicated learner, parameters pushed back to the actors.
"""

from sebulba.actor import Actor
from sebulba.config import STALENESS, Topology, default_config, validate
from sebulba.envpool_env import ATARI_PROTOCOLS, EnvpoolEnv, env_spec, make_options
from sebulba.evaluation import make_evaluator
from sebulba.learner import Learner
from sebulba.params import ParamsStore
from sebulba.runner import TrainResult, save_params, train
from sebulba.threads import StallError, ThreadFailure

__all__ = [
    "ATARI_PROTOCOLS",
    "STALENESS",
    "Actor",
    "EnvpoolEnv",
    "Learner",
    "ParamsStore",
    "StallError",
    "ThreadFailure",
    "Topology",
    "TrainResult",
    "default_config",
    "env_spec",
    "make_evaluator",
    "make_options",
    "save_params",
    "train",
    "validate",
]
