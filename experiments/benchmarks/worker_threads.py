"""Benchmark: Anakin experiments with XLA:CPU's pool at each of several sizes, side by side.

XLA:CPU runs a compiled program's kernels on a pool of worker threads sized when JAX's backend
starts (a run's `cpu_worker_threads`, `podracer.machine.set_cpu_worker_threads`). Which size
pays depends on the program, so this benchmark times each `--configs` config in a fresh process
per pool size (`--sizes`; 0 is XLA's own choice, one thread per core), in alternating rounds
(`--rounds`: every size once per round, the order reversed each round). A child process runs
`anakin.train` of the config once for one chunk (compiling it, and timing a first estimate),
then twice for about `--seconds` each, and reports the environment steps per second of those
two runs, compilation excluded; the figure is the median over rounds and runs, printed next to
XLA's own choice measured in the same rounds (the reference: nothing else bounds it).

    python -m experiments.benchmarks.worker_threads [--configs=vtrace_catch,dqn_catch] \
        [--sizes=0,1] [--rounds=2] [--seconds=6]
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys

from absl import app, flags

import anakin
from anakin.config import CPU_NUM_ENVS
from experiments import _cli
from podracer import machine

# The repository root, where a child process runs `python -m` from.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_DEFAULT_CONFIGS = ["vtrace_catch", "vtrace_cartpole", "vtrace_acrobot", "vtrace_minatar",
                    "ppo_cartpole", "ppo_pendulum", "dqn_catch", "dqn_cartpole",
                    "pqn_cartpole", "pqn_minatar", "muzero_catch", "efficientzero_catch"]
_CONFIGS = flags.DEFINE_list("configs", _DEFAULT_CONFIGS,
                             "Anakin configs in experiments/configs/, without '.py'.")
_SIZES = flags.DEFINE_list("sizes", ["0", "1"], "Pool sizes to compare; 0: XLA's own choice.")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Rounds; each runs every size once per config.")
_SECONDS = flags.DEFINE_float("seconds", 6.0, "About how long each timed run lasts.")
_CHILD = flags.DEFINE_string("child", None, "Internal: time this config in this process.")


def _load(name: str):
    return importlib.import_module(f"experiments.configs.{name}").get_config()


def time_config(name: str, worker_threads: int, seconds: float) -> dict:
    """Environment steps per second of two runs of config `name` of about `seconds` each, in
    this process, with XLA:CPU's pool at `worker_threads` (its backends must not have started)."""
    config = _load(name)
    config.cpu_worker_threads = worker_threads
    config.eval_every_updates = 0
    num_envs = config.num_envs or CPU_NUM_ENVS  # 0: derived, on a CPU this many
    chunk = config.updates_per_chunk * num_envs * config.rollout_length
    if not machine.set_cpu_worker_threads(worker_threads):
        raise RuntimeError("JAX's backends started before the pool was sized")

    def run(chunks: int) -> tuple[float, dict]:
        config.total_env_steps = chunks * chunk
        with contextlib.redirect_stdout(io.StringIO()):
            result = anakin.train(config)
        return config.total_env_steps / result.run_seconds, result.final_metrics

    estimate, _ = run(1)
    chunks = max(2, round(seconds * estimate / chunk))
    (first, _), (second, final) = run(chunks), run(chunks)
    running = machine.xla_cpu_worker_threads()
    return {"config": name, "worker_threads": worker_threads, "steps_per_second": [first, second],
            "chunks": chunks, "episode_return": float(final.get("episode_return", "nan")),
            "threads_running": running[0] if running else None}


def _child_result(name: str, worker_threads: int, seconds: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k != machine.CPU_POOL_VARIABLE}
    command = [sys.executable, "-m", "experiments.benchmarks.worker_threads", f"--child={name}",
               f"--sizes={worker_threads}", f"--seconds={seconds}"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False,
                         cwd=_ROOT)
    if out.returncode:
        raise RuntimeError(f"{name} at {worker_threads} worker threads failed:\n"
                           f"{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(names: list[str], sizes: list[int], rounds: int, seconds: float) -> tuple[dict, dict]:
    """({config: {size: [steps/s of every run]}}, {config: {size: XLA:CPU worker threads seen
    running, None where not told}}), timed in fresh processes, sizes alternating."""
    figures: dict = {name: {size: [] for size in sizes} for name in names}
    running: dict = {name: {} for name in names}
    for name in names:
        for r in range(rounds):
            for size in (sizes if r % 2 == 0 else sizes[::-1]):
                result = _child_result(name, size, seconds)
                figures[name][size] += result["steps_per_second"]
                running[name][size] = result["threads_running"]
                print(f"  {name}, {size or 'XLA default'} worker thread(s) "
                      f"({result['threads_running']} running): "
                      f"{', '.join(f'{s:,.0f}' for s in result['steps_per_second'])} "
                      f"env steps/s (return {result['episode_return']:.3f})", flush=True)
    return figures, running


def main(argv: list[str]) -> None:
    del argv
    sizes = [int(s) for s in _SIZES.value]
    if _CHILD.value is not None:
        print(json.dumps(time_config(_CHILD.value, sizes[0], _SECONDS.value)))
        return
    if 0 not in sizes:
        sizes = [0, *sizes]
    print(f"{machine.cpu_model()}, {machine.host_cores()} cores; "
          f"python {platform.python_version()}; sizes {sizes} (0: XLA's own choice); "
          f"{_ROUNDS.value} rounds of 2 runs", flush=True)
    figures, _ = run(_CONFIGS.value, sizes, _ROUNDS.value, _SECONDS.value)
    print("\n| config | " + " | ".join(f"{s or 'XLA default'} worker thread(s)" for s in sizes)
          + " | config's cpu_worker_threads |")
    print("|---|" + "---:|" * (len(sizes) + 1))
    for name, by_size in figures.items():
        medians = {size: statistics.median(runs) for size, runs in by_size.items()}
        cells = [f"{medians[0]:,.0f}"] + [
            f"{medians[size]:,.0f} ({medians[size] / medians[0]:.2f}x)" for size in sizes if size]
        print(f"| {name} | " + " | ".join(cells) + f" | {_load(name).cpu_worker_threads} |")


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
