"""`podracer.distributed.check_environment`: the PODRACER_* variables that ask for a
multi-process run are read whole, and a set that cannot be what was meant (a process that would
quietly run a run of its own, a malformed value) is refused before JAX starts, naming the
variable; the entry points exit with status 2, writing nothing."""

import os
import subprocess
import sys

import pytest

from podracer import distributed
from podracer.distributed import (
    AUTO,
    COORDINATOR,
    HEARTBEAT_TIMEOUT,
    NUM_PROCESSES,
    PROCESS_ID,
    LaunchError,
    check_environment,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIABLES = (COORDINATOR, NUM_PROCESSES, PROCESS_ID, AUTO, HEARTBEAT_TIMEOUT)


@pytest.fixture
def env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_


def test_none_set_is_a_single_process_run_and_auto_leaves_it_to_jax(env):
    assert check_environment() is None
    env(PODRACER_HEARTBEAT_TIMEOUT_S="30")
    assert check_environment() is None
    env(PODRACER_DISTRIBUTED="auto")
    assert check_environment() == {}


def test_the_three_variables_give_the_coordinator_count_and_index(env):
    env(PODRACER_COORDINATOR_ADDRESS="host0:1234", PODRACER_NUM_PROCESSES="4",
        PODRACER_PROCESS_ID="3")
    assert check_environment() == {"coordinator_address": "host0:1234", "num_processes": 4,
                                   "process_id": 3}


@pytest.mark.parametrize("values, named", [
    ({NUM_PROCESSES: "2"}, "PODRACER_NUM_PROCESSES set but not PODRACER_COORDINATOR_ADDRESS, "
                           "PODRACER_PROCESS_ID"),
    ({COORDINATOR: "host0:1234", PROCESS_ID: "0"}, "but not PODRACER_NUM_PROCESSES"),
    ({COORDINATOR: "host0", NUM_PROCESSES: "2", PROCESS_ID: "0"},
     "PODRACER_COORDINATOR_ADDRESS='host0': must be host:port"),
    ({COORDINATOR: "host0:1234", NUM_PROCESSES: "two", PROCESS_ID: "0"},
     "PODRACER_NUM_PROCESSES='two': must be a whole number >= 1"),
    ({COORDINATOR: "host0:1234", NUM_PROCESSES: "2", PROCESS_ID: "2"},
     "PODRACER_PROCESS_ID=2 with PODRACER_NUM_PROCESSES=2: processes are numbered 0 to 1"),
    ({COORDINATOR: "host0:1234", NUM_PROCESSES: "2", PROCESS_ID: "-1"},
     "PODRACER_PROCESS_ID='-1': must be a whole number >= 0"),
    ({AUTO: "yes"}, "PODRACER_DISTRIBUTED='yes': the only value is 'auto'"),
    ({AUTO: "auto", NUM_PROCESSES: "2"}, "PODRACER_DISTRIBUTED=auto and PODRACER_NUM_PROCESSES "
                                         "are both set"),
    ({HEARTBEAT_TIMEOUT: "0"}, "PODRACER_HEARTBEAT_TIMEOUT_S='0': must be a whole number >= 1"),
])
def test_a_set_that_cannot_be_meant_is_refused_naming_the_variable(env, values, named):
    env(**values)
    with pytest.raises(LaunchError, match="Fix: ") as caught:
        distributed.initialize_from_env()
    assert named in str(caught.value)


def test_the_entry_point_refuses_it_with_status_2_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.anakin", "--config=experiments/configs/vtrace_catch.py",
         f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        check=False, env=dict(os.environ, PODRACER_NUM_PROCESSES="2",
                              PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: PODRACER_NUM_PROCESSES set but not")
    assert not workdir.exists()
