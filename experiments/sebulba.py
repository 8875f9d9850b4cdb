"""Runs a Sebulba experiment from an `ml_collections` config file.

    python -m experiments.sebulba --config=experiments/configs/sebulba_vtrace_cartpole.py \
        --config.seed=3 --workdir=/tmp/run

Under `experiments.launch` (or a cluster launcher that sets the PODRACER_* variables, see
docs/sebulba.md) each process joins the `jax.distributed` run before it touches a device.
"""

import os
import sys
import traceback

from absl import app, flags
from ml_collections import config_flags

import sebulba
from podracer import distributed

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where metrics.jsonl (and more) are written.")
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    multiprocess = distributed.initialize_from_env()
    try:
        sebulba.train(_CONFIG.value, _WORKDIR.value)
    except BaseException:
        if not multiprocess:
            raise
        # A failed process must not wait in jax.distributed's shutdown barrier for peers that
        # may themselves be blocked in a collective: report and leave at once.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    app.run(main)
