"""EfficientZero on MinAtar Breakout (gymnax's JAX port) with Anakin: the setting of
`muzero_minatar.py` (every MuZero field carried, n included, and MuZero's search settings)
with the value prefix and the consistency loss.

    python -m experiments.anakin --config=experiments/configs/efficientzero_minatar.py --workdir=/tmp/ez

Needs the gymnax extra (`pip install -e '.[gymnax]'`). The frames are read by the MLP, so
they are not augmented (augmentation is for convolutional networks). What it reaches on each game at
1M steps, next to MuZero: docs/results.md and docs/efficientzero.md.
"""

import ml_collections

from agents import efficientzero
from experiments.configs import muzero_minatar


def get_config() -> ml_collections.ConfigDict:
    config = muzero_minatar.get_config()
    config.agent = efficientzero.from_muzero(config.agent)
    config.agent.rollout_length = config.get_ref("rollout_length")
    # MuZero's search, as in efficientzero_catch.py (muzero_minatar.py's constant acting
    # temperature is carried).
    config.agent.q_transform = "parent_and_siblings"
    config.agent.unvisited_q = "min"
    # The default warm-up in environment steps: the full consistency cost from 512K steps
    # (4,000 updates of 128 steps at Anakin's default batch; here 320 steps per update).
    config.agent.consistency_warmup_updates = 1_600
    return config
