"""Benchmark: the cost of `envs_jax` wrappers and adapters against stepping the library directly.

For each environment, two programs of identical structure (a jitted `lax.scan` over T steps of
a `vmap` over B environments, uniformly random actions drawn the same way) are timed:

- direct: the underlying library's own auto-resetting step: gymnax's `env.step` (which
  resets by itself), pgx's `pgx.experimental.auto_reset(env.step, env.init)`, jumanji's
  `AutoResetWrapper`; for our native environments, the bare environment with the same
  automatic reset, time limit and episode statistics written inline in the loop body;
- envs_jax: `envs_jax.wrap_for_training(envs_jax.make(name))`: the adapter (if any), the
  standard time limit (if any), episode statistics and automatic reset as the runners use it.

Overhead = envs_jax time / direct time - 1 (target <= 10%). Both are measured in the same
process, after compilation, as the best of `--repeats` calls, interleaved in alternating order.
"bare" is the environment's `step` alone with no reset at all (native environments): a lower
bound. On the CPU the speed of one compiled program differs from process to process by up to
±20% (pgx's MinAtar most of all), more than the effect measured, so the measurement is repeated
in `--processes` fresh processes and the medians are printed, with the overhead's range.
The last two columns do not vary: XLA's cost analysis of one compiled vmapped step of each
program (floating-point operations and bytes accessed), envs_jax against direct, telling a
program that does more work from one that merely ran slower in these processes.

    python -m experiments.benchmarks.envs [--envs=catch,CartPole-v1] [--num_envs=1024]
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from absl import app, flags

import envs_jax
from envs_jax import registry
from experiments import _cli

_ENVS = flags.DEFINE_list(
    "envs",
    [
        "catch",
        "CartPole-v1",
        "gymnax:CartPole-v1",
        "gymnax:Breakout-MinAtar",
        "pgx:minatar-breakout",
        "jumanji:Snake-v1",
    ],
    "Environments to measure (adapters whose library is missing are skipped).",
)
_NUM_ENVS = flags.DEFINE_integer("num_envs", 1024, "B: environments in the vmapped batch.")
_NUM_STEPS = flags.DEFINE_integer("num_steps", 100, "T: steps per timed call (one scan).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per program (best is kept).")
_PROCESSES = flags.DEFINE_integer(
    "processes", 3, "Fresh processes that each measure every environment; medians are printed."
)
_RESULT = "RESULT "  # prefix of a child process's machine-readable lines

Carry = Any


def _scan_program(
    init: Callable[[jax.Array], Carry],
    step: Callable[[Carry, jax.Array], Carry],
    num_actions: int,
    num_envs: int,
    num_steps: int,
):
    """init(key) -> batched carry; step(carry, actions[B]) -> carry. Returns (carry0, run)."""

    def run(carry, key):
        def body(carry, key):
            actions = jax.random.randint(key, (num_envs,), 0, num_actions, jnp.int32)
            return step(carry, actions), None

        carry, _ = jax.lax.scan(body, carry, jax.random.split(key, num_steps))
        return carry

    carry = jax.jit(init)(jax.random.PRNGKey(0))
    return carry, jax.jit(run, donate_argnums=0)


def _step_work(
    init: Callable[[jax.Array], Carry], step: Callable[[Carry, jax.Array], Carry], num_envs: int
) -> dict[str, float]:
    """XLA's own count of one compiled vmapped step's work, per environment: floating-point
    operations and bytes read and written. Unlike a timing it is the same in every process,
    so it shows whether a program does more work or only ran slower this time."""
    carry = jax.eval_shape(init, jax.random.PRNGKey(0))
    actions = jax.ShapeDtypeStruct((num_envs,), jnp.int32)
    cost = jax.jit(step).lower(carry, actions).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost  # a list in older JAX releases
    return {
        "flops": float(cost.get("flops", 0.0)) / num_envs,
        "bytes": float(cost.get("bytes accessed", 0.0)) / num_envs,
    }


def _ours(name: str, num_envs: int):
    env = envs_jax.wrap_for_training(envs_jax.make(name))

    def init(key):
        return jax.vmap(env.reset)(jax.random.split(key, num_envs))[0]

    def step(state, actions):
        return jax.vmap(env.step)(state, actions)[0]

    return init, step


def _native_inline(name: str, num_envs: int):
    """The bare environment with automatic reset, time limit and statistics written inline."""
    bare = envs_jax.make(name, max_episode_steps=0)
    limit = registry.default_max_episode_steps(name) or 0

    def reset_one(key):
        count = jnp.zeros((), jnp.uint32)
        state, timestep = bare.reset(jax.random.fold_in(key, count))
        zero_f, zero_i = jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)
        return (state, zero_i, zero_f, zero_i, timestep.last(), key, count)

    def step_one(carry, action):
        state, elapsed, ret, length, needs_reset, key, count = carry
        count = count + 1
        stepped_state, timestep = bare.step(state, action)
        reset_state, _ = bare.reset(jax.random.fold_in(key, count))
        elapsed, ret, length = elapsed + 1, ret + timestep.reward, length + 1
        last = timestep.last() | ((elapsed >= limit) if limit else False)
        zero_f, zero_i = jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)
        pick = lambda a, b: jax.tree.map(lambda x, y: jnp.where(needs_reset, x, y), a, b)
        state = pick(reset_state, stepped_state)
        elapsed, ret, length = pick((zero_i, zero_f, zero_i), (elapsed, ret, length))
        return (state, elapsed, ret, length, jnp.where(needs_reset, False, last), key, count)

    def init(key):
        return jax.vmap(reset_one)(jax.random.split(key, num_envs))

    def step(carry, actions):
        return jax.vmap(step_one)(carry, actions)

    return init, step


def _native_bare(name: str, num_envs: int):
    bare = envs_jax.make(name, max_episode_steps=0)

    def init(key):
        return jax.vmap(bare.reset)(jax.random.split(key, num_envs))[0]

    def step(state, actions):
        return jax.vmap(bare.step)(state, actions)[0]

    return init, step


def _gymnax_direct(name: str, num_envs: int):
    import gymnax

    env, params = gymnax.make(name)

    def init(key):
        keys = jax.random.split(key, num_envs)
        return jax.vmap(lambda k: env.reset(k, params)[1])(keys), keys

    def step(carry, actions):
        state, keys = carry
        split = jax.vmap(jax.random.split)(keys)
        keys, step_keys = split[:, 0], split[:, 1]
        state = jax.vmap(lambda k, s, a: env.step(k, s, a, params)[1])(step_keys, state, actions)
        return state, keys

    return init, step


def _pgx_direct(name: str, num_envs: int):
    import pgx
    from pgx.experimental import auto_reset

    env = pgx.make(name)
    step_fn = auto_reset(env.step, env.init)

    def init(key):
        keys = jax.random.split(key, num_envs)
        return jax.vmap(env.init)(keys), keys

    def step(carry, actions):
        state, keys = carry
        split = jax.vmap(jax.random.split)(keys)
        keys, step_keys = split[:, 0], split[:, 1]
        return jax.vmap(step_fn)(state, actions, step_keys), keys

    return init, step


def _jumanji_direct(name: str, num_envs: int):
    import jumanji
    from jumanji.wrappers import AutoResetWrapper

    env = AutoResetWrapper(jumanji.make(name))

    def init(key):
        return jax.vmap(env.reset)(jax.random.split(key, num_envs))[0]

    def step(state, actions):
        return jax.vmap(env.step)(state, actions)[0]

    return init, step


def _direct(name: str, num_envs: int):
    namespace, sep, library_name = name.partition(":")
    if not sep:
        return _native_inline(name, num_envs)
    return {"gymnax": _gymnax_direct, "pgx": _pgx_direct, "jumanji": _jumanji_direct}[namespace](
        library_name, num_envs
    )


def _time(programs: dict[str, tuple[Carry, Callable]], repeats: int) -> dict[str, float]:
    """Best seconds per call of each program, calls interleaved so load hits all alike."""
    best = {label: float("inf") for label in programs}
    carries = {}
    for label, (carry, run) in programs.items():  # warm up (compilation is not timed)
        carries[label] = jax.block_until_ready(run(carry, jax.random.PRNGKey(1)))
    for i in range(repeats):
        # Alternate the order (ABBA...), so neither program always runs first in a round.
        order = list(programs.items()) if i % 2 == 0 else list(programs.items())[::-1]
        for label, (_, run) in order:
            start = time.perf_counter()
            carries[label] = jax.block_until_ready(run(carries[label], jax.random.PRNGKey(i)))
            best[label] = min(best[label], time.perf_counter() - start)
    return best


def _measure(name: str, num_envs: int, num_steps: int, repeats: int) -> dict[str, float]:
    """Steps per second of each program for one environment, in this process, and under
    "work" the per-environment cost analysis of one step of the direct and envs_jax programs."""
    sep = ":" in name
    num_actions = envs_jax.make(name).action_spec().num_values
    direct, ours = _direct(name, num_envs), _ours(name, num_envs)
    programs = {
        "direct": _scan_program(*direct, num_actions, num_envs, num_steps),
        "ours": _scan_program(*ours, num_actions, num_envs, num_steps),
    }
    if not sep:
        programs["bare"] = _scan_program(
            *_native_bare(name, num_envs), num_actions, num_envs, num_steps
        )
    seconds = _time(programs, repeats)
    rates = {label: num_envs * num_steps / s for label, s in seconds.items()}
    work = {
        label: _step_work(*fns, num_envs) for label, fns in (("direct", direct), ("ours", ours))
    }
    return {**rates, "work": work}


def _child_results(names: list[str]) -> list[dict[str, dict[str, float]]]:
    """Runs this benchmark in `--processes` fresh processes; their rates, per environment."""
    args = [
        f"--envs={','.join(names)}",
        f"--num_envs={_NUM_ENVS.value}",
        f"--num_steps={_NUM_STEPS.value}",
        f"--repeats={_REPEATS.value}",
        "--processes=0",
    ]
    results = []
    for i in range(_PROCESSES.value):
        out = subprocess.run(
            [sys.executable, "-m", "experiments.benchmarks.envs", *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        lines = [line[len(_RESULT) :] for line in out.splitlines() if line.startswith(_RESULT)]
        results.append(json.loads(lines[-1]))
        print(f"  process {i + 1}/{_PROCESSES.value} done", flush=True)
    return results


def main(argv: list[str]) -> None:
    del argv
    num_envs, num_steps = _NUM_ENVS.value, _NUM_STEPS.value
    names = []
    for name in _ENVS.value:
        namespace, sep, _ = name.partition(":")
        if sep and not registry.installed(namespace):
            print(f"{name:28s} skipped: install the '{namespace}' extra")
        else:
            names.append(name)
    if _PROCESSES.value == 0:  # a child: measure, report, nothing else
        rates = {name: _measure(name, num_envs, num_steps, _REPEATS.value) for name in names}
        print(_RESULT + json.dumps(rates), flush=True)
        return
    print(
        f"envs_jax benchmark: B={num_envs} envs x T={num_steps} steps per call, best of "
        f"{_REPEATS.value} calls, median of {_PROCESSES.value} processes; jax {jax.__version__}, "
        f"{jax.devices()[0].platform}, {platform.processor() or platform.machine()}",
        flush=True,
    )
    results = _child_results(names)
    print(
        f"{'environment':28s} {'direct steps/s':>15s} {'envs_jax steps/s':>17s} "
        f"{'overhead':>9s} {'(range)':>17s} {'bare steps/s':>13s} "
        f"{'work: flops':>12s} {'bytes':>7s}"
    )
    for name in names:
        runs = [r[name] for r in results]
        work = runs[0]["work"]
        median = {
            label: statistics.median(r[label] for r in runs) for label in runs[0] if label != "work"
        }
        overheads = sorted(r["direct"] / r["ours"] - 1 for r in runs)
        overhead = statistics.median(overheads)
        spread = f"{overheads[0]:+.1%}..{overheads[-1]:+.1%}"
        bare = f"{median['bare']:13,.0f}" if "bare" in median else f"{'-':>13s}"
        # XLA reports no count for some programs (0): print "-" rather than a made-up ratio.
        extra = {
            key: f"{work['ours'][key] / work['direct'][key] - 1:+.1%}"
            if work["direct"][key]
            else "-"
            for key in ("flops", "bytes")
        }
        print(
            f"{name:28s} {median['direct']:15,.0f} {median['ours']:17,.0f} {overhead:+9.1%} "
            f"{spread:>17s} {bare} {extra['flops']:>12s} {extra['bytes']:>7s}",
            flush=True,
        )


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
