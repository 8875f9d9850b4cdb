"""PQN on CartPole-v1 with Anakin: no replay, no target network; Q(lambda) targets over 32
environments x T = 64, then 4 epochs of 16 minibatches. The Q-network's width, lambda, the
reward scale and the step size annealed to 0 are those of PQN's reference CartPole config
(purejaxql `pqn_cartpole.yaml`); epsilon ends at 0.05, not its 0.2 (docs/dqn.md).

    python -m experiments.anakin --config=experiments/configs/pqn_cartpole.py --workdir=/tmp/pqn
"""

import ml_collections

import anakin
from agents import pqn


def get_config() -> ml_collections.ConfigDict:
    config = anakin.default_config()
    config.env.name = "CartPole-v1"
    config.agent = pqn.default_config()
    config.agent.hidden_sizes = (256, 256)
    config.agent.lambda_ = 0.95
    config.agent.reward_scale = 0.1  # Q in tenths of the return: at most 10, not 100
    config.agent.num_minibatches = 16  # of 128 transitions each
    config.agent.epsilon_anneal_steps = 50  # learner steps: 102,400 env steps
    config.num_devices = 1
    config.num_envs = 32
    config.rollout_length = 64
    config.updates_per_chunk = 25
    config.total_env_steps = 500_000  # 245 learner steps, rounded up to whole chunks
    config.eval_every_updates = 50  # the greedy policy's return, beside the training one
    # The step size reaches 0 at the last learner step, whatever the run length on the
    # command line.
    config.agent.anneal_lr_updates = config.get_ref("total_env_steps") // (
        config.get_ref("num_envs") * config.get_ref("rollout_length"))
    return config
