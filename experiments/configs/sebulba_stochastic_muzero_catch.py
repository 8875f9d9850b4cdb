"""Stochastic MuZero with Sebulba on Catch whose ball drifts at random, stepped on the host:
the agent settings of stochastic_muzero_catch.py (Anakin).

    python -m experiments.sebulba \
        --config=experiments/configs/sebulba_stochastic_muzero_catch.py --workdir=/tmp/smz_sebulba

Policy lag 0: the actors wait for each update, as Anakin's acting does.
"""

import ml_collections

import sebulba
from experiments.configs import stochastic_muzero_catch


def get_config() -> ml_collections.ConfigDict:
    config = sebulba.default_config()
    config.agent = stochastic_muzero_catch.get_config().agent
    config.env.task = "envs_jax:stochastic_catch"  # any envs_jax environment, on the host
    config.envs_per_actor_thread = 32
    config.rollout_length = 10
    config.agent.rollout_length = config.get_ref("rollout_length")
    config.policy_lag = 0
    config.total_env_steps = 64_000
    config.log_every_updates = 20
    config.checkpoint_every_updates = 100
    config.timeout_s = 120.0  # the first search compiles slowly on a small CPU
    return config
