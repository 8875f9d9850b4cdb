"""Double DQN on CartPole-v1 with Anakin (envs_jax's port; the 500-step limit is a truncation
the n-step returns bootstrap through).

    python -m experiments.anakin --config=experiments/configs/dqn_cartpole.py --workdir=/tmp/dqn

8 environments, T = 8: 64 timesteps per learner step, 2 updates of 128 positions each (a
replay ratio of 4 sampled per inserted), epsilon from 1 to 0.01 over the first 160K steps.
LayerNorm in the MLP and a target copy every 100 updates: with copies every 500 updates Q
had reached only ~60 of its ~100 scale after 512K steps and the return fell after its peak;
more frequent copies without LayerNorm diverged (Q in the thousands). docs/dqn.md.
"""

import ml_collections

import anakin
from agents import dqn


def get_config() -> ml_collections.ConfigDict:
    config = anakin.default_config()
    config.env.name = "CartPole-v1"
    config.agent = dqn.default_config()
    config.cpu_worker_threads = 1  # its small kernels run fastest on one XLA:CPU thread
    config.num_devices = 1  # 8 environments feed one replay
    config.num_envs = 8
    config.rollout_length = 8
    config.agent.replay_ratio = 2  # optimiser updates per learner step
    config.agent.learning_rate = 2.5e-4
    config.agent.layer_norm = True  # keeps Q bounded with a frequent target copy
    config.agent.target_update_interval = 100  # optimiser updates: 3,200 env steps
    config.agent.epsilon_end = 0.01
    config.agent.epsilon_anneal_steps = 2_500  # learner steps: 160K env steps
    config.updates_per_chunk = 250
    config.total_env_steps = 500_000  # 7,813 learner steps
    config.eval_every_updates = 1_000  # the greedy policy's return, beside the training one
    return config
