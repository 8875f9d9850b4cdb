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
"""

from __future__ import annotations

import os

import jax

COORDINATOR = "PODRACER_COORDINATOR_ADDRESS"
NUM_PROCESSES = "PODRACER_NUM_PROCESSES"
PROCESS_ID = "PODRACER_PROCESS_ID"
AUTO = "PODRACER_DISTRIBUTED"


def launched_as_multiprocess() -> bool:
    """Whether the environment asks this process to join a multi-process run."""
    return bool(os.environ.get(COORDINATOR)) or os.environ.get(AUTO, "") == "auto"


def initialize_from_env() -> bool:
    """Calls `jax.distributed.initialize` if launched as part of a multi-process run.

    Returns True when this process is (now) part of one. Safe to call more than once.
    """
    if not launched_as_multiprocess():
        return False
    if jax.distributed.is_initialized():
        return True
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if os.environ.get(COORDINATOR):
        jax.distributed.initialize(
            coordinator_address=os.environ[COORDINATOR],
            num_processes=int(os.environ[NUM_PROCESSES]),
            process_id=int(os.environ[PROCESS_ID]),
        )
    else:
        jax.distributed.initialize()
    return True
