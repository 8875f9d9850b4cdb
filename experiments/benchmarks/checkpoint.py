"""Benchmark: how long a checkpoint of a large state holds up the thread that saves it.

The state is a replay-buffer-sized array (`--mb`, default 256 MB, random bytes) plus a small
parameter tree, on one device. Two ways to save it asynchronously, timed alternately
(`--rounds`), each on a fresh directory:
  host-hash    what `Checkpointer.save` did before: fetch the whole state to the host and hash
               it there (`fingerprint(..., on_device=False)`, blake2b on one thread), then hand
               it to orbax's asynchronous save (which copies it to host memory before returning)
  device       `Checkpointer(asynchronous=True).save`: a copy and the fingerprint dispatched on
               the device; a writer thread does the rest
For each: the seconds the caller was held ("blocked") and the seconds until the step is on disk.
Then the device fingerprint alone in its two schemes ("device:" one value per 32-bit word,
"device2:" narrow values packed into words), and the memory a save needs beyond the state:
the temporaries of the compiled fingerprint, digesting each leaf in slices (now) against
mixing all of a leaf's words at once (what it did before, the reference), and the peak
resident memory of the process while the device save runs, over the state's size.
Last, for each agent of `--agents`, its default learner state on Catch (hundreds of small
leaves for the search agents): the seconds to compile the fingerprint and to compute it, with
the small leaves batched into one reduction (now) against one reduction per leaf (before).
For a fair "blocked" figure the state is being computed when save is called: a jitted update
of the whole buffer is dispatched just before, as a training step would be.

    python -m experiments.benchmarks.checkpoint [--mb=256] [--rounds=3] [--agents=...]
"""

from __future__ import annotations

import os
import platform
import tempfile
import threading
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

from podracer import checkpoint
from podracer.checkpoint import Checkpointer, fingerprint

_MB = flags.DEFINE_integer("mb", 256, "Size of the replay-like array, in MB.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds.")
_AGENTS = flags.DEFINE_list("agents", ["vtrace", "ppo", "muzero", "efficientzero"],
                            "Agents whose default Catch learner state is fingerprinted.")


@jax.jit
def _step(state):
    # A training step's worth of writes to the whole buffer (and the parameters).
    return {"replay": state["replay"] + jnp.uint8(1),
            "params": jax.tree.map(lambda p: p * 0.999, state["params"])}


def _host_hash(directory: str, state) -> tuple[float, float]:
    import orbax.checkpoint as ocp

    start = time.perf_counter()
    meta = {"fingerprint": fingerprint(state, on_device=False)}
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
        enable_async_checkpointing=True), item_names=("state", "meta"))
    manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                            meta=ocp.args.JsonSave(meta)))
    blocked = time.perf_counter() - start
    manager.wait_until_finished()
    manager.close()
    return blocked, time.perf_counter() - start


def _whole_leaf_digest(leaves: list[jax.Array]) -> jax.Array:
    """The "device2:" digest as it was before slicing: every word of a leaf mixed at once
    (the same value; kept here as the reference for its memory)."""
    seeds = jnp.asarray(checkpoint._SEEDS, jnp.uint32)
    total = jnp.zeros((2,), jnp.uint32)
    for i, leaf in enumerate(leaves):
        rows, to_words = checkpoint._word_rows(leaf, True)
        bits = to_words(rows)[:, None]
        position = jnp.arange(bits.shape[0], dtype=jnp.uint32)[:, None]
        lanes = jnp.sum(checkpoint._mix(bits ^ checkpoint._mix(position + seeds)), axis=0,
                        dtype=jnp.uint32)
        layout = zlib.crc32(f"{i}:{leaf.shape}:{leaf.dtype}".encode())
        total = total + checkpoint._mix(lanes ^ jnp.uint32(layout))
    return total


def _agent_states(names: list[str]):
    """(name, leaves of its default learner state on Catch) for each agent."""
    import agents
    import envs_jax

    spec = envs_jax.wrap_for_training(envs_jax.make("catch"), None).spec()
    for name in names:
        agent = agents.make(agents.default_config(name), spec)
        state = jax.jit(lambda k, a=agent: a.init(k, spec))(jax.random.key(0))
        yield name, jax.tree.leaves(state)


def _compile_and_run(fn, leaves) -> tuple[float, float, str]:
    """(seconds to compile, best seconds to compute, the fingerprint) of `fn` on `leaves`."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(leaves).compile()
    compile_s = time.perf_counter() - start
    best = float("inf")
    for _ in range(max(_ROUNDS.value, 3)):
        start = time.perf_counter()
        digest = jax.block_until_ready(compiled(leaves))
        best = min(best, time.perf_counter() - start)
    return compile_s, best, checkpoint._digest_hex(digest)


def _temporaries_mb(fn, leaves) -> float:
    return jax.jit(fn).lower(leaves).compile().memory_analysis().temp_size_in_bytes / 2**20


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


def _device(directory: str, state) -> tuple[float, float]:
    checkpointer = Checkpointer(directory, asynchronous=True)
    start = time.perf_counter()
    checkpointer.save(1, state, {})
    blocked = time.perf_counter() - start
    checkpointer.close()
    return blocked, time.perf_counter() - start


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
    ways = {"host-hash (before)": _host_hash, "device (now)": _device}
    with tempfile.TemporaryDirectory() as root:
        for name, way in ways.items():  # warm-up: compilation, orbax's first use
            way(os.path.join(root, f"warm-{name}"), jax.block_until_ready(_step(state)))
        results = {name: [] for name in ways}
        for r in range(_ROUNDS.value):
            for i, (name, way) in enumerate(ways.items()):
                state = _step(state)  # in flight when save is called
                results[name].append(way(os.path.join(root, f"{r}-{i}"), state))
                jax.block_until_ready(state)
            print(f"round {r} (load {os.getloadavg()[0]:.1f}): " + ", ".join(
                f"{n}: blocked {v[-1][0]:.3f}s, on disk {v[-1][1]:.3f}s"
                for n, v in results.items()), flush=True)
    # The fingerprint alone, per scheme (one value per word, and four uint8 packed per word).
    for scheme in ("device:", "device2:"):
        fingerprint(state, scheme=scheme)  # compiled
        best = float("inf")
        for _ in range(_ROUNDS.value):
            start = time.perf_counter()
            fingerprint(state, scheme=scheme)
            best = min(best, time.perf_counter() - start)
        print(f"fingerprint {scheme} of the state alone: best {best:.3f}s "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
    leaves = jax.tree.leaves(state)
    digests = {"sliced (now)": checkpoint._digest_leaves, "whole leaf (before)": _whole_leaf_digest}
    assert len({checkpoint._digest_hex(jax.jit(f)(leaves)) for f in digests.values()}) == 1
    print("fingerprint temporaries (compiled): " + ", ".join(
        f"{name} {_temporaries_mb(f, leaves):.1f} MB" for name, f in digests.items()), flush=True)
    if os.path.exists("/proc/self/statm"):
        with tempfile.TemporaryDirectory() as root:
            jax.block_until_ready(state)
            with _PeakResident() as before:
                time.sleep(0.05)
            with _PeakResident() as during:
                _device(os.path.join(root, "peak"), state)
        print(f"device save: peak resident memory {during.peak - before.peak:.0f} MB above the "
              f"{before.peak:.0f} MB before it, for a {_MB.value} MB state", flush=True)
    print("\n| save | caller blocked (median s) | until on disk (median s) |\n|---|---:|---:|")
    for name, values in results.items():
        print(f"| {name} | {np.median([v[0] for v in values]):.3f} | "
              f"{np.median([v[1] for v in values]):.3f} |")
    print("\n| learner state (Catch, default config) | leaves | fingerprint compile, batched "
          "(now) / per leaf (before) | compute, batched / per leaf |\n|---|---:|---:|---:|")
    for name, leaves in _agent_states(_AGENTS.value):
        now = _compile_and_run(checkpoint._digest_leaves, leaves)
        before = _compile_and_run(_whole_leaf_digest, leaves)
        assert now[2] == before[2], (name, now[2], before[2])
        print(f"| {name} | {len(leaves)} | {now[0]:.2f} s / {before[0]:.2f} s | "
              f"{now[1] * 1e3:.2f} ms / {before[1] * 1e3:.2f} ms |", flush=True)


if __name__ == "__main__":
    app.run(main)
