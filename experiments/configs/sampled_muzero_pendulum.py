"""Sampled MuZero on Pendulum-v1 (continuous torque) with Anakin.

    python -m experiments.anakin --config=experiments/configs/sampled_muzero_pendulum.py \
        --workdir=/tmp/smz --config.sweep.seeds=0,1,2

K = 20 torques sampled at every search node, 32 simulations. Rewards are scaled by 0.1 into
the replay, so that values (down to about -16 / (1 - 0.97) x 0.1 = -53) stay inside the value
support [-10, 10] after the h-transform. Pendulum never terminates; its 200-step episodes end
by the time limit (truncation), from whose final observation the targets bootstrap. Measured
runs: docs/sampled_muzero.md.
"""

import ml_collections

import anakin
from agents import sampled_muzero


def get_config() -> ml_collections.ConfigDict:
    config = anakin.default_config()
    config.env.name = "Pendulum-v1"
    config.agent = sampled_muzero.default_config()
    config.agent.reward_scale = 0.1
    config.agent.rollout_length = config.get_ref("rollout_length")
    config.num_envs = 16
    config.rollout_length = 16
    config.updates_per_chunk = 50
    config.total_env_steps = 1_000_000
    config.eval_every_updates = 0
    return config
