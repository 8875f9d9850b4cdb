"""EfficientZero on Catch with Anakin: MuZero's Catch setting (`muzero_catch.py`: the same
networks, search, replay ratio and n) plus the value prefix and the consistency loss, and the
reference's search and acting temperature schedule. Catch's observations are not images: no
augmentation. `from_muzero` carries every MuZero field, so this file says what differs.

    python -m experiments.anakin --config=experiments/configs/efficientzero_catch.py --workdir=/tmp/ez

Reanalyse and the age-based n are off, as in MuZero's setting (`reanalyse_fraction=0`,
`td_age_interval=0`): on Catch the replay holds 16 chunks of fresh data; docs/efficientzero.md
has the ablations.
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
    # The reference's temperature schedule over this run's learner updates.
    config.agent.temperature_decay_updates = (
        config.get_ref("total_env_steps") * config.agent.get_ref("updates_per_step")
        // (config.get_ref("num_envs") * config.get_ref("rollout_length")))
    return config
