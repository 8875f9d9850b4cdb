"""Runs a Sebulba experiment from an `ml_collections` config file.

    python -m experiments.sebulba --config=experiments/configs/sebulba_vtrace_cartpole.py \
        --config.seed=3 --workdir=/tmp/run

With a --workdir, running the same command again resumes from the newest checkpoint there
(with fresh environments: see docs/sebulba.md). SIGTERM (pre-emption) saves a checkpoint and
exits with status 143 (128 + SIGTERM), as experiments.anakin does, so that a supervisor sees
the run as unfinished and starts it again.

Under `experiments.launch` (or a cluster launcher that sets the PODRACER_* variables, see
docs/sebulba.md) each process joins the `jax.distributed` run before it touches a device.
"""

import os
import signal
import sys
import traceback

from absl import app, flags, logging
from ml_collections import config_flags

import sebulba
from podracer import distributed

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None,
    "Where metrics.jsonl, TensorBoard events, config.json, run_info.json and checkpoints are "
    "written; a workdir holding checkpoints is resumed.")
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        # absl logs INFO to stderr by default, and orbax logs every step of every save there:
        # keep the console to progress and warnings unless --verbosity asks for more.
        logging.set_verbosity(logging.WARNING)
    multiprocess = distributed.initialize_from_env()
    try:
        result = sebulba.train(_CONFIG.value, _WORKDIR.value)
    except BaseException:
        if not multiprocess:
            raise
        # A failed process must not wait in jax.distributed's shutdown barrier for peers that
        # may themselves be blocked in a collective: report and leave at once.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    if result.interrupted:
        sys.exit(128 + signal.SIGTERM)


if __name__ == "__main__":
    app.run(main)
