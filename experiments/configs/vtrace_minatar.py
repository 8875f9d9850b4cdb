"""V-trace on MinAtar Breakout (gymnax's JAX port) with Anakin.

    python -m experiments.anakin --config=experiments/configs/vtrace_minatar.py --workdir=/tmp/run

Needs the gymnax extra (`pip install -e '.[gymnax]'`). Any MinAtar game works by name:
`--config.env.name=gymnax:SpaceInvaders-MinAtar`, or pgx's ports, e.g. `pgx:minatar-breakout`
(pgx adds sticky actions, p=0.1). The 10x10xC boolean frames are too small for the DQN
convolutional torso, so the MLP torso reads them flattened. What it reaches at 1M and 10M
steps on each game: docs/results.md.
"""

import ml_collections

from experiments.configs import vtrace_catch


def get_config() -> ml_collections.ConfigDict:
    config = vtrace_catch.get_config()
    config.env.name = "gymnax:Breakout-MinAtar"  # gymnax's own time limit applies (truncation)
    config.agent.torso = "mlp"
    config.agent.hidden_sizes = (256, 256)
    config.agent.learning_rate = 1e-3
    # Logits as the head computes them, as this config's recorded results were measured (left
    # None, the agent would scale a 256-wide head's logits by 0.25: docs/vtrace.md).
    config.agent.logit_scale = 1.0
    # Twice the agent's 0.01, with which the policy collapses early without PopArt; with
    # PopArt the two are about level at 1M, and 0.01 is not measured at 10M (docs/vtrace.md).
    config.agent.entropy_cost = 0.02
    config.cpu_worker_threads = 0  # one XLA:CPU thread per core: its larger kernels use them
    config.num_envs = 64  # more updates per env step: A2C-style learning is update-bound
    config.rollout_length = 16
    config.updates_per_chunk = 100
    config.total_env_steps = 10_000_000
    return config
