"""podracer.checkpoint: round trips of sharded state, retention, corrupt and partial steps,
fingerprints, snapshots taken on the devices, asynchronous saves that neither wait for the
state nor lose it to donation, and SIGTERM turned into a flag."""

import glob
import json
import os
import signal
import subprocess
import sys
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, garble_arrays
from jax.sharding import NamedSharding, PartitionSpec

from podracer import replication
from podracer.checkpoint import (
    Checkpointer,
    Preemption,
    fingerprint,
    load_arrays,
    read_metadata,
    snapshot,
)


def _state(mesh, offset=0.0):
    """A stacked [D, ...] state with the dtypes a runner carries: floats, ints, bools, keys,
    bytes."""
    d = mesh.devices.size
    host = {
        "params": {"w": np.arange(d * 6, dtype=np.float32).reshape(d, 2, 3) + offset,
                   "b": np.full((d, 3), 0.5, np.float32)},
        "count": np.full((d,), 7, np.int32),
        "done": np.array([[True, False]] * d),
        "key": np.stack([np.asarray(jax.random.PRNGKey(i)) for i in range(d)]),
        # Compressed, still large enough to be stored apart from orbax's index (which carries
        # its own checksum).
        "obs": np.random.default_rng(0).integers(0, 256, (d, 1024), dtype=np.uint8),
    }
    return replication.from_global(host, mesh)


def _assert_identical(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture
def mesh():
    return replication.make_mesh(jax.devices()[:2])


def test_round_trip_keeps_values_dtypes_and_shardings(tmp_path, mesh):
    state = _state(mesh)
    with Checkpointer(str(tmp_path / "ckpt")) as checkpointer:
        checkpointer.save(10, state, {"updates": 10, "note": "hello"})
        restored = checkpointer.restore_latest(_state(mesh, offset=100.0))
    assert restored.step == 10
    assert restored.metadata["updates"] == 10 and restored.metadata["note"] == "hello"
    _assert_identical(restored.state, state)
    for leaf, target in zip(jax.tree.leaves(restored.state), jax.tree.leaves(state)):
        assert leaf.sharding == target.sharding
    arrays, meta = load_arrays(str(tmp_path / "ckpt"))
    _assert_identical(arrays, jax.device_get(state))
    assert meta["updates"] == 10


def test_keeps_only_the_newest_few(tmp_path, mesh):
    with Checkpointer(str(tmp_path), max_to_keep=2) as checkpointer:
        for step in (1, 2, 3, 4):
            checkpointer.save(step, _state(mesh, offset=step), {"updates": step})
        assert checkpointer.steps() == [3, 4]
        assert checkpointer.restore_latest(_state(mesh)).metadata["updates"] == 4
    assert sorted(os.listdir(tmp_path)) == ["3", "4"]


def _forge_fingerprint(step_dir):
    # The arrays on disk no longer match what was saved: what a silently flipped bit looks like
    # to the reader.
    path = os.path.join(step_dir, "meta", "metadata")
    with open(path) as f:
        meta = json.load(f)
    crcs = meta["fingerprint"][1]
    region = next(iter(crcs))
    crcs[region] = f"{int(crcs[region], 16) ^ 1:08x}"
    with open(path, "w") as f:
        json.dump(meta, f)


def _unknown_fingerprint(step_dir):
    path = os.path.join(step_dir, "meta", "metadata")
    with open(path) as f:
        meta = json.load(f)
    meta["fingerprint"] = "0123456789abcdef"
    with open(path, "w") as f:
        json.dump(meta, f)


def _flip_a_byte(step_dir):
    # One bit flipped in the arrays' data where orbax itself does not notice: the step reads
    # back without an error, holding another value.
    directory, step = os.path.split(step_dir)
    before, _ = load_arrays(directory, int(step))
    files = glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True)
    with open(max(files, key=os.path.getsize), "r+b") as f:
        data = bytearray(f.read())
        for position in range(len(data) // 2, len(data)):
            data[position] ^= 0x04
            f.seek(0)
            f.write(data)
            f.flush()
            try:
                after, _ = load_arrays(directory, int(step))
            except Exception:  # noqa: BLE001 - orbax saw this one; try another byte
                after = before
            if any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after),
                                                            jax.tree.leaves(before))):
                return
            data[position] ^= 0x04
    raise AssertionError("no byte of the data changes a value unnoticed")


def _truncate_arrays(step_dir):
    files = glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True)
    path = max(files, key=os.path.getsize)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _truncate_metadata(step_dir):
    path = os.path.join(step_dir, "meta", "metadata")
    with open(path) as f:
        data = f.read()
    with open(path, "w") as f:
        f.write(data[: len(data) // 2])


def _delete_arrays(step_dir):
    import shutil

    shutil.rmtree(os.path.join(step_dir, "state"))


@pytest.mark.parametrize("damage", [garble_arrays, _flip_a_byte, _truncate_arrays,
                                    _forge_fingerprint, _unknown_fingerprint, _truncate_metadata,
                                    _delete_arrays])
def test_corrupt_latest_is_detected_and_the_previous_one_used(tmp_path, mesh, damage):
    directory = str(tmp_path / "ckpt")
    with Checkpointer(directory) as checkpointer:
        checkpointer.save(1, _state(mesh, offset=1.0), {"updates": 1})
        checkpointer.save(2, _state(mesh, offset=2.0), {"updates": 2})
    damage(os.path.join(directory, "2"))

    with Checkpointer(directory) as checkpointer:
        restored = checkpointer.restore_latest(_state(mesh))
        assert restored.step == 1
        _assert_identical(restored.state, _state(mesh, offset=1.0))
        # The bad step is moved aside, so the resumed run can write step 2 again.
        assert checkpointer.steps() == [1]
        assert len(os.listdir(directory + ".corrupt")) == 1
        checkpointer.save(2, _state(mesh, offset=2.5), {"updates": 2})
        again = checkpointer.restore_latest(_state(mesh))
    assert again.step == 2
    _assert_identical(again.state, _state(mesh, offset=2.5))


_RESTORE_A_GARBLED_STEP = """
import glob, os, sys
import jax.numpy as jnp
from podracer.checkpoint import Checkpointer

directory = sys.argv[1]
state = {f"w{i}": jnp.full((8, 8), float(i)) for i in range(256)}  # reads left in flight
with Checkpointer(directory) as checkpointer:
    checkpointer.save(1, state, {})
    checkpointer.save(2, state, {})
for path in glob.glob(os.path.join(directory, "2", "state", "d", "*")):
    with open(path, "r+b") as f:
        data = f.read()
        f.seek(0)
        f.write(bytes(b ^ 0xA5 for b in data))
with Checkpointer(directory) as checkpointer:
    print("restored step", checkpointer.restore_latest(state).step)
"""


def test_a_garbled_step_leaves_no_closed_loop_tracebacks_on_stderr(tmp_path):
    """A damaged step is reported once (a warning naming the step). orbax's reads still in
    flight when its restore failed printed a "RuntimeError: Event loop is closed" traceback
    each, in a process of its own as a run is: 143 to 207 of them for this state of 256
    arrays (64 arrays: 75 to 114, but not in every run under the tests' environment; 12: none)."""
    proc = subprocess.run([sys.executable, "-c", _RESTORE_A_GARBLED_STEP, str(tmp_path / "c")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "restored step 1" in proc.stdout
    assert "Checkpoint step 2" in proc.stderr and "unusable" in proc.stderr
    assert "Event loop is closed" not in proc.stderr, proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]


def test_every_step_corrupt_means_no_checkpoint(tmp_path, mesh):
    directory = str(tmp_path / "ckpt")
    with Checkpointer(directory) as checkpointer:
        checkpointer.save(1, _state(mesh), {})
    _forge_fingerprint(os.path.join(directory, "1"))
    with Checkpointer(directory) as checkpointer:
        assert checkpointer.restore_latest(_state(mesh)) is None


def test_partial_save_left_by_a_killed_process_is_ignored(tmp_path, mesh):
    directory = str(tmp_path / "ckpt")
    with Checkpointer(directory) as checkpointer:
        checkpointer.save(1, _state(mesh, offset=1.0), {"updates": 1})
    # What a process killed while orbax writes step 2 leaves: a temporary directory with
    # some of the files.
    partial = os.path.join(directory, "2.orbax-checkpoint-tmp-1234567890")
    os.makedirs(os.path.join(partial, "state"))
    with open(os.path.join(partial, "state", "manifest.ocdbt"), "wb") as f:
        f.write(b"\x00" * 10)

    with Checkpointer(directory) as checkpointer:
        assert checkpointer.steps() == [1]
        restored = checkpointer.restore_latest(_state(mesh))
    assert restored.step == 1
    assert read_metadata(directory)["updates"] == 1


def test_fingerprint_sees_every_bit_and_position():
    tree = {"a": jnp.arange(6, dtype=jnp.float32), "b": jnp.array([1, 2], jnp.int32),
            "c": jnp.array([True, False, False, True]), "h": jnp.arange(3, dtype=jnp.bfloat16),
            "u": jnp.arange(8, dtype=jnp.uint8), "s": jnp.array([5, -6], jnp.int16),
            "k": jax.random.PRNGKey(3), "z": jnp.float32(2.5), "n": np.arange(3)}
    assert fingerprint(tree) == fingerprint(jax.tree.map(lambda x: x.copy(), tree))
    for name in ("a", "c", "h", "u", "s", "k", "n"):  # one flipped bit, two values swapped
        flipped = np.asarray(tree[name]).copy()
        flipped.view(np.uint8)[1] ^= 0x10 if name != "c" else 1
        assert fingerprint({**tree, name: flipped}) != fingerprint(tree), name
        swapped = np.asarray(tree[name])[[1, 0, *range(2, tree[name].size)]]
        assert fingerprint({**tree, name: swapped}) != fingerprint(tree), name
    # Same bits in another shape or another leaf order are another state.
    assert fingerprint({**tree, "a": tree["a"].reshape(2, 3)}) != fingerprint(tree)
    assert fingerprint([tree["a"], tree["b"]]) != fingerprint([tree["b"], tree["a"]])
    # A typed key is hashed as its bits.
    assert fingerprint([jax.random.key(3)]) == fingerprint([tree["k"]])


def test_fingerprint_hashes_each_shard_by_its_place(mesh):
    state = _state(mesh)
    recorded = fingerprint(state)
    assert list(recorded[1]) == ["0:1,0:2", "1:2,0:2"]  # "done", [2, 2] over two devices
    # Each shard's CRC-32 is zlib's, of its shape, dtype and bytes.
    row = np.asarray(state["done"])[1:2]
    crc = zlib.crc32(row.view(np.uint8), zlib.crc32(f"{row.shape}:{row.dtype};".encode()))
    assert recorded[1]["1:2,0:2"] == f"{crc:08x}"


@pytest.mark.parametrize("saved_on, restored_on", [(4, 1), (1, 4), (2, 4), (4, 2)])
def test_a_checkpoint_verifies_under_another_sharding(tmp_path, saved_on, restored_on):
    def placed(devices, offset=0.0):  # a [4, ...] state placed over 1, 2 or 4 devices
        host = jax.device_get(_state(replication.make_mesh(jax.devices()[:4]), offset))
        mesh = replication.make_mesh(jax.devices()[:devices])
        return jax.tree.map(lambda x: jax.device_put(x, NamedSharding(
            mesh, PartitionSpec(replication.DEVICE_AXIS))), host)

    directory = str(tmp_path / "ckpt")
    with Checkpointer(directory) as checkpointer:
        checkpointer.save(1, placed(saved_on), {})
        checkpointer.save(2, placed(saved_on, offset=1.0), {})
    _flip_a_byte(os.path.join(directory, "2"))
    with Checkpointer(directory) as checkpointer:
        restored = checkpointer.restore_latest(placed(restored_on, offset=5.0))
    assert restored.step == 1  # the flipped byte is seen under the other sharding too
    _assert_identical(restored.state, placed(1))
    for leaf in jax.tree.leaves(restored.state):
        assert len(leaf.sharding.device_set) == restored_on


@pytest.mark.parametrize("recorded", ["device2:4d46be731a585017", "device:2a8531ad2844fe88",
                                      "host:0123456789abcdef"])
def test_a_checkpoint_of_an_older_fingerprint_scheme_restores_unverified(tmp_path, mesh,
                                                                           recorded, caplog):
    directory = str(tmp_path / "ckpt")
    with Checkpointer(directory) as checkpointer:
        checkpointer.save(1, _state(mesh), {"updates": 1})
    path = os.path.join(directory, "1", "meta", "metadata")
    with open(path) as f:
        meta = json.load(f)
    meta["fingerprint"] = recorded  # a value no longer computed: it is not checked
    with open(path, "w") as f:
        json.dump(meta, f)
    with Checkpointer(directory) as checkpointer:
        restored = checkpointer.restore_latest(_state(mesh, offset=3.0))
    assert restored.step == 1
    _assert_identical(restored.state, _state(mesh))
    assert "restored unverified" in caplog.text


def test_sigterm_becomes_a_flag_while_entered():
    previous = signal.getsignal(signal.SIGTERM)
    with Preemption() as preemption:
        assert not preemption.requested()
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption.requested()
        assert preemption.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is previous


def test_snapshot_is_a_copy(mesh):
    state = _state(mesh)
    taken = snapshot(state)
    for copy, original in zip(jax.tree.leaves(taken.state), jax.tree.leaves(state)):
        for a, b in zip(copy.addressable_shards, original.addressable_shards, strict=True):
            assert a.data.unsafe_buffer_pointer() != b.data.unsafe_buffer_pointer()
        assert copy.sharding == original.sharding
    _assert_identical(taken.state, state)
    # Host leaves are copied too: changing the caller's array later changes nothing saved.
    host = {"a": np.arange(3, dtype=np.int32)}
    taken = snapshot(host)
    host["a"][0] = 99
    assert int(taken.state["a"][0]) == 0


def _overwrite(tree):
    return jax.tree.map(lambda x: x if x.dtype == jnp.bool_ or x.dtype == jnp.uint32 else
                        x * 3 + 1, tree)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_saved_state_survives_the_caller_donating_it_right_after(tmp_path, mesh, asynchronous):
    state = _state(mesh)
    expected = jax.device_get(state)
    donate = jax.jit(_overwrite, donate_argnums=0)
    with Checkpointer(str(tmp_path), asynchronous=asynchronous) as checkpointer:
        checkpointer.save(1, state, {"updates": 1})
        after = donate(state)  # the next training step reuses the buffers at once
        restored = checkpointer.restore_latest(_state(mesh, offset=50.0))
    _assert_identical(restored.state, expected)
    assert not np.array_equal(np.asarray(after["params"]["w"]), expected["params"]["w"])


@jax.jit
def _slow(x, steps):
    # CPU work whose result the save must not wait for: 200 steps take over a second, many times
    # the save's own host work even on a loaded machine; the loop's length is an argument, so
    # that compiling it costs one step.
    def body(_, y):
        return jnp.tanh(y @ y) * 0.5
    return jax.lax.fori_loop(0, steps, body, x)


def test_asynchronous_save_does_not_wait_for_the_state(tmp_path):
    x = jnp.ones((512, 512), jnp.float32) / 512
    jax.block_until_ready(_slow(x, 1))  # compiled
    with Checkpointer(str(tmp_path), asynchronous=True) as checkpointer:
        checkpointer.save(1, {"x": x})  # compiles the copy-and-digest program for this tree
        checkpointer.wait()
        start = time.perf_counter()
        y = _slow(x, 200)
        returned_before = []
        checkpointer.save(2, {"x": y}, {"updates": 2})
        returned_before.append(not y.is_ready())
        save_seconds = time.perf_counter() - start
        jax.block_until_ready(y)
        compute_seconds = time.perf_counter() - start
        assert checkpointer.steps() == [1, 2]
        restored = checkpointer.restore(2, {"x": y})
    # The save returned while the state it saves was still being computed.
    assert returned_before == [True], (save_seconds, compute_seconds)
    np.testing.assert_array_equal(np.asarray(restored.state["x"]), np.asarray(y))
    assert restored.metadata["fingerprint"] == fingerprint({"x": y})


def test_a_failed_asynchronous_save_is_raised_by_the_next_call(tmp_path, mesh, monkeypatch):
    with Checkpointer(str(tmp_path), asynchronous=True) as checkpointer:
        def fail(*args, **kwargs):
            raise OSError("disk full")

        monkeypatch.setattr(checkpointer._manager, "save", fail)
        checkpointer.save(1, _state(mesh))
        with pytest.raises(RuntimeError, match="failed") as info:
            checkpointer.wait()
        assert isinstance(info.value.__cause__, OSError)
        monkeypatch.undo()
        checkpointer.save(2, _state(mesh))
        assert checkpointer.steps() == [2]
