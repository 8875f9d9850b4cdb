"""Learning curves from run workdirs: return against environment steps and against wall time.

    python -m experiments.plot /tmp/run_seed0 /tmp/run_seed1 /tmp/sweep --out curves.png
    python -m experiments.plot /tmp/a0 /tmp/a1 /tmp/b0 --labels=a,a,b --out curves.png

Each workdir is a run (its `metrics.jsonl`) or a sweep (its `run_<i>/metrics.jsonl`). Runs with
the same label are pooled into one curve: the mean as a line, the range (min to max) across
them as a band. A workdir's label is `--labels`' entry for it, else its directory name; a
sweep's runs add their swept hyperparameters to it, so a seed sweep pools into one curve and a
learning-rate sweep gives one curve per learning rate. Curves are resampled onto a common grid
(linear interpolation) over the range that every pooled run covers.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import app, flags

from experiments import _cli
from podracer.metrics import read_records

METRICS = ("episode_return", "eval_return")
X_AXES = (("env_steps", "environment steps"), ("wall_time", "wall time (s)"))


@dataclasses.dataclass
class Run:
    label: str
    records: list[dict[str, Any]]


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def load_runs(workdir: str, label: str | None = None) -> list[Run]:
    """The runs in `workdir` (one, or a sweep's), labelled as the module docstring says."""
    label = label or os.path.basename(os.path.normpath(workdir))
    run_dirs = sorted(
        (d for d in os.listdir(workdir) if d.startswith("run_") and d[4:].isdigit()),
        key=lambda d: int(d[4:]),
    ) if os.path.isdir(workdir) else []
    if not run_dirs:
        records = read_records(workdir)
        if not records:
            raise FileNotFoundError(f"No metrics.jsonl records in {workdir}.")
        return [Run(label, records)]
    swept = list(_read_json(os.path.join(workdir, "config.json"))
                 .get("sweep", {}).get("agent", {}))
    runs = []
    for run_dir in run_dirs:
        path = os.path.join(workdir, run_dir)
        agent = _read_json(os.path.join(path, "config.json")).get("agent", {})
        hparams = ", ".join(f"{k}={agent[k]:g}" for k in swept if k in agent)
        runs.append(Run(f"{label} ({hparams})" if hparams else label, read_records(path)))
    return runs


def aggregate(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray],
              num_points: int = 200) -> tuple[np.ndarray, ...]:
    """(grid, mean, low, high) of curves `ys[i](xs[i])` on a common grid.

    The grid spans the x range that every curve covers; with one curve it is that curve's own
    points. Each curve is linearly interpolated onto it.
    """
    if len(xs) == 1:
        return xs[0], ys[0], ys[0], ys[0]
    start = max(float(x[0]) for x in xs)
    stop = min(float(x[-1]) for x in xs)
    if stop <= start:  # no overlap: fall back to the first curve alone
        return xs[0], ys[0], ys[0], ys[0]
    grid = np.linspace(start, stop, num_points)
    stacked = np.stack([np.interp(grid, x, y) for x, y in zip(xs, ys)])
    return grid, stacked.mean(0), stacked.min(0), stacked.max(0)


def _series(records: list[dict[str, Any]], x_key: str, y_key: str) -> tuple[np.ndarray, ...]:
    points = [(r[x_key], r[y_key]) for r in records
              if isinstance(r.get(x_key), (int, float)) and isinstance(r.get(y_key), (int, float))]
    if not points:
        return np.zeros(0), np.zeros(0)
    x, y = np.asarray(points, np.float64).T
    order = np.argsort(x, kind="stable")
    return x[order], y[order]


def plot_curves(runs: Sequence[Run], out: str, *, title: str | None = None) -> str:
    """Draws the pooled curves of `runs` into the image file `out` and returns its path."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(run.label for run in runs))
    metrics = [m for m in METRICS if any(_series(r.records, "env_steps", m)[0].size
                                         for r in runs)]
    if not metrics:
        raise ValueError(f"None of {METRICS} is in the runs' records.")
    fig, axes = plt.subplots(len(metrics), len(X_AXES), squeeze=False,
                             figsize=(6 * len(X_AXES), 3.6 * len(metrics)))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, metric in enumerate(metrics):
        for col, (x_key, x_name) in enumerate(X_AXES):
            ax = axes[row][col]
            for i, label in enumerate(labels):
                series = [_series(r.records, x_key, metric) for r in runs if r.label == label]
                series = [(x, y) for x, y in series if x.size]
                if not series:
                    continue
                grid, mean, low, high = aggregate([x for x, _ in series], [y for _, y in series])
                colour = colours[i % len(colours)]
                n = len(series)
                ax.plot(grid, mean, color=colour,
                        label=f"{label} ({n} runs)" if n > 1 else label)
                if n > 1:
                    ax.fill_between(grid, low, high, color=colour, alpha=0.2, linewidth=0)
            ax.set_xlabel(x_name)
            ax.set_ylabel(metric.replace("_", " "))
            ax.grid(alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize="small")
    fig.suptitle(title or "mean over runs (line), min to max (band)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


_OUT = flags.DEFINE_string("out", "curves.png", "Image file to write (png, pdf, svg).")
_LABELS = flags.DEFINE_list("labels", None, "One label per workdir; equal labels are pooled.")
_TITLE = flags.DEFINE_string("title", None, "Figure title.")


def main(argv: list[str]) -> None:
    workdirs = argv[1:]
    if not workdirs:
        raise app.UsageError("Give one or more workdirs.")
    labels = _LABELS.value or [None] * len(workdirs)
    if len(labels) != len(workdirs):
        raise app.UsageError(f"--labels has {len(labels)} entries for {len(workdirs)} workdirs.")
    try:
        runs = [run for workdir, label in zip(workdirs, labels)
                for run in load_runs(workdir, label)]
    except FileNotFoundError as error:
        raise app.UsageError(str(error)) from None
    path = plot_curves(runs, _OUT.value, title=_TITLE.value)
    print(f"Wrote {path}: {len(runs)} runs in {len({r.label for r in runs})} curves.")


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
