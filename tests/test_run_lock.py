"""The workdir lock (`podracer.session`): one live run per workdir.

A second run on a workdir whose run is alive exits with status 2 before compiling, names the
host and process holding it, and changes nothing — the damage it did before the lock (a live
run's checkpoint moved into `checkpoints.corrupt/`, then a FileNotFoundError) cannot happen. A
lock left by a process that was killed is taken over, and the run says so. A multi-process run
locks once, from process 0, and all of its processes stop when the workdir is held.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import (
    ROOT,
    SMALL_CATCH_STEPS_PER_CHUNK,
    SMALL_CATCH_UPDATES_PER_CHUNK,
    small_catch_config,
    snapshot,
    start_experiment,
    wait_until,
    xla_flags,
)

import anakin
from podracer import distributed
from podracer.metrics import read_records
from podracer.session import LOCK_FILE, WorkdirLock, WorkdirLockedError

UPDATES_PER_CHUNK = SMALL_CATCH_UPDATES_PER_CHUNK
STEPS_PER_CHUNK = SMALL_CATCH_STEPS_PER_CHUNK
HOLD = ("import sys, time\nfrom podracer.session import WorkdirLock\n"
        "WorkdirLock.acquire(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(600)\n")


def _command(workdir: str, total_env_steps: int, *extra: str) -> list[str]:
    return ["-m", "experiments.anakin", "--config=experiments/configs/vtrace_catch.py",
            "--config.num_devices=2", "--config.num_envs=16", "--config.rollout_length=10",
            f"--config.updates_per_chunk={UPDATES_PER_CHUNK}",
            f"--config.total_env_steps={total_env_steps}",
            f"--config.checkpoint_every_updates={UPDATES_PER_CHUNK}",
            "--config.checkpoint_keep=1", "--config.eval_every_updates=0",
            f"--workdir={workdir}", *extra]


def _hold(workdir: str) -> subprocess.Popen:
    """A process holding `workdir`'s lock (as a live run does) until it is killed."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, workdir], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_lock_is_exclusive_and_released_with_its_file(tmp_path):
    workdir = str(tmp_path / "w")
    lock = WorkdirLock.acquire(workdir)  # a missing workdir is made
    assert os.path.isfile(os.path.join(workdir, LOCK_FILE))
    with pytest.raises(WorkdirLockedError, match=rf"process {os.getpid()} on host "):
        WorkdirLock.acquire(workdir)  # flock is per open file: this process's second try too
    lock.release()
    assert not os.path.exists(os.path.join(workdir, LOCK_FILE))
    assert not os.path.exists(workdir)  # made for the lock and left empty: removed with it
    WorkdirLock.acquire(workdir).release()  # free again
    # A workdir that was there before the lock stays, even empty; one the lock made stays
    # once something else is written in it.
    os.makedirs(workdir)
    WorkdirLock.acquire(workdir).release()
    assert os.listdir(workdir) == []
    os.rmdir(workdir)
    lock = WorkdirLock.acquire(workdir)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.write("{}\n")
    lock.release()
    assert os.listdir(workdir) == ["metrics.jsonl"]


def test_a_second_live_run_is_refused_naming_the_first_and_damages_nothing(tmp_path):
    """The reproduction: the same command started twice, the second once the first has written
    a checkpoint (every chunk, one kept: the first is rotating them out)."""
    workdir = str(tmp_path / "w")
    cache = str(tmp_path / "cache")
    first = start_experiment(_command(workdir, 400 * STEPS_PER_CHUNK), cache=cache,
                             num_devices=2)
    try:
        wait_until(first, lambda: len(read_records(workdir)) >= 2, "the first checkpoints")
        second = start_experiment(_command(workdir, 400 * STEPS_PER_CHUNK), cache=cache,
                                  num_devices=2)
        out, err = second.communicate(timeout=300)
        assert second.returncode == 2, err[-3000:]
        assert (f"is in use by a run that is still alive: process {first.pid} on host "
                f"{socket.gethostname()}") in err
        assert "Traceback" not in err
        assert "compiled" not in out  # refused before compiling
        assert not os.path.exists(os.path.join(workdir, "checkpoints.corrupt"))
        assert first.poll() is None  # the first run goes on
        first.send_signal(signal.SIGTERM)  # and stops cleanly, saving a checkpoint
        out, err = first.communicate(timeout=300)
        assert first.returncode == 128 + signal.SIGTERM, err[-3000:]
        assert not os.path.exists(os.path.join(workdir, "checkpoints.corrupt"))
        assert not os.path.exists(os.path.join(workdir, LOCK_FILE))  # released at its end
    finally:
        first.kill()


def test_a_held_workdir_is_left_exactly_as_it_was(tmp_path):
    workdir = str(tmp_path / "w")
    anakin.train(small_catch_config(), workdir)  # a finished run's workdir: checkpoints, records
    holder = _hold(workdir)
    try:
        before = snapshot(workdir)
        with pytest.raises(WorkdirLockedError, match=rf"process {holder.pid} on host "):
            anakin.train(small_catch_config(total_env_steps=8 * STEPS_PER_CHUNK), workdir)
        assert snapshot(workdir) == before
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_run_is_taken_over_and_said_so(tmp_path, capsys):
    workdir = str(tmp_path / "w")
    holder = _hold(workdir)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert os.path.isfile(os.path.join(workdir, LOCK_FILE))  # left behind
    result = anakin.train(small_catch_config(), workdir)
    out = capsys.readouterr().out
    assert (f"Took over the lock on {workdir} left by a run that is no longer running "
            f"(process {holder.pid} on host {socket.gethostname()}") in out
    assert result.final_metrics["env_steps"] == 4 * STEPS_PER_CHUNK
    assert not os.path.exists(os.path.join(workdir, LOCK_FILE))


def test_a_multiprocess_run_on_a_held_workdir_stops_in_every_process(tmp_path):
    workdir = str(tmp_path / "w")
    holder = _hold(workdir)
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = xla_flags(2)
    env[distributed.HEARTBEAT_TIMEOUT] = "5"
    try:
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "experiments.launch", "--num_processes=2",
             "--cpu_devices_per_process=2", "--module=experiments.anakin", "--",
             "--config=experiments/configs/vtrace_catch.py", "--config.num_envs=16",
             "--config.updates_per_chunk=5", "--config.total_env_steps=8000",
             f"--workdir={workdir}"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
        elapsed = time.monotonic() - started
        output = proc.stdout + proc.stderr
        assert proc.returncode != 0, output[-3000:]
        # Process 0 names the holder; process 1 learns of it from process 0, and both stop.
        assert output.count(f"process {holder.pid} on host {socket.gethostname()}") >= 2, \
            output[-3000:]
        assert "process 0 of this run found the workdir locked" in output
        assert "compiled" not in output
        assert os.listdir(workdir) == [LOCK_FILE]
        assert elapsed < 200
    finally:
        holder.kill()
        holder.wait()
