"""Runs across real local processes joined by `jax.distributed` (CPU collectives via gloo).

Anakin: 2 processes x 2 simulated devices replicate one program over all 4 devices, learn Catch,
end with identical parameters on every device, and match a 1-process x 4-device run to a
stated tolerance; only process 0 writes records; a multi-process run resumes from its own
checkpoint bit-identically.

Faults, for both runners: `kill -9` of one process makes the survivors exit non-zero well
within 60 s with a message naming the lost process, also when the processes were started by
hand (no launcher), as on a cluster.
"""

import ctypes.util
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import checkpoint_steps, flat_arrays, wait_until, xla_flags

import anakin
from experiments.configs import vtrace_catch
from podracer import distributed
from podracer.checkpoint import load_arrays
from podracer.metrics import read_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATCH = ["--config=experiments/configs/vtrace_catch.py", "--config.num_envs=64",
         "--config.rollout_length=20", "--config.updates_per_chunk=50", "--config.checkpoint_every_updates=0",
         "--config.eval_every_updates=0"]
STEPS = 320_000  # 5 chunks of 64 envs x T=20 x 50 updates: enough to learn Catch
HEARTBEAT_S = 5  # the tests' detection time; runs default to 20 s


def _env(process_id=None, num_processes=2, port=None, devices=2) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = xla_flags(devices)
    env[distributed.HEARTBEAT_TIMEOUT] = str(HEARTBEAT_S)
    if process_id is not None:
        env[distributed.COORDINATOR] = f"127.0.0.1:{port}"
        env[distributed.NUM_PROCESSES] = str(num_processes)
        env[distributed.PROCESS_ID] = str(process_id)
    return env


def _launch(args, timeout=300):
    return subprocess.run([sys.executable, "-m", "experiments.launch", "--num_processes=2",
                           "--cpu_devices_per_process=2", "--module=experiments.anakin", "--",
                           *args], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("two_processes"))
    proc = _launch([*CATCH, f"--config.total_env_steps={STEPS}", f"--workdir={workdir}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir, proc


def test_two_processes_run_one_program_and_learn_catch(two_processes):
    workdir, proc = two_processes
    assert "4 device(s) in 2 processes" in proc.stdout
    records = read_records(workdir)
    # Only process 0 writes: one record per chunk, one event file, one config.
    assert [r["updates"] for r in records] == [50, 100, 150, 200, 250]
    assert len(glob.glob(os.path.join(workdir, "events.out.tfevents.*"))) == 1
    assert os.path.exists(os.path.join(workdir, "config.json"))
    assert records[-1]["episode_return"] >= 0.8, records
    # Episode statistics are summed over all 4 devices, i.e. over both processes' envs: 64
    # envs x 20 steps x 50 updates of Catch (an episode and its reset step take 10 steps)
    # end 6,400 episodes a chunk; one process's 32 envs alone could end at most half that.
    assert records[-1]["episodes"] > 3_200


def test_two_processes_end_with_identical_parameters_on_every_device(two_processes):
    workdir, _ = two_processes
    two, two_meta = load_arrays(os.path.join(workdir, "checkpoints"))
    assert two_meta["num_processes"] == 2 and two_meta["num_devices"] == 4
    for name, value in flat_arrays(two["learner_state"]["params"]).items():
        for device in range(1, 4):  # [4 devices, ...]: both processes' devices
            np.testing.assert_array_equal(value[device], value[0], err_msg=name)


def test_two_processes_equal_one_process_with_four_devices(tmp_path):
    short = ["--config.updates_per_chunk=10", "--config.total_env_steps=25600"]  # 20 updates
    workdir = str(tmp_path / "two")
    proc = _launch([*CATCH, *short, f"--workdir={workdir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    two, _ = load_arrays(os.path.join(workdir, "checkpoints"))
    two = flat_arrays(two["learner_state"]["params"])

    config = vtrace_catch.get_config()
    config.num_devices, config.num_envs, config.updates_per_chunk = 4, 64, 10
    config.rollout_length = 20
    config.total_env_steps, config.checkpoint_every_updates = 25_600, 0
    config.eval_every_updates = 0
    one = flat_arrays(jax.device_get(anakin.train(config).state.learner_state.params))
    assert one.keys() == two.keys()
    # The same maths in a different program: the cross-process all-reduce (gloo) may add the
    # devices' gradients in another order than the in-process one, so float32 results can
    # differ in the last bit (~6e-8 relative), which Adam carries on. Over 20 updates they stay
    # near that level (measured on a 2-core AMD EPYC: printed below); 1e-5 is well above it,
    # and 5x below the smallest per-leaf change that another seed makes in the same 20 updates
    # (5e-5 for the least-moved leaf, up to 0.6 for others). Longer runs are not compared: one
    # last-bit difference can eventually flip a sampled action, and the runs then part like
    # two seeds.
    print("max |2 processes - 1 process|:",
          max(float(np.max(np.abs(two[n] - v))) for n, v in one.items()))
    for name, value in one.items():
        np.testing.assert_allclose(two[name], value, rtol=0, atol=1e-5, err_msg=name)


def test_a_two_process_run_resumes_from_its_checkpoint_bit_identically(two_processes,
                                                                       tmp_path):
    reference, _ = two_processes
    workdir = str(tmp_path / "resumed")
    half = _launch([*CATCH, f"--config.total_env_steps={STEPS * 3 // 5}",
                    f"--workdir={workdir}"])
    assert half.returncode == 0, half.stderr[-3000:]
    assert checkpoint_steps(workdir) == [150]
    rest = _launch([*CATCH, f"--config.total_env_steps={STEPS}", f"--workdir={workdir}"])
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert "Resuming from the checkpoint at update 150" in rest.stdout
    expected, _ = load_arrays(os.path.join(reference, "checkpoints"))
    actual, _ = load_arrays(os.path.join(workdir, "checkpoints"))
    # The same compiled program on the same processes and devices: exactly equal.
    for name, value in flat_arrays(expected).items():
        np.testing.assert_array_equal(flat_arrays(actual)[name], value, err_msg=name)


def _by_hand(module_args, workdir, *, devices=2):
    """Two processes started by hand, as on two hosts: no launcher watches them."""
    port = _free_port()
    procs = []
    for process_id in (0, 1):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", *module_args, f"--workdir={workdir}"], cwd=ROOT,
            env=_env(process_id, port=port, devices=devices), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True))
    return procs


def _kill_and_time_survivor(procs, victim, started):
    wait_until(procs[0], started, "the run's first records", timeout=240)
    procs[victim].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    survivor = procs[1 - victim]
    try:
        _, err = survivor.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        survivor.kill()
        raise AssertionError("the survivor was still running 60 s after its peer was killed")
    seconds = time.monotonic() - killed_at
    procs[victim].communicate()
    print(f"survivor of killing process {victim} exited {survivor.returncode} after "
          f"{seconds:.1f}s")
    assert survivor.returncode != 0
    return err, seconds


def _names_lost_process(err: str, k: int) -> bool:
    """Whether the survivor's stderr names process k as lost: our watchdog's words, or JAX's
    own, when its error polling ends the process first (the two race at the heartbeat
    timeout; on a loaded machine either may win)."""
    return (f"lost process {k}" in err
            or f"task {k} heartbeat timeout" in err.lower()
            or re.search(rf"stopped sending heartbeats\):\s*{k}\b", err) is not None)


ANAKIN_LONG = ["experiments.anakin", *CATCH, "--config.total_env_steps=100000000"]


@pytest.mark.parametrize("victim", [1, 0])
def test_anakin_started_by_hand_survivor_exits_naming_the_lost_process(tmp_path, victim):
    workdir = str(tmp_path / "run")
    procs = _by_hand(ANAKIN_LONG, workdir)
    err, seconds = _kill_and_time_survivor(procs, victim,
                                           lambda: len(read_records(workdir)) >= 1)
    assert seconds < 60
    if victim == 1:
        assert _names_lost_process(err, 1), err[-3000:]
    else:
        # Process 0 hosts the coordination service: the survivor finds it gone (our
        # watchdog's words, or JAX's own, which name the "leader task").
        assert ("lost the coordination service (process 0" in err
                or "leader task" in err), err[-3000:]


def test_sebulba_started_by_hand_survivor_exits_naming_the_lost_process(tmp_path):
    workdir = str(tmp_path / "run")
    cartpole = os.path.join(ROOT, "experiments", "configs", "sebulba_vtrace_cartpole.py")
    procs = _by_hand(["experiments.sebulba", f"--config={cartpole}",
                      "--config.actor_device_ids=(0,)", "--config.learner_device_ids=(1,)",
                      "--config.envs_per_actor_thread=16", "--config.rollout_length=16",
                      "--config.log_every_updates=5", "--config.total_env_steps=100000000"],
                     workdir)
    err, seconds = _kill_and_time_survivor(procs, 1, lambda: len(read_records(workdir)) >= 1)
    assert seconds < 60
    assert _names_lost_process(err, 1), err[-3000:]


# A process of a two-process run that, once told on stdin, ends the way gloo's network thread
# ends a survivor when a peer's socket closes: a C++ exception nobody catches, in a thread
# other than the main one (std::terminate). Its main thread waits meanwhile, as the runner's
# does inside a collective.
_TERMINATES = """
import ctypes, ctypes.util, sys, threading, time
from podracer import distributed
assert distributed.initialize_from_env()
print("ready", flush=True)
sys.stdin.readline()
terminate = ctypes.CDLL(ctypes.util.find_library("stdc++"))._ZSt9terminatev
threading.Thread(target=terminate).start()
time.sleep(600)
"""


def _terminate_after(kill_peer: bool):
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", _TERMINATES], cwd=ROOT,
                              env=_env(p, port=port, devices=1), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for p in (0, 1)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-3000:]
    if kill_peer:
        procs[1].kill()
        procs[1].wait()
    started = time.monotonic()
    procs[0].stdin.write("go\n")
    procs[0].stdin.flush()
    try:
        _, err = procs[0].communicate(timeout=60)
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    return procs[0].returncode, err, time.monotonic() - started


@pytest.mark.skipif(ctypes.util.find_library("stdc++") is None, reason="needs libstdc++")
def test_an_uncaught_cpp_exception_after_a_peer_died_names_the_lost_process():
    """The CI failure this guards: a survivor aborted in 0.1 s in gloo's thread
    (`terminate called after throwing an instance of 'gloo::EnforceNotMet'`), before anything
    could say that process 1 was gone. Held for the heartbeat timeout, it names the process:
    our watchdog exits with LOST_PEER_STATUS, or JAX's error polling, which learns of the lost
    heartbeat at the same moment, aborts first with its own message naming the task (both
    outcomes were seen on CI's 2-core machine)."""
    status, err, seconds = _terminate_after(kill_peer=True)
    assert status in (distributed.LOST_PEER_STATUS, -signal.SIGABRT), err[-3000:]
    assert _names_lost_process(err, 1), err[-3000:]
    # Held: the handler it replaced (which prints this and aborts) never ran.
    assert "terminate called" not in err, err[-3000:]
    assert seconds < HEARTBEAT_S + 30


@pytest.mark.skipif(ctypes.util.find_library("stdc++") is None, reason="needs libstdc++")
def test_an_uncaught_cpp_exception_with_every_peer_alive_still_aborts():
    status, err, seconds = _terminate_after(kill_peer=False)
    assert status == -signal.SIGABRT, err[-3000:]
    assert "terminate called without an active exception" in err, err[-3000:]
    assert HEARTBEAT_S <= seconds < HEARTBEAT_S + 30


class _StoppingProcess:
    """A stand-in for a launched process that exits with `status` when sent SIGTERM."""

    def __init__(self, status):
        self.status, self.returncode = status, None

    def poll(self):
        return self.returncode

    def send_signal(self, signum):
        assert signum == signal.SIGTERM
        self.returncode = self.status

    def wait(self):
        return self.returncode


def test_the_launcher_names_a_process_that_failed_while_stopping(capsys):
    from experiments import launch

    # Both stop after their checkpoint (143): the launcher's own status, 128 + the signal.
    procs = [_StoppingProcess(143), _StoppingProcess(143)]
    assert launch._stop_and_save(procs, signal.SIGINT) == 130
    # Process 1 fails as it saves (status 1): its status, and its index, not a clean 130.
    procs = [_StoppingProcess(143), _StoppingProcess(1)]
    assert launch._stop_and_save(procs, signal.SIGINT) == 1
    assert "process 1 exited with status 1 while stopping" in capsys.readouterr().err
    # Killed by a signal other than the stop (-9): 128 + 9.
    assert launch._stop_and_save([_StoppingProcess(-9)], signal.SIGTERM) == 137


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_launcher_stopped_stops_every_process_after_a_checkpoint(tmp_path, signum):
    # Ctrl-C or SIGTERM to the launcher alone (a supervisor's): each process gets SIGTERM,
    # stops at the same update with its shards of one checkpoint saved, and the launcher waits.
    workdir = str(tmp_path / "run")
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import runpy, signal, sys\n"
         "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # as at a terminal
         "sys.argv[0] = 'experiments.launch'\n"
         "runpy.run_module('experiments.launch', run_name='__main__')\n",
         "--num_processes=2", "--cpu_devices_per_process=2", "--module=experiments.anakin",
         "--", *ANAKIN_LONG[1:], "--config.checkpoint_every_updates=0", f"--workdir={workdir}"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(launcher, lambda: len(read_records(workdir)) >= 1, "the run's first records")
    launcher.send_signal(signum)
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 128 + signum, err[-3000:]
    assert out.count("Stopped by signal 15 after ") == 1, out[-3000:]  # process 0 prints
    steps = checkpoint_steps(workdir)
    assert len(steps) == 1 and steps[0] >= read_records(workdir)[0]["updates"], steps


def test_under_the_launcher_a_killed_process_ends_the_run(tmp_path):
    workdir = str(tmp_path / "run")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "experiments.launch", "--num_processes=2",
         "--cpu_devices_per_process=2", "--module=experiments.anakin", "--", *ANAKIN_LONG[1:],
         f"--workdir={workdir}"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    wait_until(launcher, lambda: len(read_records(workdir)) >= 1, "the run's first records")
    with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children") as f:
        children = [int(p) for p in f.read().split()]
    assert len(children) == 2
    os.kill(children[1], signal.SIGKILL)
    killed_at = time.monotonic()
    _, err = launcher.communicate(timeout=60)
    seconds = time.monotonic() - killed_at
    print(f"launcher exited {launcher.returncode} after {seconds:.1f}s")
    assert launcher.returncode != 0 and seconds < 60
    assert "a process exited with status -9; stopping the others" in err, err[-3000:]
