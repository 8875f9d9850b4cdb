"""The machine a process runs on, as the runners' sizing rules read it: the host's CPU cores
this process may use, and its devices. The rules themselves (`sebulba.config.derive_sizes`,
`anakin.config.derive_num_envs`) take a `Machine`, so that a test can hand them any machine.
`set_cpu_worker_threads` sizes XLA:CPU's pool of worker threads before JAX's backends start
(a run's `cpu_worker_threads`)."""

from __future__ import annotations

import dataclasses
import os
import platform

import jax
from absl import logging
from jax._src import xla_bridge

# XLA's PjRt runtime sizes XLA:CPU's pool of worker threads (and its client's own pool) from
# this variable when the CPU backend starts; unset, one thread per core the process may use.
CPU_POOL_VARIABLE = "PJRT_NPROC"
_warned: set[int] = set()


@dataclasses.dataclass(frozen=True)
class Machine:
    """What sizes derive from: cores, and the local devices' platform and count."""

    cores: int  # host CPU cores this process may run on
    platform: str  # the local devices' platform: "cpu", "gpu", "tpu", ...
    num_devices: int  # devices local to this process

    @property
    def accelerated(self) -> bool:
        """Whether the devices are accelerators. Simulated CPU devices share the host's cores,
        so on "cpu" every device is the same cores."""
        return self.platform != "cpu"

    def describe(self) -> str:
        """'16 cores, 1 gpu device'."""
        return (f"{self.cores} core{'s' if self.cores != 1 else ''}, {self.num_devices} "
                f"{self.platform} device{'s' if self.num_devices != 1 else ''}")


def host_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity masks on this OS
        return max(1, os.cpu_count() or 1)


def cpu_model() -> str:
    """The CPU's model name as Linux reports it (lscpu's 'Model name'), else the platform's."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def detect() -> Machine:
    """This process's machine."""
    devices = jax.local_devices()
    return Machine(cores=host_cores(), platform=devices[0].platform, num_devices=len(devices))


def set_cpu_worker_threads(worker_threads: int) -> bool:
    """Asks XLA:CPU for a pool of `worker_threads` threads when JAX's backends start (0: XLA's
    own choice, one per core this process may use). The pool runs a compiled program's
    kernels; on a few cores, a program of many small kernels can run faster on one thread than
    with its loop bodies handed between two (docs/benchmarks.md, "XLA:CPU's worker threads").
    XLA keeps at least one thread per CPU device (simulated ones included).

    Returns whether the pool is, or will be, of that size. Once a backend has started its pool
    is fixed: then, unless it was sized so here, a warning is logged (once per size) and False
    returned. The size is set in the process environment, so processes started from this one
    (a local multi-process launch) get it too."""
    if worker_threads == 0:
        return True
    wanted = str(worker_threads)
    if not xla_bridge.backends_are_initialized():
        os.environ[CPU_POOL_VARIABLE] = wanted
        return True
    if os.environ.get(CPU_POOL_VARIABLE) == wanted:
        return True
    if worker_threads not in _warned:
        _warned.add(worker_threads)
        logging.warning(
            "cpu_worker_threads=%d is not applied: JAX's backends started before it was set, "
            "and XLA:CPU's pool keeps the size it started with. Set it in a fresh process "
            "(the command-line runners do), or set %s=%d in the environment before JAX starts.",
            worker_threads, CPU_POOL_VARIABLE, worker_threads)
    return False


def describe_cpu_pool() -> str:
    """'1 XLA:CPU worker thread' (the pool running now, for a run's banner), or '' where /proc
    does not tell."""
    running = xla_cpu_worker_threads()
    if running is None:
        return ""
    return f"{running[0]} XLA:CPU worker thread{'s' if running[0] != 1 else ''}"


def xla_cpu_worker_threads() -> tuple[int, int] | None:
    """This process's XLA:CPU worker threads (named `tf_XLAEigen`): how many, and their
    voluntary context switches so far; None where /proc does not tell (not Linux) or before
    the CPU backend started."""
    count = switches = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as f:
                if "XLAEigen" not in f.read():
                    continue
            count += 1
            with open(f"/proc/self/task/{tid}/status") as f:
                switches += sum(int(line.split()[1]) for line in f
                                if line.startswith("voluntary_ctxt_switches:"))
    except OSError:
        return None
    return (count, switches) if count else None
