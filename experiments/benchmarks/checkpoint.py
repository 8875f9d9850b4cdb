"""Benchmark: how long a checkpoint of a large state holds up the thread that saves it.

The state is a replay-buffer-sized array (`--mb`, default 256 MB, random bytes) plus a small
parameter tree, on one device, saved with `Checkpointer(asynchronous=True).save` (`--rounds`
times, each on a fresh directory): the seconds the caller was held ("blocked") and the seconds
until the step is on disk. For a fair "blocked" figure the state is being computed when save is
called: a jitted update of the whole buffer is dispatched just before, as a training step would
be. Then the fingerprint alone (the CRC-32 of every shard, on the host), the peak resident
memory of the process during a save over the state's size, and, for each agent of `--agents`,
its default learner state on Catch (hundreds of small leaves for the search agents): the
seconds of its first save (compiling the copy) and of its fingerprint.

    python -m experiments.benchmarks.checkpoint [--mb=256] [--rounds=3] [--agents=...]
"""

from __future__ import annotations

import os
import platform
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

from experiments import _cli
from podracer.checkpoint import Checkpointer, fingerprint

_MB = flags.DEFINE_integer("mb", 256, "Size of the replay-like array, in MB.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Saves timed.")
_AGENTS = flags.DEFINE_list("agents", ["vtrace", "ppo", "muzero", "efficientzero"],
                            "Agents whose default Catch learner state is saved.")


@jax.jit
def _step(state):
    # A training step's worth of writes to the whole buffer (and the parameters).
    return {"replay": state["replay"] + jnp.uint8(1),
            "params": jax.tree.map(lambda p: p * 0.999, state["params"])}


def _save(directory: str, state) -> tuple[float, float]:
    """(seconds the caller was held, seconds until on disk) of one asynchronous save."""
    checkpointer = Checkpointer(directory, asynchronous=True)
    start = time.perf_counter()
    checkpointer.save(1, state, {})
    blocked = time.perf_counter() - start
    checkpointer.close()
    return blocked, time.perf_counter() - start


class _PeakResident:
    """The process's peak resident memory (MB) while entered, sampled every millisecond."""

    def __enter__(self):
        self.peak, self._stop = 0.0, threading.Event()

        def sample():
            page = os.sysconf("SC_PAGE_SIZE")
            while not self._stop.is_set():
                with open("/proc/self/statm") as f:
                    self.peak = max(self.peak, int(f.read().split()[1]) * page / 2**20)
                time.sleep(0.001)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _agent_states(names: list[str]):
    """(name, its default learner state on Catch) for each agent."""
    import agents
    import envs_jax

    spec = envs_jax.wrap_for_training(envs_jax.make("catch"), None).spec()
    for name in names:
        agent = agents.make(agents.default_config(name), spec)
        yield name, jax.jit(lambda k, a=agent: a.init(k, spec))(jax.random.key(0))


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    rng = np.random.default_rng(0)
    state = {"replay": jnp.asarray(rng.integers(0, 255, _MB.value << 20, dtype=np.uint8)),
             "params": {"w": jnp.ones((256, 256), jnp.float32), "b": jnp.zeros((256,))}}
    state = jax.block_until_ready(_step(state))
    print(f"# checkpoint of {_MB.value} MB + params on 1 x {jax.devices()[0].platform}, "
          f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}); "
          f"jax {jax.__version__}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as root:
        _save(os.path.join(root, "warm"), jax.block_until_ready(_step(state)))  # compiles
        for r in range(_ROUNDS.value):
            state = _step(state)  # in flight when save is called
            results.append(_save(os.path.join(root, str(r)), state))
            print(f"round {r} (load {os.getloadavg()[0]:.1f}): blocked {results[-1][0]:.3f}s, "
                  f"on disk {results[-1][1]:.3f}s", flush=True)
    best = float("inf")
    for _ in range(_ROUNDS.value):
        start = time.perf_counter()
        fingerprint(state)
        best = min(best, time.perf_counter() - start)
    print(f"fingerprint of the state alone: best {best:.3f}s", flush=True)
    if os.path.exists("/proc/self/statm"):
        with tempfile.TemporaryDirectory() as root:
            jax.block_until_ready(state)
            with _PeakResident() as before:
                time.sleep(0.05)
            with _PeakResident() as during:
                _save(os.path.join(root, "peak"), state)
        print(f"save: peak resident memory {during.peak - before.peak:.0f} MB above the "
              f"{before.peak:.0f} MB before it, for a {_MB.value} MB state", flush=True)
    print("\n| save | median s | ceiling |\n|---|---:|---:|")
    print(f"| caller blocked | {np.median([v[0] for v in results]):.3f} | 0 |")
    print(f"| until on disk | {np.median([v[1] for v in results]):.3f} | |")
    if _AGENTS.value:
        print("\n| learner state (Catch, default config) | leaves | first save (compiles the "
              "copy) | fingerprint |\n|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as root:
        for name, learner in _agent_states(_AGENTS.value):
            first = _save(os.path.join(root, name), learner)[1]
            start = time.perf_counter()
            fingerprint(learner)
            print(f"| {name} | {len(jax.tree.leaves(learner))} | {first:.2f} s | "
                  f"{(time.perf_counter() - start) * 1e3:.1f} ms |", flush=True)


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
