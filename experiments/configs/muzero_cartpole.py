"""MuZero on envpool's CartPole-v1 with Sebulba: search on the actor devices; replay,
targets and updates on the learner devices.

    python -m experiments.sebulba --config=experiments/configs/muzero_cartpole.py --workdir=/tmp/mz
"""

import ml_collections

import sebulba
from agents import muzero


def get_config() -> ml_collections.ConfigDict:
    config = sebulba.default_config()  # CartPole-v1, one device acting and learning
    config.agent = muzero.default_config()
    config.envs_per_actor_thread = 16
    config.rollout_length = 10
    # The replay stores trajectories of rollout_length steps: keep the two tied.
    config.agent.rollout_length = config.get_ref("rollout_length")
    config.agent.num_simulations = 8
    config.agent.search = "gumbel"
    # mctx's floor on the range of Q that sigma normalises by, as this config's recorded
    # results were measured with (the agent's default: 0.1).
    config.agent.gumbel_q_floor = 1e-8
    config.agent.discount = 0.97
    config.agent.td_steps = 10  # as measured (MuZero's default: 5)
    config.agent.hidden_sizes, config.agent.latent_size = (128,), 128
    config.agent.learning_rate = 3e-3
    config.agent.value_cost = 1.0
    config.agent.batch_size = 128
    config.agent.updates_per_step = 2
    config.agent.priority_exponent = 0.0
    config.agent.replay_capacity = 20480  # positions
    # A constant acting temperature, as this config's recorded results were measured with
    # (MuZero's default lowers it after 4,000 and 6,000 updates).
    config.agent.temperature_decay_updates = 0
    # No terminal head, as this config's recorded results were measured (MuZero's default has
    # one).
    config.agent.terminal_head = False
    config.agent.min_replay_items = 640  # positions
    config.agent.target_update_interval = 50
    config.total_env_steps = 40_000
    config.log_every_updates = 25
    config.checkpoint_every_updates = 50  # the replay buffer is part of every checkpoint
    config.eval_every_updates = 125  # greedy search; 0 = none
    return config
