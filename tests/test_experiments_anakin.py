"""The absl entry point, run as a researcher runs it: a real subprocess with config flags."""

import json
import os
import subprocess
import sys

from conftest import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "experiments.anakin", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_command_line_run_writes_metrics_and_prints_progress(tmp_path):
    proc = _run(
        "--config=experiments/configs/vtrace_catch.py",
        "--config.seed=3",
        "--config.num_envs=32",
        "--config.rollout_length=20",
        "--config.total_env_steps=64000",
        f"--workdir={tmp_path}",
        env_extra={"XLA_FLAGS": xla_flags(2)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # 32 envs x T=20 x 50 updates = 32,000 env steps per chunk.
    assert [r["env_steps"] for r in records] == [32_000, 64_000]
    for key in ("env_steps", "updates", "episode_return", "steps_per_second", "wall_time"):
        assert key in records[-1]
    assert "2 device(s)" in proc.stdout
    assert "env_steps=64,000" in proc.stdout
    assert "final mean episode return" in proc.stdout


def test_bad_flag_value_exits_non_zero_naming_the_field(tmp_path):
    proc = _run("--config=experiments/configs/vtrace_catch.py", "--config.num_envs=7",
                f"--workdir={tmp_path}",
                env_extra={"XLA_FLAGS": xla_flags(2)})
    assert proc.returncode != 0
    assert "config.num_envs" in proc.stderr and "not divisible" in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()
