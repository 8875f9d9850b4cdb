"""Double DQN on Catch with Anakin: the transition replay and updates inside one compiled
program.

    python -m experiments.anakin --config=experiments/configs/dqn_catch.py --workdir=/tmp/dqn

16 environments, T = 4: 64 timesteps into each device's replay per learner step, one update
of 128 sampled positions each (3-step returns), after a warm-up of 1,000 positions.
"""

import ml_collections

import anakin
from agents import dqn


def get_config() -> ml_collections.ConfigDict:
    config = anakin.default_config()
    config.agent = dqn.default_config()
    config.cpu_worker_threads = 1  # its small kernels run fastest on one XLA:CPU thread
    config.num_devices = 1  # 16 environments feed one replay; 0 = every device, a shard each
    config.num_envs = 16
    config.rollout_length = 4
    config.agent.epsilon_anneal_steps = 300  # learner steps: 19,200 env steps
    config.agent.epsilon_end = 0.01
    config.agent.target_update_interval = 50  # optimiser updates
    config.updates_per_chunk = 100
    config.total_env_steps = 100_000  # 1,563 learner steps
    config.eval_every_updates = 500  # the greedy policy's return, beside the training one
    return config
