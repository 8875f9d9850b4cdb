"""experiments.plot: pooling runs into mean-and-range curves, and the command writing a PNG."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_run(workdir, returns, *, seconds_per_record=2.0, evals=None, config=None):
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        for i, value in enumerate(returns):
            record = {"env_steps": (i + 1) * 1000, "updates": (i + 1) * 10,
                      "episode_return": value, "wall_time": (i + 1) * seconds_per_record}
            if evals is not None and evals[i] is not None:
                record["eval_return"] = evals[i]
            f.write(json.dumps(record) + "\n")
    if config is not None:
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump(config, f)


def test_aggregate_is_mean_min_and_max_over_the_common_range():
    xs = [np.array([0.0, 10.0, 20.0]), np.array([5.0, 15.0, 25.0])]
    ys = [np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 1.0])]
    grid, mean, low, high = plot.aggregate(xs, ys, num_points=4)
    # The common range is [5, 20]; the first curve there is x / 10.
    np.testing.assert_allclose(grid, [5, 10, 15, 20])
    np.testing.assert_allclose(mean, [0.75, 1.0, 1.25, 1.5])
    np.testing.assert_allclose(low, [0.5, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(high, [1.0, 1.0, 1.5, 2.0])


def test_sweep_runs_are_labelled_by_their_swept_hyperparameters(tmp_path):
    sweep = tmp_path / "lr_sweep"
    _write_run(str(sweep), [0.0])
    os.remove(sweep / "metrics.jsonl")  # a sweep's metrics live in its run directories
    (sweep / "config.json").write_text(json.dumps(
        {"sweep": {"seeds": [0, 1, 0, 1], "agent": {"learning_rate": [1e-3, 1e-3, 3e-4, 3e-4]}}}))
    for i, lr in enumerate([1e-3, 1e-3, 3e-4, 3e-4]):
        _write_run(str(sweep / f"run_{i}"), [0.1 * i, 0.2 * i],
                   config={"seed": i % 2, "agent": {"learning_rate": lr}})
    runs = plot.load_runs(str(sweep))
    assert [r.label for r in runs] == ["lr_sweep (learning_rate=0.001)"] * 2 + \
        ["lr_sweep (learning_rate=0.0003)"] * 2
    assert runs[3].records[-1]["episode_return"] == 0.2 * 3


def test_command_writes_a_png_of_pooled_curves(tmp_path):
    rng = np.random.default_rng(0)
    dirs = []
    for name, label in (("a_seed0", "a"), ("a_seed1", "a"), ("b_seed0", "b")):
        returns = np.tanh(np.linspace(0, 3, 20)) + 0.05 * rng.normal(size=20)
        evals = [float(v) if i % 5 == 4 else None for i, v in enumerate(returns)]
        _write_run(str(tmp_path / name), returns.tolist(), evals=evals,
                   seconds_per_record=1.0 + rng.random())
        dirs.append(str(tmp_path / name))
    out = tmp_path / "figs" / "curves.png"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.plot", *dirs, "--labels=a,a,b", f"--out={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 runs in 2 curves" in proc.stdout
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    import matplotlib.image

    height, width = matplotlib.image.imread(str(out)).shape[:2]
    # Two rows (episode and eval return) by two columns (env steps, wall time).
    assert width > height > 500
    missing = tmp_path / "no_run"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.plot", str(missing), f"--out={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"No metrics.jsonl records in {missing}" in proc.stderr


def test_a_workdir_without_metrics_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="No metrics.jsonl records in"):
        plot.load_runs(str(tmp_path))
