"""V-trace on envpool's CartPole-v1 with Sebulba: the fast classic-control experiment.

    python -m experiments.sebulba --config=experiments/configs/sebulba_vtrace_cartpole.py \
        --workdir=/tmp/run

Sebulba's defaults (`sebulba.default_config()`: CartPole-v1, one device for acting and
learning, 32 environments, T = 32, 500K steps); with more devices name them, e.g.
`--config.actor_device_ids="(0,)" --config.learner_device_ids="(1, 2)"`.
"""

import ml_collections

import sebulba
from agents import vtrace


def get_config() -> ml_collections.ConfigDict:
    config = sebulba.default_config()
    config.agent = vtrace.default_config()
    config.agent.hidden_sizes = (64, 64)
    config.agent.learning_rate = 1e-3
    config.agent.max_grad_norm = 0.5
    config.agent.entropy_cost = 0.01
    config.checkpoint_every_updates = 100  # with a --workdir (the run has 489 updates)
    config.eval_every_updates = 100  # the return of the greedy policy, beside the training one
    return config
