"""V-trace on Acrobot-v1 with Anakin: reward -1 per step, the swing-up's first success is rare.

    python -m experiments.anakin --config=experiments/configs/vtrace_acrobot.py --workdir=/tmp/run

`envs_jax.make("Acrobot-v1")` is the JAX port parity-tested against gymnasium, with its
500-step time limit (a truncation, bootstrapped). The agent's defaults as they are (PopArt on:
without it the value regression to returns near -100 inflates the shared torso's features and
the policy turns deterministic before any episode succeeds; docs/vtrace.md), at the runner's
default batch, 32 environments x T = 16: about 2,000 updates per 1M steps (256 x 20 makes 200,
too few by 1M). Measured: docs/vtrace.md and docs/results.md.
"""

import ml_collections

from experiments.configs import vtrace_catch


def get_config() -> ml_collections.ConfigDict:
    config = vtrace_catch.get_config()
    config.env.name = "Acrobot-v1"
    config.updates_per_chunk = 100
    config.total_env_steps = 1_000_000
    return config
