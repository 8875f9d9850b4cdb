"""PPO on envpool's CartPole-v1 with Sebulba.

    python -m experiments.sebulba --config=experiments/configs/sebulba_ppo_cartpole.py \
        --workdir=/tmp/run

Policy lag 0 by default: the actors wait for each update, and PPO is exactly on-policy (its
first minibatch's ratio is 1, logged as `first_ratio_deviation`). With
`--config.policy_lag=1` the actors collect the next batch during the update; the data is then
one version stale, and `agent.off_policy` chooses between plain PPO ("plain", the lag logged as
`policy_lag`) and importance-corrected PPO ("corrected"); see docs/ppo.md.
"""

import ml_collections

import sebulba
from agents import ppo


def get_config() -> ml_collections.ConfigDict:
    config = sebulba.default_config()  # CartPole-v1, one device acting and learning
    config.agent = ppo.default_config()
    config.agent.popart = False  # measured without PopArt (the agent's default turns it on)
    config.agent.advantage_normalization = "batch"  # and with batch-normalised advantages
    config.agent.hidden_sizes = (64, 64)
    config.agent.activation = "tanh"
    config.agent.learning_rate = 2.5e-4
    config.agent.num_epochs = 4
    config.agent.num_minibatches = 4  # per learner device
    config.agent.off_policy = "plain"  # "plain" | "corrected": what to do with stale data
    config.actor_threads_per_device = 1  # one thread of 8 environments, as measured
    config.envs_per_actor_thread = 8
    config.rollout_length = 128
    config.policy_lag = 0  # on-policy; 1 overlaps acting with learning (off-policy by 1)
    config.total_env_steps = 500_000
    # The step size reaches 0 at the run's last learner step, which the runner counts from the
    # sizes, devices and processes it uses.
    config.agent.anneal_lr_updates = config.get_ref("learner_steps")
    config.log_every_updates = 10
    config.checkpoint_every_updates = 100
    config.eval_every_updates = 100
    return config
