"""V-trace on CartPole-v1 with Anakin: the JAX-native classic-control experiment.

    python -m experiments.anakin --config=experiments/configs/vtrace_cartpole.py --workdir=/tmp/run

`envs_jax.make("CartPole-v1")` applies gymnasium's 500-step time limit (a truncation: LAST
with discount 1, bootstrapped), so `env.max_episode_steps` stays 0 here. What it reaches is
in docs/vtrace.md.
"""

import ml_collections

from experiments.configs import vtrace_catch


def get_config() -> ml_collections.ConfigDict:
    config = vtrace_catch.get_config()
    config.env.name = "CartPole-v1"  # envs_jax's JAX port, parity-tested against gymnasium
    config.agent.learning_rate = 1e-3
    # The agent's entropy cost, 0.01, with its PopArt default (docs/vtrace.md).
    config.num_envs = 32  # few environments, many updates: CartPole needs updates, not data
    config.rollout_length = 16
    config.updates_per_chunk = 100
    config.total_env_steps = 2_000_000
    return config
