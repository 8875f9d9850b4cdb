"""Sebulba as separate processes: two replicas joined by `jax.distributed` on localhost (CPU
collectives through gloo), stopped by the launcher and resumed, the launcher when one process
fails, and Ctrl-C.

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
from conftest import checkpoint_steps, flat_arrays, wait_until

from podracer.checkpoint import load_arrays
from podracer.metrics import read_records

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
    # Bit for bit: the two processes are replicas of one compiled program on one machine, and
    # every update gives both the same all-reduced gradients.
    for name in first.files:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


def test_a_stopped_two_process_run_saves_one_checkpoint_and_both_resume_from_it(tmp_path):
    # SIGTERM to the launcher (a supervisor's): both processes stop at one update, each saving
    # its shards of that update's checkpoint; the same command again resumes both from it, and
    # they end with identical parameters.
    workdir = str(tmp_path / "run")
    args = ["--num_processes=2", "--cpu_devices_per_process=2", "--", f"--config={CARTPOLE}",
            "--config.actor_device_ids=(0,)", "--config.learner_device_ids=(1,)",
            "--config.envs_per_actor_thread=16", "--config.rollout_length=16",
            "--config.log_every_updates=5", "--config.checkpoint_every_updates=0",
            "--config.eval_every_updates=0", "--config.save_final_params=True",
            f"--workdir={workdir}"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "experiments.launch", *args,
         "--config.total_env_steps=100000000"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    wait_until(launcher, lambda: len(read_records(workdir)) >= 1, "the run's first records")
    launcher.send_signal(signal.SIGTERM)
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 143, err[-3000:]
    assert out.count("Stopped by signal 15 after ") == 1, out[-3000:]  # process 0 prints
    steps = checkpoint_steps(workdir)
    assert len(steps) == 1 and steps[0] >= read_records(workdir)[0]["updates"], steps
    stopped = steps[0]
    # 2 processes x 16 environments x T = 16: 512 env steps an update; 10 more updates.
    rest = _launch([*args, f"--config.total_env_steps={(stopped + 10) * 512}"])
    assert rest.returncode == 0, rest.stdout[-3000:] + rest.stderr[-3000:]
    assert f"Resuming from the checkpoint at update {stopped:,}" in rest.stdout, rest.stdout
    records = read_records(workdir)
    assert records[-1]["updates"] == stopped + 10
    assert records[-1]["env_steps"] == (stopped + 10) * 512
    # The learners went on from the checkpoint's state, on both processes' devices: their
    # update counts and Adam's step counts are the run's, not the 10 updates of this process.
    assert checkpoint_steps(workdir) == [stopped, stopped + 10]
    final, _ = load_arrays(os.path.join(workdir, "checkpoints"))
    counts = {k: v for k, v in flat_arrays(final).items()
              if k == "learner_state/updates" or k.endswith("/count")}
    assert "learner_state/updates" in counts and len(counts) >= 2, sorted(counts)
    for name, count in counts.items():
        np.testing.assert_array_equal(count, [stopped + 10] * 2, err_msg=name)
    first = np.load(os.path.join(workdir, "final_params.process0.npz"))
    second = np.load(os.path.join(workdir, "final_params.process1.npz"))
    assert sorted(first.files) == sorted(second.files) and len(first.files) == 8
    for name in first.files:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


def test_a_failing_process_stops_the_whole_launch(tmp_path):
    # Process 1 fails; process 0 ignores SIGINT and would sleep for 10 minutes, as a process
    # blocked inside a collective waiting for its dead peer would. The launcher must report the
    # failure, stop process 0 (killing it after the grace period) and exit non-zero.
    (tmp_path / "failing_peer.py").write_text(textwrap.dedent("""
        import os
        import signal
        import time

        if os.environ["PODRACER_PROCESS_ID"] == "1":
            time.sleep(0.5)
            raise RuntimeError("boom in process 1")
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        time.sleep(600)
    """))
    start = time.monotonic()
    proc = _launch(["--num_processes=2", "--module=failing_peer", "--grace_s=2"],
                   extra_path=str(tmp_path), timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1
    assert "boom in process 1" in proc.stderr and "Traceback" in proc.stderr
    assert "a process exited with status 1" in proc.stderr
    assert elapsed < 30


def test_ctrl_c_stops_a_run_within_seconds():
    # The run gets Ctrl-C's default disposition, as in a terminal: a suite started in the
    # background by a non-interactive shell ignores SIGINT, and its children would inherit that.
    as_in_a_terminal = ("import runpy, signal, sys\n"
                        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                        "sys.argv[0] = 'experiments.sebulba'\n"
                        "runpy.run_module('experiments.sebulba', run_name='__main__')\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", as_in_a_terminal, f"--config={CARTPOLE}",
         "--config.total_env_steps=1000000000", "--config.log_every_updates=5"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout],
                     daemon=True).start()
    try:
        # Only the stop is timed. Reaching training (imports, compilation) took over 120 s
        # once with both suite workers busy on two cores, so its limit is wide.
        deadline = time.monotonic() + 360
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
        try:
            returncode = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            tail = []
            while not lines.empty():
                tail.append(lines.get())
            raise AssertionError("the run did not stop within 30 s of Ctrl-C; its last "
                                 "output:\n" + "".join(tail[-40:])) from None
        assert time.monotonic() - stopped_at < 15
        # Stopped after the update in flight, as on SIGTERM: 128 + SIGINT.
        assert returncode == 128 + signal.SIGINT
        tail = []
        while not lines.empty():
            tail.append(lines.get())
        assert any(line.startswith("Stopped by signal 2 after ") for line in tail), tail[-20:]
    finally:
        if proc.poll() is None:
            proc.kill()
