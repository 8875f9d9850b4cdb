"""EfficientZero on Catch with Anakin: MuZero's Catch setting (`muzero_catch.py`: the same
networks, search, targets, replay ratio and n, `from_muzero` carrying every field) plus the
value prefix and the consistency loss. Catch's observations are not images: no augmentation.

    python -m experiments.anakin --config=experiments/configs/efficientzero_catch.py --workdir=/tmp/ez

Where EfficientZero's defaults are the reference's own search settings, this file sets
MuZero's, with which it learns Catch (docs/efficientzero.md): with the reference's
tree-wide Q normalisation and parent-mean Q for unvisited children, or with targets masked past
a terminal, the training return stalls near 0.8 at temperature 1 (the reference's temperature
schedule, `temperature_decay_updates`, lifts it only once the temperature drops). Reanalyse
and the age-based n stay off, as in MuZero's setting.
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
    # MuZero's search (OWN_SETTINGS are not carried by from_muzero), and a constant acting
    # temperature, as measured.
    config.agent.q_transform = "parent_and_siblings"
    config.agent.unvisited_q = "min"
    config.agent.temperature_decay_updates = 0
    # The full consistency cost from the first update, as measured: the run's 1,200 updates
    # would end inside the default warm-up (4,000).
    config.agent.consistency_warmup_updates = 0
    return config
