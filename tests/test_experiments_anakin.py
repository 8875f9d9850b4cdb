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


def _run_catch(workdir, devices, *args):
    """V-trace on Catch in chunks of 32 envs x T=20 x 50 updates = 32,000 env steps."""
    return _run("--config=experiments/configs/vtrace_catch.py", "--config.num_envs=32",
                "--config.rollout_length=20", *args, f"--workdir={workdir}",
                env_extra={"XLA_FLAGS": xla_flags(devices)})


def test_command_line_run_writes_metrics_and_prints_progress(tmp_path):
    proc = _run_catch(tmp_path, 2, "--config.seed=3", "--config.total_env_steps=64000")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
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
    assert proc.returncode == 2, proc.stderr[-3000:]  # the CLI's refusal, not a crash
    assert "Traceback" not in proc.stderr
    assert "config.num_envs" in proc.stderr and "not divisible" in proc.stderr
    assert "Fix:" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written into the workdir


def test_a_mistyped_override_is_refused_in_one_line_naming_the_field_it_meant(tmp_path):
    workdir = tmp_path / "run"
    proc = _run("--config=experiments/configs/vtrace_catch.py", "--config.total_steps=64000",
                f"--workdir={workdir}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [proc.stderr.strip()]  # one line, no traceback
    assert "--config.total_steps" in proc.stderr and "config.total_env_steps" in proc.stderr
    assert not workdir.exists()


def test_an_agent_field_is_swept_from_the_command_line(tmp_path):
    proc = _run_catch(tmp_path, 1, "--config.total_env_steps=32000",
                      "--config.sweep.agent.learning_rate=(1e-3, 3e-4)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = json.loads((tmp_path / "config.json").read_text())
    assert recorded["sweep"]["agent"]["learning_rate"] == [1e-3, 3e-4]
    for run in ("run_0", "run_1"):
        records = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["env_steps"] for line in records] == [32_000]
