"""Checkpoints of a run's whole state with orbax: atomic, the last few kept, verified on restore.

A checkpoint is one step directory `<directory>/<step>/` holding `state` (any pytree of arrays;
global `jax.Array`s sharded over the devices of several processes included: every process
writes its own shards) and `meta` (JSON: counters, the config, and a fingerprint of `state`).

Saving never stops the caller to look at the state. `save` (or `snapshot`, ahead of it)
dispatches one compiled program that copies the state where it lives and reduces every bit of
it to a 64-bit fingerprint there; both are computed on the devices after the work already
queued, and the caller goes on at once (it may donate or overwrite its arrays: the copy is the
checkpoint's). With `asynchronous=True`, in a single process, a writer thread then waits for
the copy, fetches the fingerprint (two words) and has orbax write the files; the caller only
waits if it saves again before the previous save is on disk. In a multi-process run orbax's
barriers are collectives that every process must enter in the same order as its training
steps, so the writing is handed to orbax from the calling thread instead, at the `save` call:
that waits for the copy to be computed and for orbax's copy to host memory, and orbax writes
the files in the background.
orbax writes a step into a temporary directory and renames it once complete, so a process
killed mid-save leaves no half-written step under a step name; leftover temporary directories
are removed when the next run opens the directory.

Restoring walks from the newest step to the oldest and takes the first one that loads and
whose state matches the fingerprint recorded when it was saved. A step that fails (truncated or
garbled files, missing metadata) is reported and moved to `<directory>.corrupt/` so that the
run can write that step again and a person can still look at what went wrong.

Multi-process runs call every method in every process, in the same order, over a filesystem
they all see.

`Preemption` turns SIGTERM, which is how pre-emption arrives, into a flag that a host loop
polls between compiled calls, so that it can save a checkpoint and exit cleanly.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import queue
import shutil
import signal
import threading
import time
import zlib
from typing import Any, Self

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

_STATE = "state"
_META = "meta"


class CorruptCheckpointError(RuntimeError):
    """A checkpoint step loaded but does not hold what was saved."""


# ---------------------------------------------------------------------------------------------
# Fingerprints: a 64-bit digest of every bit of a pytree, on the host or where it lives.


def _mix(h: jax.Array) -> jax.Array:
    """murmur3's 32-bit finaliser: every input bit flips about half of the output bits."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _word_rows(x: jax.Array, packed: bool) -> tuple[jax.Array, Any]:
    """The leaf's bits as 32-bit words, unconverted: `rows` [n, k] and `to_words`, which
    turns any [..., k] slice of them into its [...] uint32 words (the n words in order are
    the leaf's). 8-byte values are pairs of words; narrower values one per word ("device:",
    the first scheme) or, `packed`, 4 bytes or 2 halves to a word where the size allows
    ("device2:": a uint8 replay buffer needs 4x fewer mixing steps). Converting slices, not
    the whole leaf, keeps the leaf's size of temporaries out of the digest."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    size = x.dtype.itemsize
    if size >= 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1, 1), lambda r: r[..., 0]
    narrow = jnp.uint16 if size == 2 else jnp.uint8
    x = jax.lax.bitcast_convert_type(x, narrow).ravel()
    per_word = 4 // size
    if packed and x.size % per_word == 0 and x.size:
        return x.reshape(-1, per_word), lambda r: jax.lax.bitcast_convert_type(r, jnp.uint32)
    return x.reshape(-1, 1), lambda r: r[..., 0].astype(jnp.uint32)


_SEEDS = (0x9E3779B9, 0x7F4A7C15)  # two independent 32-bit lanes: a 64-bit digest
# Words mixed at a time: XLA on the CPU materialises the mixed words of one reduction (two
# lanes, 8 bytes a word) before summing them, so a leaf is digested in slices of at most
# this many words (about 64 MiB of temporaries), not all at once (three times a uint8 replay).
_DIGEST_BLOCK_WORDS = 1 << 22


def _lanes(words: jax.Array, position: jax.Array) -> jax.Array:
    """[2] uint32: the two lanes' sums of the position-mixed words (any shape, same shape
    `position`, each word's index in the leaf)."""
    seeds = jnp.asarray(_SEEDS, jnp.uint32)
    mixed = _mix(words.ravel()[:, None] ^ _mix(position.ravel()[:, None] + seeds))
    return jnp.sum(mixed, axis=0, dtype=jnp.uint32)


def _digest_slices(leaf: jax.Array, n: int) -> tuple[int, int]:
    """(steps, lead): a leaf of `n` words is digested in `steps` loop steps of at most about
    `_DIGEST_BLOCK_WORDS` words, each step one contiguous stretch of each of `lead` rows.
    Where a count near the least divides the words of each leading index, the rows are the
    leaf's leading indices (a leaf sharded on its leading axis is then read where each device
    holds it) and no word is left over; else one row (`lead` 1) of the least count's whole
    slices, the words after them digested apart (at the cost of one copy of the rest)."""
    least = -(-n // _DIGEST_BLOCK_WORDS)
    if least <= 1:
        return 1, 1
    per_row = n // leaf.shape[0] if leaf.ndim and n % leaf.shape[0] == 0 else n
    for steps in range(least, min(per_row, 4 * least) + 1):
        if per_row % steps == 0:
            return steps, n // per_row
    return least, 1


# Leaves of at most this many words are digested together, a batch of them (at most
# `_DIGEST_BLOCK_WORDS` words in all) in one reduction: a learner state holds hundreds of small
# leaves, and one reduction each made the program slow to compile (EfficientZero's 278 leaves:
# 7.1 s of XLA compilation on a CPU, against 1.3 s batched: docs/benchmarks.md).
_SMALL_LEAF_WORDS = 1 << 16


def _leaf_lanes(leaf: jax.Array, rows: jax.Array, to_words: Any) -> jax.Array:
    """[2] uint32: the two lanes' sums over the leaf's words, in slices (`_digest_slices`)."""
    n = rows.shape[0]
    steps, lead = _digest_slices(leaf, n)
    main = n // steps * steps
    chunk = main // (lead * steps)
    lanes = jnp.zeros((len(_SEEDS),), jnp.uint32)
    if main:
        grid = (rows if main == n else rows[:main]).reshape(lead, steps, chunk, -1)
        start = (jnp.arange(lead, dtype=jnp.uint32)[:, None] * jnp.uint32(steps * chunk)
                 + jnp.arange(chunk, dtype=jnp.uint32))  # [lead, chunk] at step 0

        def stretch(j, acc):
            words = to_words(jax.lax.dynamic_index_in_dim(grid, j, 1, keepdims=False))
            return acc + _lanes(words, start + j.astype(jnp.uint32) * jnp.uint32(chunk))

        lanes = jax.lax.fori_loop(0, steps, stretch, lanes)
    if main < n:
        lanes = lanes + _lanes(to_words(rows[main:]), jnp.arange(main, n, dtype=jnp.uint32))
    return lanes


def _batch_lanes(members: list[tuple[jax.Array, Any, int]], lead: int) -> jax.Array:
    """[len(members), 2] uint32: each small leaf's two lane sums, as `_leaf_lanes` gives them,
    from one reduction over the batch's words. Each leaf is split into `lead` rows (its
    leading axis, where it has one of that size), so that leaves sharded on that axis are
    read where each device holds them; the per-leaf sums are a segment sum over the words."""
    words, positions, segment = [], [], []
    for j, (rows, to_words, n) in enumerate(members):
        words.append(to_words(rows.reshape(lead, n // lead, -1)))
        positions.append(jnp.arange(n, dtype=jnp.uint32).reshape(lead, n // lead))
        segment.append(jnp.full((n // lead,), j, jnp.int32))  # built in the program
    words, positions = jnp.concatenate(words, axis=1), jnp.concatenate(positions, axis=1)
    seeds = jnp.asarray(_SEEDS, jnp.uint32)
    mixed = _mix(words[..., None] ^ _mix(positions[..., None] + seeds))  # [lead, W, 2]
    # The wrapping uint32 sums are exact, so summing by segment, then over the rows, gives
    # the same lanes as each leaf's own reduction.
    sums = jax.ops.segment_sum(jnp.swapaxes(mixed, 0, 1), jnp.concatenate(segment),
                               num_segments=len(members), indices_are_sorted=True)
    return jnp.sum(sums, axis=1, dtype=jnp.uint32)


def _digest_leaves(leaves: list[jax.Array], packed: bool = True) -> jax.Array:
    total = jnp.zeros((len(_SEEDS),), jnp.uint32)
    # Small leaves, batched by the number of rows they are split into: [(members, layouts)].
    batches: dict[int, list[tuple[list, list[int]]]] = {}
    for i, leaf in enumerate(leaves):
        rows, to_words = _word_rows(leaf, packed)
        n = rows.shape[0]
        # The leaf's place, shape and dtype, so that equal bits in another layout differ.
        layout = zlib.crc32(f"{i}:{leaf.shape}:{leaf.dtype}".encode())
        if 0 < n <= min(_SMALL_LEAF_WORDS, _DIGEST_BLOCK_WORDS):
            lead = leaf.shape[0] if leaf.ndim and leaf.shape[0] and n % leaf.shape[0] == 0 else 1
            open_batches = batches.setdefault(lead, [])
            if not open_batches or (sum(m[2] for m in open_batches[-1][0]) + n
                                    > _DIGEST_BLOCK_WORDS):
                open_batches.append(([], []))
            open_batches[-1][0].append((rows, to_words, n))
            open_batches[-1][1].append(layout)
            continue
        # Position-dependent mixing, so that moved or swapped values change the digest. The
        # wrapping uint32 sum is exact: the digest does not depend on how XLA orders the
        # reduction, how the words are sliced or batched, or how the arrays are sharded.
        total = total + _mix(_leaf_lanes(leaf, rows, to_words) ^ jnp.uint32(layout))
    for lead, lead_batches in batches.items():
        for members, layouts in lead_batches:
            lanes = _batch_lanes(members, lead)
            total = total + jnp.sum(_mix(lanes ^ jnp.asarray(layouts, jnp.uint32)[:, None]),
                                    axis=0, dtype=jnp.uint32)
    return total


_digest = jax.jit(_digest_leaves, static_argnums=1)
_DEVICE = "device2:"  # the scheme new fingerprints use on the devices; "device:" still verifies


@functools.partial(jax.jit, static_argnums=1)
def _copy_and_digest(leaves: list[jax.Array], copy: tuple[bool, ...]) -> tuple[list, jax.Array]:
    """Copies of the leaves marked in `copy` (new buffers, same shardings) and the digest of
    all `leaves`, as one program: nothing leaves the devices but the result."""
    return [jnp.copy(x) for x, c in zip(leaves, copy) if c], _digest_leaves(leaves)


def _digest_hex(words: Any, scheme: str = _DEVICE) -> str:
    words = np.asarray(words)
    return f"{scheme}{int(words[0]):08x}{int(words[1]):08x}"


def _host_digest(leaves: list[Any]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype,
                                                                 jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        value = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{i}:{value.shape}:{value.dtype};".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def fingerprint(tree: Any, *, on_device: bool | None = None, scheme: str | None = None) -> str:
    """A digest of every bit, shape and leaf of `tree` (equal trees, equal digests).

    Schemes, told apart by their prefix: "host:" hashes the bytes on the host (blake2b; no
    compilation), "device2:" reduces each array where it lives (a 64-bit sum of mixed 32-bit
    words, narrow values packed four or two to a word; compiled once per tree structure;
    needed where a process does not hold every shard), and "device:", the same with one value
    per word, which checkpoints made before "device2:" carry. `scheme` (a prefix) picks one;
    else `on_device` does, and `on_device=None` picks "host" when this process can see every
    array whole. It is a checksum against corruption, not a defence against tampering.
    """
    leaves = jax.tree.leaves(tree)
    if scheme is None:
        if on_device is None:
            on_device = not all(getattr(x, "is_fully_addressable", True) for x in leaves)
        scheme = _DEVICE if on_device else "host:"
    if scheme == "host:":
        return "host:" + _host_digest(leaves)
    if scheme not in ("device:", "device2:"):
        raise ValueError(f"unknown fingerprint scheme {scheme!r}")
    leaves = [x if isinstance(x, jax.Array) else jnp.asarray(x) for x in leaves]
    if not leaves:
        return scheme + "0" * 16
    return _digest_hex(_digest(leaves, scheme == "device2:"), scheme)


def _scheme(recorded: str) -> str:
    return recorded.split(":", 1)[0] + ":"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A copy of a state taken where it lives, and its fingerprint being computed there (see
    `snapshot`). Neither may be ready yet; `Checkpointer.save` accepts it in place of a state."""

    state: Any  # the copy: jax.Arrays copied on their devices, other leaves copied on the host
    digest: jax.Array  # [2] uint32, the "device2:" fingerprint's words

    def fingerprint(self) -> str:
        """The state's fingerprint (waits until it is computed)."""
        return _digest_hex(self.digest)


def snapshot(state: Any) -> Snapshot:
    """Dispatches a copy of `state` and its "device2:" fingerprint; returns without waiting.

    The copy is ordered after the computations already dispatched that write `state`, and
    before any later one that donates it, so the caller may go on and donate `state` at once.
    The fingerprint equals `fingerprint(state, on_device=True)`. Leaves that are not
    `jax.Array`s (numpy arrays, scalars) are copied on the host.
    """
    leaves, treedef = jax.tree.flatten(state)
    is_array = tuple(isinstance(x, jax.Array) for x in leaves)
    if not leaves:
        return Snapshot(state=state, digest=jnp.zeros((2,), jnp.uint32))  # as `fingerprint`
    on_device = [x if a else jnp.asarray(x) for x, a in zip(leaves, is_array)]
    copies, digest = _copy_and_digest(on_device, is_array)
    copies = iter(copies)
    leaves = [next(copies) if a else np.array(x, copy=True) for x, a in zip(leaves, is_array)]
    return Snapshot(state=jax.tree.unflatten(treedef, leaves), digest=digest)


# ---------------------------------------------------------------------------------------------
# The checkpointer.


@dataclasses.dataclass(frozen=True)
class Restored:
    step: int
    state: Any  # shaped, typed and sharded like the restore target
    metadata: dict[str, Any]  # what `save` was given (plus "fingerprint")


def state_layout(tree: Any) -> list[list[Any]]:
    """[path, shape, dtype] of every leaf of `tree` (arrays or `jax.ShapeDtypeStruct`s), as
    JSON values: what a checkpoint of `tree` holds, comparable without loading it."""
    def dtype(leaf: Any) -> str:
        return str(leaf.dtype)  # also names typed PRNG keys, e.g. key<fry>

    return [[jax.tree_util.keystr(path), [int(n) for n in np.shape(leaf)], dtype(leaf)]
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _abstract(target: Any) -> Any:
    def leaf(x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)

    return jax.tree.map(leaf, target)


class Checkpointer:
    """Saves and restores `(state, metadata)` by step in `directory`, keeping the newest few.

    `save` dispatches a copy of the state and its fingerprint on the devices (see `snapshot`)
    and never hashes or inspects the state on the host. With `asynchronous=False` it then
    returns once the step is on disk. With `asynchronous=True` it returns at once in a single
    process (a writer thread waits for the copy and writes it; see the module docstring for a
    multi-process run); the next `save`, `wait`, `steps` and `close` wait for the previous
    save, and re-raise an error it met. Either way a step appears on disk only complete.
    """

    def __init__(self, directory: str, *, max_to_keep: int = 3, asynchronous: bool = False):
        import orbax.checkpoint as ocp  # imported here: a run without checkpoints skips it

        self._ocp = ocp
        self.directory = os.path.abspath(directory)
        # Single process: the writer thread calls orbax synchronously. Several: orbax's own
        # background writing, handed over from the calling thread (its barriers are
        # collectives, which must not run beside the training steps' in another thread).
        self._threaded = asynchronous and jax.process_count() == 1
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=asynchronous and not self._threaded,
            create=True,
            cleanup_tmp_directories=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_names=(_STATE, _META))
        self._jobs: queue.Queue | None = None
        self._writer: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._error: BaseException | None = None
        self.blocked_seconds = 0.0  # time `save` made its caller wait for an earlier save

    def steps(self) -> list[int]:
        """The steps on disk, oldest first (after the saves in flight)."""
        self.wait()
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any, metadata: dict[str, Any] | None = None) -> None:
        """Saves `state` (a pytree of arrays, or a `Snapshot` of one) as `step`."""
        taken = state if isinstance(state, Snapshot) else snapshot(state)
        meta = dict(metadata or {})
        meta["layout"] = state_layout(taken.state)
        meta["saved_at"] = time.time()
        if not self._threaded:
            self._write(step, taken, meta)
            return
        started = time.perf_counter()
        self._finish_previous()
        self.blocked_seconds += time.perf_counter() - started
        if self._writer is None:
            self._jobs = queue.Queue()
            self._writer = threading.Thread(target=self._write_jobs, daemon=True,
                                            name="podracer-checkpoint-writer")
            self._writer.start()
        self._idle.clear()
        self._jobs.put((step, taken, meta))

    def _write(self, step: int, taken: Snapshot, meta: dict[str, Any]) -> None:
        ocp = self._ocp
        meta["fingerprint"] = taken.fingerprint()  # waits for the copy's program
        self._manager.save(
            step,
            args=ocp.args.Composite(
                **{_STATE: ocp.args.StandardSave(taken.state), _META: ocp.args.JsonSave(meta)}
            ),
            force=True,
        )

    def _write_jobs(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._write(*job)
            except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
                self._error = error
            finally:
                del job  # frees the copy's device buffers before waiting for the next one
                self._idle.set()

    def _finish_previous(self) -> None:
        self._idle.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"Saving a checkpoint in {self.directory} failed") from error

    def wait(self) -> None:
        """Blocks until every save has reached the disk (re-raises a failed save's error)."""
        self._finish_previous()
        self._manager.wait_until_finished()

    def restore(self, step: int, target: Any) -> Restored:
        """Loads `step` shaped like `target` (arrays or `jax.ShapeDtypeStruct`s, with the
        shardings to place it with), or raises if it is unreadable or does not verify."""
        ocp = self._ocp
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                **{_STATE: ocp.args.StandardRestore(_abstract(target)),
                   _META: ocp.args.JsonRestore()}
            ),
        )
        meta, state = restored[_META], restored[_STATE]
        if not isinstance(meta, dict) or "fingerprint" not in meta:
            raise CorruptCheckpointError(f"step {step}: metadata missing or unreadable")
        recorded = str(meta["fingerprint"])
        scheme = _scheme(recorded)
        actual = (fingerprint(state, scheme=scheme)
                  if scheme in ("host:", "device:", "device2:") else "unknown scheme")
        if actual != meta["fingerprint"]:
            raise CorruptCheckpointError(
                f"step {step}: state fingerprint {actual} != saved {meta['fingerprint']}"
            )
        return Restored(step=step, state=state, metadata=meta)

    def restore_latest(self, target: Any) -> Restored | None:
        """The newest step that loads and verifies, or None if there is none.

        Steps newer than it that failed are moved aside (see the module docstring).
        """
        for step in reversed(self.steps()):
            try:
                return self.restore(step, target)
            except Exception as error:  # noqa: BLE001 - any failure means "not usable"
                logging.warning("Checkpoint step %d in %s is unusable (%s: %.300s); trying "
                                "the previous one.", step, self.directory,
                                type(error).__name__, error)
                self.quarantine(step)
        return None

    def quarantine(self, step: int) -> None:
        """Moves `step` to `<directory>.corrupt/` (process 0; every process calls this)."""
        source = os.path.join(self.directory, str(step))
        if jax.process_index() == 0 and os.path.exists(source):  # gone: nothing to set aside
            aside = self.directory + ".corrupt"
            os.makedirs(aside, exist_ok=True)
            shutil.move(source, os.path.join(aside, f"{step}-{int(time.time() * 1000)}"))
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"podracer_checkpoint_quarantine_{step}")
        self._manager.reload()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._writer is not None:
                self._jobs.put(None)
                self._writer.join()
                self._writer = None
            self._manager.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Preemption:
    """While entered, SIGTERM sets a flag instead of killing the process.

    The host loop polls `requested()` between compiled calls; the call in flight finishes
    first, so a chunk must take less than the platform's grace period. Signals can only be
    caught in the main thread; entered elsewhere, this does nothing (and never requests).
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self._signals = signals
        self._previous: dict[int, Any] = {}
        self.received: int | None = None

    def _handle(self, signum: int, frame: Any) -> None:
        del frame
        self.received = signum

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for signum in self._signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def requested(self) -> bool:
        """Whether any process of the run has received a signal (all processes must call this
        at the same points, as they do collectives, so that they all stop together)."""
        local = self.received is not None
        if jax.process_count() == 1:
            return local
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.int32(local))))


def read_metadata(directory: str, step: int | None = None) -> dict[str, Any] | None:
    """The JSON metadata of `step` (default: the newest step) without loading any arrays."""
    import json

    directory = os.path.abspath(directory)
    if step is None:
        steps = [int(n) for n in os.listdir(directory) if n.isdigit()] if os.path.isdir(
            directory) else []
        if not steps:
            return None
        step = max(steps)
    path = os.path.join(directory, str(step), _META, "metadata")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_arrays(directory: str, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Loads a checkpoint's state as numpy arrays (nested dicts, whatever devices wrote it)
    and its metadata, for inspection; `step` defaults to the newest. Not verified: use
    `Checkpointer.restore` to resume."""
    import orbax.checkpoint as ocp

    metadata = read_metadata(directory, step)
    if metadata is None:
        raise FileNotFoundError(f"No readable checkpoint in {directory} (step {step}).")
    if step is None:
        step = max(int(n) for n in os.listdir(directory) if n.isdigit())
    path = os.path.join(os.path.abspath(directory), str(step), _STATE)
    checkpointer = ocp.StandardCheckpointer()
    tree = checkpointer.metadata(path).item_metadata
    host = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=host), tree)
    state = checkpointer.restore(path, target)
    checkpointer.close()
    return jax.tree.map(np.asarray, state), metadata


__all__ = ["Checkpointer", "CorruptCheckpointError", "Preemption", "Restored", "Snapshot",
           "fingerprint", "load_arrays", "read_metadata", "snapshot", "state_layout"]
