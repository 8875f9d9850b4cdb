"""PQN on CartPole-v1 with Anakin: no replay, no target network; Q(lambda) targets over 32
environments x T = 64, then 4 epochs of 16 minibatches.

    python -m experiments.anakin --config=experiments/configs/pqn_cartpole.py --workdir=/tmp/pqn
"""

import ml_collections

import anakin
from agents import pqn


def get_config() -> ml_collections.ConfigDict:
    config = anakin.default_config()
    config.env.name = "CartPole-v1"
    config.agent = pqn.default_config()
    config.agent.num_minibatches = 16  # of 128 transitions each
    config.agent.epsilon_anneal_steps = 50  # learner steps: 102,400 env steps
    config.num_devices = 1
    config.num_envs = 32
    config.rollout_length = 64
    config.updates_per_chunk = 25
    config.total_env_steps = 500_000  # 245 learner steps, rounded up to whole chunks
    config.eval_every_updates = 50  # the greedy policy's return, beside the training one
    return config
