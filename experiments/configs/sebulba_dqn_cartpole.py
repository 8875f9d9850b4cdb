"""Double DQN on envpool's CartPole-v1 with Sebulba: the replay lives in the learner state on
the learner device(s), one shard per device.

    python -m experiments.sebulba --config=experiments/configs/sebulba_dqn_cartpole.py \
        --workdir=/tmp/run

The agent settings of dqn_cartpole.py (Anakin). Policy lag 0: the actors wait for each update
(a lag of 1 acts with parameters one update older, which a replay agent tolerates).
"""

import ml_collections

import sebulba
from experiments.configs import dqn_cartpole


def get_config() -> ml_collections.ConfigDict:
    config = sebulba.default_config()  # CartPole-v1, one device acting and learning
    config.agent = dqn_cartpole.get_config().agent
    config.envs_per_actor_thread = 8
    config.rollout_length = 8
    config.policy_lag = 0
    config.total_env_steps = 500_000
    config.log_every_updates = 250
    config.eval_every_updates = 1_000
    return config
