"""V-trace on Catch with Anakin: the default experiment (about a minute on a 2-core CPU).

    python -m experiments.anakin --config=experiments/configs/vtrace_catch.py --workdir=/tmp/run

Anakin's defaults (`anakin.default_config()`: Catch, 32 environments, T = 16, 2M steps) with
V-trace's agent, checkpoints and greedy evaluation.
"""

import ml_collections

import anakin
from agents import vtrace


def get_config() -> ml_collections.ConfigDict:
    config = anakin.default_config()
    config.agent = vtrace.default_config()
    config.checkpoint_every_updates = 1000  # with a --workdir (the run has 3,907 updates)
    config.eval_every_updates = 500  # the return of the greedy policy, beside the training one
    config.cpu_worker_threads = 1  # its small kernels run fastest on one XLA:CPU thread
    return config
