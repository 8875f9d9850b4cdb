"""Runs an Anakin experiment from an `ml_collections` config file.

    python -m experiments.anakin --config=experiments/configs/vtrace_catch.py \
        --config.seed=3 --workdir=/tmp/run
"""

from absl import app, flags
from ml_collections import config_flags

import anakin

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where metrics.jsonl (and more) are written.")
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    anakin.train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
