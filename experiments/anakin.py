"""Runs an Anakin experiment from an `ml_collections` config file.

    python -m experiments.anakin --config=experiments/configs/vtrace_catch.py \
        --config.seed=3 --workdir=/tmp/run

With a --workdir, running the same command again resumes from the newest checkpoint there.
SIGTERM (pre-emption) saves a checkpoint and exits with status 143 (128 + SIGTERM), so that a
supervisor sees the run as unfinished and starts it again; Ctrl-C does the same with status 130
(a second Ctrl-C stops at once).
"""


from absl import app, flags
from ml_collections import config_flags

import anakin
from experiments import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None,
    "Where metrics.jsonl, TensorBoard events, config.json and checkpoints are written; "
    "a workdir holding checkpoints is resumed.")
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    _cli.run(anakin.train, _CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
