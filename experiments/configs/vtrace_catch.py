"""V-trace on Catch with Anakin: the default experiment (about a minute on a 2-core CPU).

    python -m experiments.anakin --config=experiments/configs/vtrace_catch.py --workdir=/tmp/run
"""

import ml_collections

from agents import vtrace


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # a run is a pure function of (config, seed, device count)
    config.num_devices = 0  # devices to replicate over; 0 = every device of every process
    config.env = ml_collections.ConfigDict()
    config.env.name = "catch"  # any name in envs_jax.registered()
    config.env.kwargs = ml_collections.ConfigDict()  # passed to envs_jax.make
    config.env.max_episode_steps = 0  # time limit added by the runner; 0 = none
    config.agent = vtrace.default_config()
    config.num_envs = 256  # environments in total, split evenly over the devices
    config.rollout_length = 20  # T: steps per trajectory (and per update)
    config.updates_per_chunk = 50  # K: updates per compiled call; one log line per chunk
    config.total_env_steps = 2_000_000
    return config
