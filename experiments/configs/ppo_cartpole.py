"""PPO on CartPole-v1 with Anakin, at PureJaxRL's CartPole settings.

    python -m experiments.anakin --config=experiments/configs/ppo_cartpole.py --workdir=/tmp/run

4 environments, T = 128, 4 epochs x 4 minibatches, separate 64x64 tanh MLPs for policy and
value, Adam at 2.5e-4 annealed linearly to 0 over the run, 976 updates (499,712 steps). The
500-step time limit is a truncation (LAST with discount 1) that PPO bootstraps from. Anakin's
defaults leave periodic checkpoints (one is written at the end) and evaluation off. Measured
runs: docs/benchmarks.md, "PPO" (speed), and docs/results.md (returns).
"""

import ml_collections

import anakin
from agents import ppo


def get_config() -> ml_collections.ConfigDict:
    config = anakin.default_config()
    config.env.name = "CartPole-v1"  # envs_jax's JAX port, parity-tested against gymnasium
    config.agent = ppo.default_config()
    config.agent.popart = False  # PureJaxRL's PPO, which has no PopArt
    config.agent.advantage_normalization = "batch"  # and normalises over the batch
    config.agent.hidden_sizes = (64, 64)
    config.agent.activation = "tanh"
    config.agent.learning_rate = 2.5e-4
    config.agent.num_epochs = 4
    config.agent.num_minibatches = 4  # of 128 transitions each
    config.num_devices = 1  # 4 environments do not split over more; 0 = every device
    config.num_envs = 4
    config.rollout_length = 128
    config.updates_per_chunk = 122  # 8 chunks of 122 updates: 976 updates, 499,712 steps
    config.total_env_steps = 499_712  # 976 x 512, as PureJaxRL runs its 5e5
    config.cpu_worker_threads = 1  # its small kernels run fastest on one XLA:CPU thread
    # The step size reaches 0 at the last update, whatever the run length on the command line.
    config.agent.anneal_lr_updates = config.get_ref("total_env_steps") // (
        config.get_ref("num_envs") * config.get_ref("rollout_length"))
    return config
