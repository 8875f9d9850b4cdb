"""Multi-process start-up: joins this process to a `jax.distributed` run when launched as one.

A launcher (`experiments/launch.py` on one machine, a cluster scheduler elsewhere) marks a
process as part of a multi-process run through environment variables; runners call
`initialize_from_env()` before they touch any device, and it is a no-op otherwise:

    PODRACER_COORDINATOR_ADDRESS  host:port of process 0's coordinator
    PODRACER_NUM_PROCESSES        how many processes take part
    PODRACER_PROCESS_ID           this process's index, 0 .. N-1
    PODRACER_DISTRIBUTED=auto     instead of the three above: let JAX detect the cluster
                                  (Cloud TPU slices, SLURM, Open MPI)

On CPU the cross-process collectives go through gloo, which must be chosen before the backend
starts; accelerators use their own interconnect and ignore that setting.

A lost peer ends the run, everywhere, promptly: nothing else will (a cluster scheduler does
not kill a job's survivors for you). The coordination service marks a process dead after
`PODRACER_HEARTBEAT_TIMEOUT_S` seconds without a heartbeat (default 20; JAX's own default is
100), and a watchdog thread in every process then prints which process was lost and exits with
status `LOST_PEER_STATUS`. If process 0, which hosts the coordination service, is the one lost,
the others find the service gone within seconds and exit non-zero naming the "leader task".

A peer's death can also end a survivor before the watchdog has looked: gloo, on CPU, may throw
from its own network thread when a peer's socket closes, and a C++ exception that no code
catches ends the process at once (`std::terminate`, SIGABRT) with a message about a socket.
While the watchdog runs, a terminate handler holds such a process for as long as the watchdog
needs to name the lost peer (JAX's own error polling, which learns of the lost heartbeat at the
same moment, sometimes aborts the process first with its own message naming the task); if no
peer was lost, the original handler then reports the exception and aborts.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import sys
import threading
import time
from typing import Any

import jax

COORDINATOR = "PODRACER_COORDINATOR_ADDRESS"
NUM_PROCESSES = "PODRACER_NUM_PROCESSES"
PROCESS_ID = "PODRACER_PROCESS_ID"
AUTO = "PODRACER_DISTRIBUTED"
HEARTBEAT_TIMEOUT = "PODRACER_HEARTBEAT_TIMEOUT_S"
DEFAULT_HEARTBEAT_TIMEOUT_S = 20
LOST_PEER_STATUS = 75  # a process of the run stopped answering: rerun the whole run
_WATCH_EVERY_S = 1.0


class LaunchError(ValueError):
    """The PODRACER_* variables ask for a multi-process run that cannot be the one meant (a
    variable missing or malformed): the message names the variable and the fix."""


def _whole_number(name: str, *, least: int) -> int:
    text = os.environ[name]
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < least:
        raise LaunchError(f"{name}={text!r}: must be a whole number >= {least}. Fix: set it, "
                          "or unset the PODRACER_* variables for a single-process run")
    return value


def check_environment() -> dict[str, Any] | None:
    """The multi-process settings the PODRACER_* variables ask for: None for a single-process
    run (none set), {} for `PODRACER_DISTRIBUTED=auto`, else the coordinator, process count and
    this process's index. Raises `LaunchError` for a set that cannot be meant: one of the three
    without the others (each process would run a run of its own), a value that is not a
    number or is out of range, a coordinator without a port, `PODRACER_DISTRIBUTED` other
    than "auto", or both ways at once."""
    given = [name for name in (COORDINATOR, NUM_PROCESSES, PROCESS_ID) if os.environ.get(name)]
    auto = os.environ.get(AUTO, "")
    if auto not in ("", "auto"):
        raise LaunchError(f"{AUTO}={auto!r}: the only value is 'auto' (JAX detects the "
                          f"cluster). Fix: set it to auto, or unset it and set {COORDINATOR}, "
                          f"{NUM_PROCESSES} and {PROCESS_ID}")
    if os.environ.get(HEARTBEAT_TIMEOUT):
        _whole_number(HEARTBEAT_TIMEOUT, least=1)
    if auto and given:
        raise LaunchError(f"{AUTO}=auto and {', '.join(given)} are both set. Fix: use one way: "
                          "auto, or the three variables")
    if auto:
        return {}
    if not given:
        return None
    missing = [name for name in (COORDINATOR, NUM_PROCESSES, PROCESS_ID) if name not in given]
    if missing:
        raise LaunchError(f"{', '.join(given)} set but not {', '.join(missing)}: every "
                          "process would run a run of its own. Fix: set all three (or "
                          f"{AUTO}=auto), or none for a single-process run")
    address = os.environ[COORDINATOR]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(f"{COORDINATOR}={address!r}: must be host:port, e.g. host0:1234. "
                          "Fix: give process 0's host and a free port")
    num_processes = _whole_number(NUM_PROCESSES, least=1)
    process_id = _whole_number(PROCESS_ID, least=0)
    if process_id >= num_processes:
        raise LaunchError(f"{PROCESS_ID}={process_id} with {NUM_PROCESSES}={num_processes}: "
                          f"processes are numbered 0 to {num_processes - 1}. Fix: give each "
                          "process its own index in that range")
    return {"coordinator_address": address, "num_processes": num_processes,
            "process_id": process_id}


def initialize_from_env() -> bool:
    """Calls `jax.distributed.initialize` if launched as part of a multi-process run.

    Returns True when this process is (now) part of one. Safe to call more than once. Raises
    `LaunchError`, before touching JAX, when the PODRACER_* variables are set wrongly.
    """
    settings = check_environment()
    if settings is None:
        return False
    if jax.distributed.is_initialized():
        return True
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    heartbeat_s = int(os.environ.get(HEARTBEAT_TIMEOUT) or DEFAULT_HEARTBEAT_TIMEOUT_S)
    timeouts = {"heartbeat_timeout_seconds": heartbeat_s,
                "shutdown_timeout_seconds": max(heartbeat_s, 10)}
    if settings:
        jax.distributed.initialize(**settings, **timeouts)
    else:
        jax.distributed.initialize(**timeouts)
    if jax.process_count() > 1:
        _start_watchdog(heartbeat_s)
        _hold_on_terminate(heartbeat_s + 3 * _WATCH_EVERY_S)
    return True


_watchdog_heartbeat_s: float | None = None


def wait_for_watchdog() -> None:
    """Blocks for as long as the watchdog may take to notice a lost peer (it then ends the
    process, naming it); returns at once when no watchdog runs. Called by a process that is
    failing, so that a failure caused by a dead peer is reported as such."""
    if _watchdog_heartbeat_s is not None:
        time.sleep(_watchdog_heartbeat_s + 3 * _WATCH_EVERY_S)


def _start_watchdog(heartbeat_s: int) -> None:
    """A daemon thread that ends this process when a peer is lost (see the module docstring).

    A process blocked in a collective with a dead peer may never return to Python, so the
    watchdog does not rely on the main program noticing: it reports and leaves at once.
    """
    from jax._src import distributed as jax_distributed  # the client JAX itself uses

    client = jax_distributed.global_state.client
    me, count = jax.process_index(), jax.process_count()
    address = os.environ.get(COORDINATOR, "the coordinator")

    stopping = threading.Event()
    # Registered after jax.distributed's own exit handler, so it runs first: a process on its
    # way out (its peers then leave the service too) is not a lost peer.
    atexit.register(stopping.set)

    def leave(message: str) -> None:
        if stopping.is_set():
            return
        print(f"podracer: process {me} of {count}: {message}; stopping this process "
              f"(status {LOST_PEER_STATUS}).", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(LOST_PEER_STATUS)

    def watch() -> None:
        while not stopping.is_set():
            time.sleep(_WATCH_EVERY_S)
            try:
                live = client.get_live_nodes(list(range(count)))
            except Exception as error:  # noqa: BLE001 - any failure means the service is gone
                leave(f"lost the coordination service (process 0, at {address}): "
                      f"{type(error).__name__}: {str(error).splitlines()[0][:200]}")
                return
            lost = sorted(set(range(count)) - set(live))
            if lost:
                names = ", ".join(f"process {p}" for p in lost)
                leave(f"lost {names} (no heartbeat for {heartbeat_s}s)")

    global _watchdog_heartbeat_s
    _watchdog_heartbeat_s = heartbeat_s
    threading.Thread(target=watch, name="podracer-peer-watchdog", daemon=True).start()


_TERMINATE_HANDLER = ctypes.CFUNCTYPE(None)
_held_terminate: tuple[Any, Any] | None = None  # (our handler, the one it replaced)


def _libstdcxx() -> ctypes.CDLL | None:
    """The C++ runtime jaxlib's collectives run on, or None where it cannot be loaded."""
    name = ctypes.util.find_library("stdc++")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        lib._ZSt13set_terminatePFvvE  # noqa: B018 - std::set_terminate, Itanium C++ ABI
    except (OSError, AttributeError):
        return None
    return lib


def _hold_on_terminate(wait_s: float) -> bool:
    """Makes `std::terminate` (a C++ exception nobody caught, in any thread) wait `wait_s`
    seconds for the watchdog before the handler it replaces runs (which prints the exception
    and aborts). Returns whether the handler is in place (a no-op where the C++ runtime is
    not libstdc++ or cannot be loaded; the process then aborts at once, as without it)."""
    global _held_terminate
    if _held_terminate is not None:
        return True
    lib = _libstdcxx()
    if lib is None:
        return False
    set_terminate = lib._ZSt13set_terminatePFvvE
    set_terminate.restype = ctypes.c_void_p
    set_terminate.argtypes = [_TERMINATE_HANDLER]
    me = jax.process_index()

    def hold() -> None:
        print(f"podracer: process {me}: a C++ exception was not caught (in a collective, "
              f"often because a peer died); waiting {wait_s:.0f}s for the peer watchdog "
              "before aborting.", file=sys.stderr, flush=True)
        time.sleep(wait_s)  # the watchdog ends the process here if a peer was lost
        if previous:
            _TERMINATE_HANDLER(previous)()
        os.abort()

    handler = _TERMINATE_HANDLER(hold)
    previous = set_terminate(handler)
    _held_terminate = (handler, previous)  # the C++ runtime keeps a pointer to `handler`
    return True
