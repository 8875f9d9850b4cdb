"""EfficientZero on MinAtar Breakout (gymnax's JAX port) with Anakin: the setting of
`muzero_minatar.py` (every MuZero field carried, n included) with the value prefix, the
consistency loss, the reference's search and its acting temperature schedule over the run.

    python -m experiments.anakin --config=experiments/configs/efficientzero_minatar.py --workdir=/tmp/ez

Needs the gymnax extra (`pip install -e '.[gymnax]'`). The frames are read by the MLP, so
they are not augmented (augmentation is for convolutional networks). Its 1M-step curve, next to
MuZero's and V-trace's, is in docs/benchmarks.md.
"""

import ml_collections

from agents import efficientzero
from experiments.configs import muzero_minatar


def get_config() -> ml_collections.ConfigDict:
    config = muzero_minatar.get_config()
    config.agent = efficientzero.from_muzero(config.agent)
    config.agent.rollout_length = config.get_ref("rollout_length")
    config.agent.temperature_decay_updates = (
        config.get_ref("total_env_steps") * config.agent.get_ref("updates_per_step")
        // (config.get_ref("num_envs") * config.get_ref("rollout_length")))
    return config
