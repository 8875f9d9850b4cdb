"""Sampled MuZero on envpool's Pendulum-v1 (continuous torque) with Sebulba: search on the
actor devices; replay, targets and updates on the learner devices.

    python -m experiments.sebulba --config=experiments/configs/sebulba_sampled_muzero_pendulum.py \
        --workdir=/tmp/smz

The agent's settings of `sampled_muzero_pendulum.py` (Anakin): 16 environments in one actor
thread, T = 16. envpool clips the torque to [-2, 2] (the agent's actions lie inside already).
"""

import ml_collections

import sebulba
from experiments.configs import sampled_muzero_pendulum


def get_config() -> ml_collections.ConfigDict:
    config = sebulba.default_config()
    config.env.task = "Pendulum-v1"
    config.agent = sampled_muzero_pendulum.get_config().agent
    config.envs_per_actor_thread = 16
    config.rollout_length = 16
    # The replay stores trajectories of rollout_length steps: keep the two tied.
    config.agent.rollout_length = config.get_ref("rollout_length")
    config.total_env_steps = 1_000_000
    config.log_every_updates = 20
    config.checkpoint_every_updates = 0
    config.eval_every_updates = 0
    return config
