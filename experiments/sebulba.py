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


from absl import app, flags
from ml_collections import config_flags

import sebulba
from experiments import _cli

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
    _cli.run(sebulba.train, _CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
