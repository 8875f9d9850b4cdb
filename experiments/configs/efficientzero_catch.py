"""EfficientZero on Catch with Anakin: MuZero's Catch setting (`muzero_catch.py`) plus the
value prefix and the consistency loss (Catch's observations are not images: no augmentation).

Two of EfficientZero's Atari settings are off here, as measured on Catch (docs/benchmarks.md):
Reanalyse of a quarter of each batch with the per-step gradient scale 1/K reached 0.25 at 64K
steps, where both off reached 0.85 at 40K.

    python -m experiments.anakin --config=experiments/configs/efficientzero_catch.py --workdir=/tmp/ez
"""

import ml_collections

from agents import efficientzero
from experiments.configs import muzero_catch


def get_config() -> ml_collections.ConfigDict:
    config = muzero_catch.get_config()
    config.agent = efficientzero.from_muzero(config.agent)
    config.agent.rollout_length = config.get_ref("rollout_length")
    config.agent.value_prefix_horizon = 3  # Catch's unroll is K = 3 steps
    config.agent.lstm_size = 64
    config.agent.projection_hidden = 64
    config.agent.projection_size = 64
    config.agent.reanalyse_fraction = 0.0
    config.agent.unroll_gradient_scale = False
    return config
