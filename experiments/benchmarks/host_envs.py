"""Benchmark: Sebulba's host environments (`sebulba.host_env`) against the libraries' own loops,
all on one task, one batch size and the same pre-drawn uniformly random actions, in this run.

    gymnasium vector loop   `gymnasium.make_vec(id, B, "sync")`'s own `step`: the ceiling of
                            Sebulba's in-thread gymnasium path
    sebulba gymnasium       `GymnasiumEnv` (the vector env plus the conversion to `TimeStep`s
                            and the episode statistics), in the actor thread
    sebulba gymnasium, W    the same in W worker processes (`--num_workers`, 0 to skip)
    envpool loop            `envpool.make(task, B, num_threads)`'s own `step`: the ceiling of
                            Sebulba's envpool path
    sebulba envpool         `EnvpoolEnv`, what Sebulba steps for an envpool task id
    sebulba envs_jax        `EnvsJaxEnv`, one jitted, vmapped step on the host CPU device
                            (only where envs_jax has the task, e.g. CartPole-v1)

Steps/s are agent steps (B per call) over `--steps` calls, the best of `--repeats` rounds that
measure each path in turn; "of ceiling" divides a Sebulba path by its library's own loop.

    python -m experiments.benchmarks.host_envs [--task=CartPole-v1] [--num_envs=32]
"""

from __future__ import annotations

import json
import os
import platform
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the envs_jax path steps on the host's CPU

import envpool
import gymnasium
import numpy as np
from absl import app, flags

import envs_jax
from experiments import _cli
from sebulba.envpool_env import EnvpoolEnv
from sebulba.envs_jax_env import EnvsJaxEnv
from sebulba.gymnasium_env import GymnasiumEnv

_TASK = flags.DEFINE_string("task", "CartPole-v1", "A task both gymnasium and envpool know.")
_NUM_ENVS = flags.DEFINE_integer("num_envs", 32, "B: environments in one batch (one actor "
                                 "thread's, Sebulba's default).")
_STEPS = flags.DEFINE_integer("steps", 2000, "Timed batch steps per measurement.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Rounds over every path; the best is kept.")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", 2, "Worker processes for the gymnasium "
                                    "path in processes (0: skip it).")
_NUM_THREADS = flags.DEFINE_integer("num_threads", 1, "envpool C++ threads (Sebulba's "
                                    "default env.num_threads).")


class _GymnasiumLoop:
    def __init__(self, task: str, num_envs: int, seed: int):
        self._env = gymnasium.make_vec(task, num_envs=num_envs, vectorization_mode="sync")
        self._env.reset(seed=seed)

    def step(self, action):
        return self._env.step(action)

    def close(self):
        self._env.close()


class _EnvpoolLoop:
    def __init__(self, task: str, num_envs: int, seed: int, num_threads: int):
        self._env = envpool.make(task, env_type="gymnasium", num_envs=num_envs, seed=seed,
                                 num_threads=num_threads)
        self._env.reset()

    def step(self, action):
        return self._env.step(action)

    def close(self):
        self._env.close()


def _paths(task: str, num_envs: int, num_workers: int, num_threads: int) -> dict:
    """name -> (make() -> an env with step(action), its ceiling's name or None)."""
    paths = {
        "gymnasium vector loop": (lambda: _GymnasiumLoop(task, num_envs, 0), None),
        "sebulba gymnasium": (lambda: _reset(GymnasiumEnv(task, num_envs, seed=0)),
                              "gymnasium vector loop"),
    }
    if num_workers:
        paths[f"sebulba gymnasium, {num_workers} workers"] = (
            lambda: _reset(GymnasiumEnv(task, num_envs, seed=0, num_workers=num_workers)),
            "gymnasium vector loop")
    if task in envpool.list_all_envs():
        paths["envpool loop"] = (lambda: _EnvpoolLoop(task, num_envs, 0, num_threads), None)
        paths["sebulba envpool"] = (
            lambda: _reset(EnvpoolEnv(task, num_envs, seed=0, num_threads=num_threads)),
            "envpool loop")
    if task in envs_jax.registered(adapters=False):
        paths["sebulba envs_jax"] = (lambda: _reset(EnvsJaxEnv(task, num_envs, seed=0)), None)
    return paths


def _reset(env):
    env.reset()
    return env


def _steps_per_second(env, actions: np.ndarray) -> float:
    for action in actions[:20]:  # warm-up (the envs_jax path compiles here)
        env.step(action)
    start = time.perf_counter()
    for action in actions:
        env.step(action)
    return actions.size / (time.perf_counter() - start)


def main(argv):
    del argv
    task, num_envs = _TASK.value, _NUM_ENVS.value
    single = gymnasium.make(task)
    num_actions = int(single.action_space.n)
    single.close()
    actions = np.random.default_rng(0).integers(
        0, num_actions, (_STEPS.value, num_envs)).astype(np.int32)
    paths = _paths(task, num_envs, _NUM_WORKERS.value, _NUM_THREADS.value)
    envs = {name: make() for name, (make, _) in paths.items()}
    best = dict.fromkeys(paths, 0.0)
    try:
        for _ in range(_REPEATS.value):
            for name, env in envs.items():
                best[name] = max(best[name], _steps_per_second(env, actions))
    finally:
        for env in envs.values():
            env.close()

    print(f"{task}, B={num_envs}, {_STEPS.value} steps x best of {_REPEATS.value}; "
          f"gymnasium {gymnasium.__version__}, envpool {envpool.__version__} "
          f"({_NUM_THREADS.value} thread(s)); {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores")
    print(f"{'path':<34} {'steps/s':>12} {'of ceiling':>11}")
    for name, (_, ceiling) in paths.items():
        share = f"{best[name] / best[ceiling]:.0%}" if ceiling else ""
        print(f"{name:<34} {best[name]:>12,.0f} {share:>11}")
    print("RESULT " + json.dumps({"task": task, "num_envs": num_envs,
                                  "steps_per_second": {k: round(v) for k, v in best.items()}}))


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
