"""Starts a multi-process run on this machine: N copies of an experiment joined by
`jax.distributed`, with cross-process collectives on the CPU through gloo.

    python -m experiments.launch --num_processes=2 -- \
        --config=experiments/configs/sebulba_vtrace_cartpole.py --workdir=/tmp/run

Everything after `--` is passed to the experiment module (`--module`, default
`experiments.sebulba`; `--module=experiments.anakin` for Anakin). Each process gets PODRACER_COORDINATOR_ADDRESS, PODRACER_NUM_PROCESSES
and PODRACER_PROCESS_ID (see `podracer.distributed`). If any process fails, the others are
stopped and the launcher exits with the failed process's status. Ctrl-C or SIGTERM stops every process
after its step in flight, each saving its checkpoint, and the launcher then exits with 130 or
143; a second Ctrl-C kills them.
On a TPU slice or GPU cluster, start the same experiment command on every host instead (see
docs/sebulba.md); a process lost there ends the others through `podracer.distributed`'s
watchdog, with no launcher needed.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time

from absl import app, flags

from experiments import _cli
from podracer import distributed

_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 2, "Processes to start.", lower_bound=1)
_MODULE = flags.DEFINE_string("module", "experiments.sebulba", "Experiment module to run.")
_PORT = flags.DEFINE_integer("port", 0, "Coordinator port on 127.0.0.1; 0 picks a free one.",
                             lower_bound=0, upper_bound=65535)
_CPU_DEVICES = flags.DEFINE_integer(
    "cpu_devices_per_process", 0,
    "Simulated CPU devices in each process (sets --xla_force_host_platform_device_count); "
    "0 leaves XLA_FLAGS as it is.", lower_bound=0)
_GRACE_S = flags.DEFINE_float("grace_s", 10.0,
                              "Seconds the others get to stop after one process fails.",
                              lower_bound=0.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_env(process_id: int, num_processes: int, port: int, cpu_devices: int) -> dict:
    env = dict(os.environ)
    env[distributed.COORDINATOR] = f"127.0.0.1:{port}"
    env[distributed.NUM_PROCESSES] = str(num_processes)
    env[distributed.PROCESS_ID] = str(process_id)
    if cpu_devices:
        flags_ = [f for f in env.get("XLA_FLAGS", "").split()
                  if not f.startswith("--xla_force_host_platform_device_count")]
        flags_.append(f"--xla_force_host_platform_device_count={cpu_devices}")
        env["XLA_FLAGS"] = " ".join(flags_)
        env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _stop_all(procs: list[subprocess.Popen], grace_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class _Terminated(Exception):
    """SIGTERM reached the launcher."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated


# How a process that stopped as asked exits: done already, or stopped by SIGTERM or Ctrl-C
# after its checkpoint (143, 130), or by the signal itself.
_STOPPED = {0, 128 + signal.SIGTERM, 128 + signal.SIGINT, -signal.SIGTERM, -signal.SIGINT}


def _stop_and_save(procs: list[subprocess.Popen], signum: int) -> int:
    """Every process stops as one that received `signum` does, after the step in flight with
    a checkpoint: each is sent SIGTERM (Ctrl-C at a terminal reached them all already, and a
    second SIGINT would stop them at once, without one), and the launcher waits for them; a
    second Ctrl-C kills them. Returns 128 + `signum`, or, when a process failed while it
    stopped (its checkpoint may be missing), that process's status, naming it."""
    print("launch: stopping every process after its step in flight (Ctrl-C again to kill "
          "them)", file=sys.stderr, flush=True)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    try:
        for p in procs:
            while True:
                try:
                    p.wait()
                    break
                except _Terminated:  # SIGTERM again: they are stopping already
                    continue
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        return 128 + signum
    failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode not in _STOPPED]
    for i, status in failed:
        print(f"launch: process {i} exited with status {status} while stopping (see its "
              "output above): its checkpoint may be missing", file=sys.stderr, flush=True)
    if failed:
        status = failed[0][1]
        return status if status > 0 else 128 - status
    return 128 + signum


def launch(module: str, args: list[str], num_processes: int, *, port: int = 0,
           cpu_devices_per_process: int = 0, grace_s: float = 10.0) -> int:
    """Runs `python -m module args...` in `num_processes` joined processes; returns the exit
    status (0 if all succeeded, else the first failure's). Ctrl-C or SIGTERM stops them all as
    SIGTERM stops one run (checkpoint saved), and returns 130 or 143."""
    port = port or _free_port()
    procs = [
        subprocess.Popen([sys.executable, "-m", module, *args],
                         env=_child_env(i, num_processes, port, cpu_devices_per_process))
        for i in range(num_processes)
    ]
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                print(f"launch: a process exited with status {failed[0]}; stopping the others",
                      file=sys.stderr, flush=True)
                _stop_all(procs, grace_s)
                return failed[0]
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.1)
    except KeyboardInterrupt:
        return _stop_and_save(procs, signal.SIGINT)
    except _Terminated:
        return _stop_and_save(procs, signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str]) -> None:
    if importlib.util.find_spec(_MODULE.value) is None:
        print(f"error: --module={_MODULE.value}: no such module. Fix: name an experiment module, "
              "e.g. experiments.anakin or experiments.sebulba", file=sys.stderr)
        sys.exit(2)
    sys.exit(launch(_MODULE.value, argv[1:], _NUM_PROCESSES.value, port=_PORT.value,
                    cpu_devices_per_process=_CPU_DEVICES.value, grace_s=_GRACE_S.value))


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
