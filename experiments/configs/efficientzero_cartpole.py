"""EfficientZero on envpool's CartPole-v1 with Sebulba (MuZero's `muzero_cartpole.py`
setting, every MuZero field carried: Gumbel search, n = 10; with the value prefix and the
consistency loss).

    python -m experiments.sebulba --config=experiments/configs/efficientzero_cartpole.py --workdir=/tmp/ez
"""

import ml_collections

from agents import efficientzero
from experiments.configs import muzero_cartpole


def get_config() -> ml_collections.ConfigDict:
    config = muzero_cartpole.get_config()
    config.agent = efficientzero.from_muzero(config.agent)
    config.agent.rollout_length = config.get_ref("rollout_length")
    config.agent.projection_hidden = 64
    config.agent.projection_size = 64
    # The full consistency cost from the first update: the run's 500 updates would end inside
    # the default warm-up (4,000).
    config.agent.consistency_warmup_updates = 0
    return config
