"""MuZero on MinAtar Breakout (gymnax's JAX port) with Anakin.

    python -m experiments.anakin --config=experiments/configs/muzero_minatar.py --workdir=/tmp/mz

Needs the gymnax extra (`pip install -e '.[gymnax]'`). The 10x10x4 boolean frames are read
flattened by the MLP networks (a convolutional backward pass inside the compiled scan is slow on
CPU). What it reaches on each game at 1M steps: docs/results.md.
"""

import ml_collections

from experiments.configs import muzero_catch


def get_config() -> ml_collections.ConfigDict:
    config = muzero_catch.get_config()
    config.env.name = "gymnax:Breakout-MinAtar"  # gymnax's own time limit applies (truncation)
    config.num_envs = 64
    config.rollout_length = 10
    config.agent.network = "mlp"
    config.agent.hidden_sizes = (256,)
    config.agent.latent_size = 256
    config.agent.learning_rate = 1e-3
    config.agent.discount = 0.99
    config.agent.unroll_steps = 5
    config.agent.td_steps = 10
    config.agent.updates_per_step = 2  # 2 x 256 positions sampled per 640 inserted
    config.agent.replay_capacity = 100_000  # positions
    # A constant acting temperature, as this config's recorded results were measured with
    # (MuZero's default lowers it after 4,000 and 6,000 updates).
    config.agent.temperature_decay_updates = 0
    # mctx's Q normalisation, as measured (MuZero's default: "tree_min_max").
    config.agent.q_transform = "parent_and_siblings"
    config.agent.min_replay_items = 2_560
    config.agent.importance_anneal_updates = 3_200  # the run's learner updates
    config.agent.target_update_interval = 100
    config.updates_per_chunk = 50
    config.total_env_steps = 1_000_000
    return config
