"""Sebulba as separate processes: two replicas joined by `jax.distributed` on localhost (CPU
collectives through gloo), a failure in one of them, and Ctrl-C.

Each process steps its own environments (seeded by process index), so their parameters can
only end identical if every update averaged gradients over the learner devices of both.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE = os.path.join(ROOT, "experiments", "configs", "sebulba_vtrace_cartpole.py")


def _env(extra_path: str | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, ROOT, env.get("PYTHONPATH"))
                                        if p)
    return env


def _launch(args: list[str], extra_path: str | None = None, timeout: float = 240):
    return subprocess.run([sys.executable, "-m", "experiments.launch", *args], cwd=ROOT,
                          env=_env(extra_path), capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_two_processes_end_with_identical_params(tmp_path):
    workdir = str(tmp_path / "run")
    proc = _launch([
        "--num_processes=2", "--cpu_devices_per_process=2", "--",
        f"--config={CARTPOLE}", "--config.actor_device_ids=(0,)",
        "--config.learner_device_ids=(1,)", "--config.envs_per_actor_thread=16",
        "--config.rollout_length=16", "--config.total_env_steps=10240",  # 20 updates
        "--config.log_every_updates=10", "--config.save_final_params=True",
        f"--workdir={workdir}",
    ])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(os.path.join(workdir, "run_info.json")) as f:
        info = json.load(f)
    assert info["num_processes"] == 2 and len(info["learner_devices"]) == 2
    assert info["num_updates"] == 20
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert records[-1]["updates"] == 20 and records[-1]["env_steps"] == 10240
    first = np.load(os.path.join(workdir, "final_params.process0.npz"))
    second = np.load(os.path.join(workdir, "final_params.process1.npz"))
    assert sorted(first.files) == sorted(second.files) and len(first.files) == 8
    for name in first.files:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


def test_a_failing_process_stops_the_whole_launch(tmp_path):
    (tmp_path / "crashing_experiment.py").write_text(textwrap.dedent("""
        import os

        from absl import app

        from experiments import sebulba as experiment
        from sebulba import envpool_env

        if os.environ["PODRACER_PROCESS_ID"] == "1":
            original, calls = envpool_env.EnvpoolEnv.step, [0]

            def step(self, action):
                calls[0] += 1
                if calls[0] == 30:
                    raise RuntimeError("boom in process 1")
                return original(self, action)

            envpool_env.EnvpoolEnv.step = step

        if __name__ == "__main__":
            app.run(experiment.main)
    """))
    start = time.monotonic()
    proc = _launch([
        "--num_processes=2", "--cpu_devices_per_process=2", "--module=crashing_experiment",
        "--grace_s=5", "--", f"--config={CARTPOLE}", "--config.actor_device_ids=(0,)",
        "--config.learner_device_ids=(1,)", "--config.total_env_steps=1000000000",
    ], extra_path=str(tmp_path))
    elapsed = time.monotonic() - start
    assert proc.returncode not in (0, None)
    assert "boom in process 1" in proc.stderr and "Traceback" in proc.stderr
    assert "a process exited with status" in proc.stderr
    assert elapsed < 180  # a budget of 1e9 steps: only the failure can have ended it


def test_ctrl_c_stops_a_run_within_seconds():
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.sebulba", f"--config={CARTPOLE}",
         "--config.total_env_steps=1000000000", "--config.log_every_updates=5"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout],
                     daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until it is training
            try:
                if lines.get(timeout=1).startswith("env_steps="):
                    break
            except queue.Empty:
                pass
        else:
            raise AssertionError("the run never logged progress")
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        returncode = proc.wait(timeout=30)
        assert time.monotonic() - stopped_at < 15
        assert returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
