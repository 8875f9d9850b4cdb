"""`cpu_worker_threads`: XLA:CPU's pool of worker threads, sized before JAX's backends start
(`podracer.machine.set_cpu_worker_threads`), by a config field both runners read first."""

import logging
import os
import subprocess
import sys

import jax
import pytest
from conftest import ROOT, small_catch_config, xla_flags

import anakin
import sebulba
from experiments.configs import sebulba_vtrace_cartpole
from podracer import machine

# XLA:CPU names its worker threads so; Linux lists a process's threads under /proc.
_COUNT_WORKERS = """
import os
workers = [t for t in os.listdir('/proc/self/task')
           if open(f'/proc/self/task/{t}/comm').read().strip() == 'tf_XLAEigen']
print('workers', len(workers))
"""
_linux = pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                            reason="counts threads from /proc (Linux)")


def _workers_in_a_fresh_process(code: str, printed: str = "") -> int:
    """XLA:CPU's worker threads in a fresh process with one CPU device, after `code`, which
    should print `printed`."""
    env = {k: v for k, v in os.environ.items() if k != machine.CPU_POOL_VARIABLE}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = xla_flags(1)  # one CPU device: XLA keeps a thread per device at least
    out = subprocess.run([sys.executable, "-c", code + _COUNT_WORKERS], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert printed in out.stdout, out.stdout
    return int(out.stdout.split("workers")[-1])


@_linux
@pytest.mark.parametrize("worker_threads", [1, 3])
def test_the_pool_has_the_threads_asked_for_before_the_backend_starts(worker_threads):
    # 3 on a 2-core machine too: the size is what was asked, not the cores.
    assert _workers_in_a_fresh_process(
        "from podracer import machine\n"
        f"assert machine.set_cpu_worker_threads({worker_threads})\n"
        "import jax.numpy as jnp\n"
        "jnp.ones(2).block_until_ready()\n") == worker_threads


@_linux
def test_zero_leaves_xla_its_own_choice_one_thread_per_core():
    assert _workers_in_a_fresh_process(
        "from podracer import machine\n"
        "assert machine.set_cpu_worker_threads(0)\n"
        "import jax.numpy as jnp\n"
        "jnp.ones(2).block_until_ready()\n") == len(os.sched_getaffinity(0))


@_linux
def test_an_anakin_run_in_a_fresh_process_starts_the_pool_its_config_asks_for():
    assert _workers_in_a_fresh_process(
        "import anakin\n"
        "from experiments.configs import vtrace_catch\n"
        "config = vtrace_catch.get_config()\n"
        "config.update(num_devices=1, num_envs=4, rollout_length=4, updates_per_chunk=1,\n"
        "              total_env_steps=32, eval_every_updates=0, cpu_worker_threads=1)\n"
        "anakin.train(config)\n", printed="1 device(s) (cpu, 1 XLA:CPU worker thread)") == 1


@pytest.mark.parametrize("runner, config", [
    (anakin, lambda: small_catch_config(cpu_worker_threads=3)),
    (sebulba, sebulba_vtrace_cartpole.get_config),
])
def test_both_runners_size_the_pool_before_planning(runner, config, monkeypatch):
    class Stop(Exception):
        pass

    asked = []

    def set_cpu_worker_threads(worker_threads):
        asked.append(worker_threads)
        raise Stop

    config = config()
    config.cpu_worker_threads = 3
    monkeypatch.setattr(machine, "set_cpu_worker_threads", set_cpu_worker_threads)
    monkeypatch.setattr(runner.runner, "make_plan",
                        lambda *a, **k: pytest.fail("planned before sizing the pool"))
    with pytest.raises(Stop):
        runner.train(config)
    assert asked == [3]


def test_a_pool_that_already_started_is_kept_and_said_so_once(monkeypatch, caplog):
    jax.devices()  # the backends have started
    monkeypatch.delenv(machine.CPU_POOL_VARIABLE, raising=False)
    monkeypatch.setattr(machine, "_warned", set())
    with caplog.at_level(logging.WARNING):
        assert not machine.set_cpu_worker_threads(5)
        assert not machine.set_cpu_worker_threads(5)
    assert machine.CPU_POOL_VARIABLE not in os.environ
    said = [r.getMessage() for r in caplog.records if "cpu_worker_threads=5" in r.getMessage()]
    assert len(said) == 1 and "not applied" in said[0] and "PJRT_NPROC=5" in said[0]
    assert machine.set_cpu_worker_threads(0)  # XLA's own choice: nothing to apply


@_linux
def test_the_worker_threads_benchmark_times_each_size_in_a_process_of_that_size():
    env = {k: v for k, v in os.environ.items() if k != machine.CPU_POOL_VARIABLE}
    env["XLA_FLAGS"] = xla_flags(1)
    out = subprocess.run(
        [sys.executable, "-m", "experiments.benchmarks.worker_threads", "--configs=vtrace_catch",
         "--sizes=0,1", "--rounds=1", "--seconds=0.05"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    cores = len(os.sched_getaffinity(0))
    assert any(f"XLA default worker thread(s) ({cores} running)" in line for line in lines)
    assert any("1 worker thread(s) (1 running)" in line for line in lines)
    row = next(line for line in lines if line.startswith("| vtrace_catch |"))
    assert row.endswith("| 1 |")  # the config's own value
