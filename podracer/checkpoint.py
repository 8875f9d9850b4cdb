"""Checkpoints of a run's whole state with orbax: atomic, the last few kept, verified on restore.

A checkpoint is one step directory `<directory>/<step>/` holding `state` (any pytree of arrays;
global `jax.Array`s sharded over the devices of several processes included: every process
writes its own shards) and `meta` (JSON: counters, the config, and a fingerprint of `state`).

Saving never stops the caller to look at the state. `save` (or `snapshot`, ahead of it)
dispatches one compiled program that copies the state where it lives, after the work already
queued, and the caller goes on at once (it may donate or overwrite its arrays: the copy is the
checkpoint's). With `asynchronous=True`, in a single process, a writer thread then waits for
the copy, fetches it shard by shard to compute its fingerprint (a CRC-32 of each shard's
bytes) and has orbax write the files; the caller only waits if it saves again before the
previous save is on disk. In a multi-process run orbax's barriers are collectives that every
process must enter in the same order as its training steps, so the fingerprint (each process
hashes the shards it holds; process 0 records them all) and the writing are done from the
calling thread instead, at the `save` call: that waits for the copy, its hashing and orbax's
copy to host memory, and orbax writes the files in the background.
orbax writes a step into a temporary directory and renames it once complete, so a process
killed mid-save leaves no half-written step under a step name; leftover temporary directories
are removed when the next run opens the directory.

Restoring walks from the newest step to the oldest and takes the first one that loads and
whose state matches the fingerprint recorded when it was saved (under any sharding: each shard
recorded is checked where it is held). A step that fails (truncated or garbled files, a changed
byte, missing metadata) is reported and moved to `<directory>.corrupt/` so that the run can
write that step again and a person can still look at what went wrong. Steps saved with an
older fingerprint (a string: "host:", "device:" or "device2:") restore unverified, with a
warning.

Multi-process runs call every method in every process, in the same order, over a filesystem
they all see.

`Preemption` turns SIGTERM, which is how pre-emption arrives, into a flag that a host loop
polls between compiled calls, so that it can save a checkpoint and exit cleanly.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import shutil
import signal
import sys
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
# Fingerprints: a CRC-32 of each shard's bytes on the host, keyed by the shard's place in its
# array, so that a state verifies under any sharding. orbax alone does not catch a flipped byte
# in the arrays' data: tensorstore checksums its index (where it keeps small arrays) but not
# the data files, where a changed byte mostly reads back as another value.


def _leaves(tree: Any) -> list[Any]:
    """The leaves of `tree`, typed PRNG keys as their bits."""
    return [jax.random.key_data(x) if isinstance(x, jax.Array)
            and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
            for x in jax.tree.leaves(tree)]


def _bounds(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _crc(x: Any, shards: list, bounds: tuple[tuple[int, int], ...]) -> int | None:
    """The CRC-32 of the values of `x` in `bounds` (with their shape and dtype), read from one
    of its `shards` held here ([(bounds, shard)]) or from `x` whole if this process holds all
    of it; None if it cannot."""
    for held, shard in shards:
        if all(a <= s and t <= b for (a, b), (s, t) in zip(held, bounds)):
            x, bounds = shard.data, [(s - a, t - a) for (a, _), (s, t) in zip(held, bounds)]
            break
    else:
        if not getattr(x, "is_fully_addressable", True):
            return None
    data = np.asarray(x)[tuple(slice(a, b) for a, b in bounds)]
    crc = zlib.crc32(f"{data.shape}:{data.dtype};".encode())
    return zlib.crc32(np.ascontiguousarray(data).reshape(-1).view(np.uint8), crc)


def _crcs(leaves: list[Any], regions: list[list[tuple]]) -> list[int | None]:
    """The CRC-32 of every region of every leaf, each computed by a process that holds it
    (gathered from all processes in a multi-process run; every process must call this)."""
    crcs = []
    for x, leaf_regions in zip(leaves, regions):
        shards = [(_bounds(s.index, x.shape), s) for s in getattr(x, "addressable_shards", ())]
        crcs += [_crc(x, shards, r) for r in leaf_regions]
    if jax.process_count() == 1 or not crcs:
        return crcs
    from jax.experimental import multihost_utils

    mine = np.array([[c or 0, c is not None] for c in crcs], np.uint32)
    every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, regions, 2]
    return [int(every[every[:, j, 1].argmax(), j, 0]) if every[:, j, 1].any() else None
            for j in range(len(crcs))]


def fingerprint(tree: Any) -> list[dict[str, str]]:
    """For each leaf of `tree`, {region: CRC-32} for each of its shards ("0:2,0:3" holds rows
    0-1 and columns 0-2), what a checkpoint records; the bytes are hashed on the host. In a
    multi-process run every process must call this. Equal trees with equal shardings have
    equal fingerprints. A checksum against corruption, not a defence against tampering."""
    leaves = _leaves(tree)
    regions = [sorted({_bounds(i, x.shape) for i in x.sharding.devices_indices_map(x.shape)
                       .values()}) if isinstance(x, jax.Array)
               else [tuple((0, n) for n in np.shape(x))] for x in leaves]
    crcs = iter(_crcs(leaves, regions))
    return [{",".join(f"{a}:{b}" for a, b in r): f"{next(crcs):08x}" for r in leaf_regions}
            for leaf_regions in regions]


def _verify(state: Any, recorded: Any, step: int) -> str | None:
    """What in `state` does not match `recorded` (its `fingerprint`), or None. Each region is
    checked by a process that holds it whole, under whatever sharding `state` has."""
    leaves = _leaves(state)
    if isinstance(recorded, str) and recorded.split(":")[0] in ("host", "device", "device2"):
        logging.warning("Checkpoint step %d carries a fingerprint of an older scheme (%s:), "
                        "which is no longer computed: restored unverified.", step,
                        recorded.split(":")[0])
        return None
    if not isinstance(recorded, list) or len(recorded) != len(leaves):
        return "the fingerprint does not list the state's leaves"
    regions = [[tuple(tuple(map(int, d.split(":"))) for d in k.split(",") if d) for k in crcs]
               for crcs in recorded]
    if any(sum(math.prod(b - a for a, b in r) for r in rs) != np.size(x)
           for x, rs in zip(leaves, regions)):
        return "the fingerprint's regions do not cover the state"
    expected = [int(c, 16) for crcs in recorded for c in crcs.values()]
    actual = _crcs(leaves, regions)
    differ = sum(a is not None and a != e for a, e in zip(actual, expected))
    if differ:
        return f"{differ} of {len(actual)} shards differ from their recorded CRC-32"
    if None in actual:
        logging.warning("Checkpoint step %d: %d of %d shards not verified (no process holds "
                        "one whole).", step, actual.count(None), len(actual))
    return None


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A copy of a state taken where it lives (see `snapshot`), maybe not computed yet;
    `Checkpointer.save` accepts it in place of a state."""

    state: Any  # the copy: jax.Arrays copied on their devices, other leaves copied on the host


_copy = jax.jit(lambda leaves: [jnp.copy(x) for x in leaves])


def snapshot(state: Any) -> Snapshot:
    """Dispatches a copy of `state` on its devices (one compiled program); returns without
    waiting. The copy is ordered after the computations already dispatched that write `state`,
    and before any later one that donates it, so the caller may donate `state` at once. Leaves
    that are not `jax.Array`s (numpy arrays, scalars) are copied on the host."""
    leaves, treedef = jax.tree.flatten(state)
    copies = iter(_copy([x for x in leaves if isinstance(x, jax.Array)]))
    leaves = [next(copies) if isinstance(x, jax.Array) else np.array(x, copy=True)
              for x in leaves]
    return Snapshot(state=jax.tree.unflatten(treedef, leaves))


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

    `save` dispatches a copy of the state on its devices (see `snapshot`); the copy is then
    fingerprinted on the host and written. With `asynchronous=False` `save` returns once the
    step is on disk. With `asynchronous=True` it returns at once in a single process (a writer
    thread waits for the copy, fingerprints and writes it; see the module docstring for a
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
        meta["fingerprint"] = fingerprint(taken.state)  # waits for the copy; hashes on the host
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
        _drop_orbax_read_leftovers()
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
        problem = _verify(state, meta["fingerprint"], step)
        if problem is not None:
            raise CorruptCheckpointError(f"step {step}: {problem}")
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
    """While entered, SIGTERM and Ctrl-C (SIGINT) set a flag instead of ending the process.

    The host loop polls `requested()` between compiled calls and stops there, with a
    checkpoint when the run has a workdir; the call in flight finishes first, so a chunk must
    take less than the platform's grace period. A second Ctrl-C stops at once
    (`KeyboardInterrupt`), as Ctrl-C does elsewhere. A signal the process ignores (SIGINT in a
    job a non-interactive shell started in the background) stays ignored. Signals can only be
    caught in the main thread; entered elsewhere, this does nothing (and never requests).
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)):
        self._signals = signals
        self._previous: dict[int, Any] = {}
        self.received: int | None = None

    def _handle(self, signum: int, frame: Any) -> None:
        del frame
        if signum == signal.SIGINT and self.received is not None:
            raise KeyboardInterrupt  # the second request: stop now
        if signum == signal.SIGINT:
            print("Ctrl-C: stopping after the step in flight (again to stop at once).",
                  file=sys.stderr, flush=True)
        if self.received is None:
            self.received = signum

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for signum in self._signals:
                if signal.getsignal(signum) is signal.SIG_IGN:
                    continue
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


def _drop_orbax_read_leftovers() -> None:
    """Keeps the leftovers of orbax's failed reads off stderr. When tensorstore cannot read a
    damaged checkpoint, orbax's restore raises and closes its event loop while the step's other
    reads are still in flight. Each of those, on completing, calls back into the closed loop,
    and Python prints a "RuntimeError: Event loop is closed" traceback for every one (about a
    hundred for a small state); each of orbax's read coroutines left unfinished raises again
    when it is closed ("Exception ignored in: <coroutine object ...>"). Both come after the
    damage was reported and handled. This wraps `sys.unraisablehook` (once: not again while the
    wrapper is in place) to drop exactly those two; everything else reaches the hook as before."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_orbax_read_leftovers", False):
        return

    def hook(unraisable: Any) -> None:
        if not _orbax_read_leftover(unraisable):
            previous(unraisable)

    hook.drops_orbax_read_leftovers = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _orbax_read_leftover(unraisable: Any) -> bool:
    error = unraisable.exc_value
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return True
    code = getattr(unraisable.object, "cr_code", None)  # a coroutine's
    return (code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename
            and isinstance(getattr(error, "__cause__", None), GeneratorExit))


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
