"""EfficientZero on Atari 100k with Sebulba: 100K agent steps (400K frames) under the
`atari100k` protocol (96x96 RGB, 4-frame stack, EfficientZero's preprocessing; see
docs/atari100k.md), EfficientZero's network (`ez_resnet`: 96x96 -> 6x6), K = 5, n = 5
shortened with the data's age, value prefix (H = 5), consistency loss (weight 2), Reanalyse of
every sample, augmentation, and a greedy evaluation of 32 whole games at the end.

    python -m experiments.sebulba --config=experiments/configs/efficientzero_atari100k.py \
        --config.env.task=Pong-v5 --workdir=/tmp/ez_pong
    python -m experiments.atari100k --runs='/tmp/ez_*'   # the human-normalised table

Sizes are the paper's where an accelerator is assumed (batch 256, 64 channels); its replay
ratio (one update of 256 positions per environment step) is `updates_per_step`. The optimiser
is AdamW; SpeedyZero's Clipped LARS is `--config.agent.optimizer=clipped_lars` (with e.g.
`--config.agent.learning_rate=0.2`). Not run to the end on a CPU (how to run it and
tabulate the scores: docs/atari100k.md).
"""

import ml_collections

from agents import efficientzero
from experiments.configs import sebulba_vtrace_atari


def get_config() -> ml_collections.ConfigDict:
    config = sebulba_vtrace_atari.get_config()
    config.env.protocol = "atari100k"
    config.env.eval_kwargs.episodic_life = False  # evaluation plays whole games
    config.actor_threads_per_device = 2
    config.envs_per_actor_thread = 10
    config.rollout_length = 20  # 2 x 10 x 20 = 400 agent steps per update: 250 updates
    config.total_env_steps = 100_000
    config.agent = efficientzero.default_config()
    config.agent.rollout_length = config.get_ref("rollout_length")
    config.agent.network = "ez_resnet"
    config.agent.channels = 64
    config.agent.num_blocks = 1
    config.agent.hidden_sizes = (32,)
    config.agent.lstm_size = 512
    config.agent.projection_hidden = 1024
    config.agent.projection_size = 1024
    config.agent.support_size = 300
    config.agent.discount = 0.997
    config.agent.unroll_steps = 5
    config.agent.td_steps = 5
    config.agent.td_steps_min = 1
    config.agent.td_age_interval = 30_000
    config.agent.num_simulations = 50
    config.agent.search = "muzero"
    config.agent.batch_size = 256
    config.agent.updates_per_step = 400  # one update per agent step, as in the paper
    config.agent.learning_rate = 1e-3
    config.agent.value_cost = 0.25  # the paper's
    config.agent.priority_exponent = 0.6
    config.agent.importance_exponent = 0.4
    config.agent.importance_anneal_updates = 100_000
    config.agent.temperature_decay_updates = 100_000  # the reference's: its whole training
    config.agent.replay_capacity = 100_000  # positions: every step of the run
    config.agent.min_replay_items = 2_000
    config.agent.target_update_interval = 200
    config.agent.reanalyse_fraction = 1.0
    config.agent.past_end_targets = "masked"  # the reference's; the default is MuZero's
    config.agent.terminal_head = False  # the reference has none
    config.agent.consistency_warmup_updates = 0  # nor a warm-up of the consistency cost
    config.agent.refresh_interval = 1_000
    config.eval_every_updates = 250  # at the end: 250 updates of 400 steps
    config.eval_episodes = 32
    config.eval_max_steps = 27_000
    config.checkpoint_every_updates = 50
    return config
