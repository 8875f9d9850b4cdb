"""EfficientZero on envpool's CartPole-v1 with Sebulba (MuZero's `muzero_cartpole.py`
setting, with the value prefix and the consistency loss).

    python -m experiments.sebulba --config=experiments/configs/efficientzero_cartpole.py --workdir=/tmp/ez
"""

import ml_collections

from agents import efficientzero
from experiments.configs import muzero_cartpole

SHARED = ("num_simulations", "search", "discount", "hidden_sizes", "latent_size",
          "learning_rate", "value_cost", "batch_size", "updates_per_step", "priority_exponent",
          "replay_capacity", "min_replay_items", "target_update_interval")


def get_config() -> ml_collections.ConfigDict:
    config = muzero_cartpole.get_config()
    mz = config.agent
    config.agent = efficientzero.default_config()
    for field in SHARED:
        config.agent[field] = mz[field]
    config.agent.rollout_length = config.get_ref("rollout_length")
    config.agent.projection_hidden = 64
    config.agent.projection_size = 64
    config.agent.reanalyse_fraction = 0.0
    config.agent.unroll_gradient_scale = False
    return config
