"""PPO with a Gaussian policy on Pendulum-v1 (continuous torque) with Anakin.

    python -m experiments.anakin --config=experiments/configs/ppo_pendulum.py --workdir=/tmp/run

Pendulum never terminates; its 200-step episodes end by the time limit (truncation, LAST with
discount 1), from whose final observation PPO bootstraps. The environment clips the sampled
torque to [-2, 2]. What it reaches: docs/results.md and docs/ppo.md.
"""

import ml_collections

import anakin
from agents import ppo


def get_config() -> ml_collections.ConfigDict:
    config = anakin.default_config()
    config.env.name = "Pendulum-v1"
    config.agent = ppo.default_config()
    config.agent.popart = False  # tuned and measured without PopArt (the agent's default turns it on)
    config.agent.advantage_normalization = "batch"  # and with batch-normalised advantages
    config.agent.hidden_sizes = (64, 64)
    config.agent.activation = "tanh"
    config.agent.learning_rate = 1e-3
    config.agent.num_epochs = 10
    config.agent.num_minibatches = 32  # of 64 transitions each
    config.agent.discount = 0.95
    config.agent.gae_lambda = 0.95
    config.agent.gaussian_entropy_cost = 0.0
    config.agent.value_clip_eps = 0.0
    config.num_envs = 16
    config.rollout_length = 128
    config.updates_per_chunk = 10
    config.total_env_steps = 1_000_000
    config.cpu_worker_threads = 1  # its small kernels run fastest on one XLA:CPU thread
    config.agent.anneal_lr_updates = config.get_ref("total_env_steps") // (
        config.get_ref("num_envs") * config.get_ref("rollout_length"))
    config.checkpoint_every_updates = 200  # with a --workdir (the run has 490 updates)
    config.eval_every_updates = 100
    config.eval_episodes = 16
    return config
