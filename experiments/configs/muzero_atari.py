"""MuZero (residual conv networks, downsampling representation) on Atari with Sebulba.

    python -m experiments.sebulba --config=experiments/configs/muzero_atari.py \
        --config.env.task=Breakout-v5 --workdir=/tmp/mz_atari

The Atari protocol and envpool version are recorded exactly as for V-trace. Sizes follow the
MuZero paper where CPU-scale allows (K = 5, n = 10, discount 0.997, support 300 on the
transformed scale is replaced by 30 here), with a much smaller network and replay; scale
`agent.channels`, `agent.num_blocks`, `agent.batch_size` and `agent.replay_capacity` up on
accelerators.
"""

import ml_collections

from agents import muzero
from experiments.configs import sebulba_vtrace_atari


def get_config() -> ml_collections.ConfigDict:
    config = sebulba_vtrace_atari.get_config()
    config.agent = muzero.default_config()
    config.agent.network = "resnet"
    config.agent.channels = 32
    config.agent.num_blocks = 2
    config.agent.support_size = 30
    config.agent.discount = 0.997
    config.agent.td_steps = 10  # the paper's Atari n (MuZero's default: 5)
    config.agent.num_simulations = 16
    config.agent.search = "gumbel"
    # mctx's floor on the range of Q that sigma normalises by, as this config's recorded
    # results were measured with (the agent's default: 0.1).
    config.agent.gumbel_q_floor = 1e-8
    config.agent.batch_size = 64
    config.agent.updates_per_step = 1
    config.agent.replay_capacity = 81920  # positions, one 84x84 uint8 frame each
    # A constant acting temperature, as this config's recorded results were measured with
    # (MuZero's default lowers it after 4,000 and 6,000 updates).
    config.agent.temperature_decay_updates = 0
    config.agent.min_replay_items = 5120  # positions
    config.agent.learning_rate = 1e-3
    config.agent.value_cost = 0.25  # the paper's
    config.agent.priority_exponent = 1.0  # the paper's alpha
    config.agent.reanalyse_fraction = 0.0
    config.rollout_length = 20
    config.agent.rollout_length = config.get_ref("rollout_length")
    # Checkpoints hold the replay buffer of every learner device (see docs/sebulba.md).
    config.checkpoint_every_updates = 1000
    return config
