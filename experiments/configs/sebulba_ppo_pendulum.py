"""PPO with a Gaussian policy on envpool's Pendulum-v1 (continuous torque) with Sebulba.

    python -m experiments.sebulba --config=experiments/configs/sebulba_ppo_pendulum.py \
        --workdir=/tmp/run

The hyperparameters of `ppo_pendulum.py` (Anakin) on envpool's C++ Pendulum: 16 environments
in one actor thread, T = 128, policy lag 0 (on-policy). envpool clips the sampled torque to
[-2, 2]; its 200-step episodes end by the time limit (truncation), from whose final
observation PPO bootstraps.
"""

import ml_collections

from experiments.configs import ppo_pendulum, sebulba_ppo_cartpole

SHARED = ("hidden_sizes", "activation", "learning_rate", "num_epochs", "num_minibatches",
          "discount", "gae_lambda", "gaussian_entropy_cost", "value_clip_eps")


def get_config() -> ml_collections.ConfigDict:
    config = sebulba_ppo_cartpole.get_config()
    anakin_agent = ppo_pendulum.get_config().agent
    for field in SHARED:
        config.agent[field] = anakin_agent[field]
    config.env.task = "Pendulum-v1"
    config.envs_per_actor_thread = 16
    config.rollout_length = 128
    config.total_env_steps = 1_000_000
    config.eval_episodes = 16
    return config
