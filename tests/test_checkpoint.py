"""podracer.checkpoint: round trips of sharded state, retention, corrupt and partial steps,
fingerprints, snapshots taken on the devices, asynchronous saves that neither wait for the
state nor lose it to donation, and SIGTERM turned into a flag."""

import json
import os
import signal
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import garble_arrays
from jax.sharding import NamedSharding, PartitionSpec

from podracer import checkpoint, replication
from podracer.checkpoint import (
    Checkpointer,
    Preemption,
    fingerprint,
    load_arrays,
    read_metadata,
    snapshot,
)


def _state(mesh, offset=0.0):
    """A stacked [D, ...] state with the dtypes a runner carries: floats, ints, bools, keys."""
    d = mesh.devices.size
    host = {
        "params": {"w": np.arange(d * 6, dtype=np.float32).reshape(d, 2, 3) + offset,
                   "b": np.full((d, 3), 0.5, np.float32)},
        "count": np.full((d,), 7, np.int32),
        "done": np.array([[True, False]] * d),
        "key": np.stack([np.asarray(jax.random.PRNGKey(i)) for i in range(d)]),
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
    meta["fingerprint"] = "0123456789abcdef"
    with open(path, "w") as f:
        json.dump(meta, f)


def _truncate_metadata(step_dir):
    path = os.path.join(step_dir, "meta", "metadata")
    with open(path) as f:
        data = f.read()
    with open(path, "w") as f:
        f.write(data[: len(data) // 2])


def _delete_arrays(step_dir):
    import shutil

    shutil.rmtree(os.path.join(step_dir, "state"))


# orbax leaves a callback behind when tensorstore fails to read garbled files; it reports
# "Event loop is closed" at exit, after the failure was handled.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", [garble_arrays, _forge_fingerprint, _truncate_metadata,
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


@pytest.mark.parametrize("scheme", ["host:", "device:", "device2:"])
def test_fingerprint_sees_every_bit_and_position(scheme):
    def digest(tree):
        return fingerprint(tree, scheme=scheme)

    # Narrow leaves whose sizes "device2:" packs into words (8 bytes, 4 bools, 2 halves) and
    # ones it cannot (3 halves).
    tree = {"a": jnp.arange(6, dtype=jnp.float32), "b": jnp.array([1, 2], jnp.int32),
            "c": jnp.array([True, False, False, True]), "h": jnp.ones((3,), jnp.bfloat16),
            "u": jnp.arange(8, dtype=jnp.uint8), "s": jnp.array([5, -6], jnp.int16)}
    assert digest(tree) == digest(jax.tree.map(lambda x: x.copy(), tree))
    assert digest(tree).startswith(scheme)
    a = np.asarray(tree["a"]).copy()
    a.view(np.uint32)[3] ^= 1  # the lowest mantissa bit of one element
    assert digest({**tree, "a": jnp.asarray(a)}) != digest(tree)
    swapped = np.asarray(tree["a"])[[1, 0, 2, 3, 4, 5]]
    assert digest({**tree, "a": jnp.asarray(swapped)}) != digest(tree)
    for name in ("u", "c", "s"):  # one flipped bit, and two values swapped inside a word
        flipped = np.asarray(tree[name]).copy()
        flipped.view(np.uint8)[1] ^= 0x10 if name != "c" else 1
        assert digest({**tree, name: jnp.asarray(flipped)}) != digest(tree), name
        swapped = np.asarray(tree[name])[[1, 0, *range(2, tree[name].size)]]
        assert digest({**tree, name: jnp.asarray(swapped)}) != digest(tree), name
    # Same bits in another shape or another leaf order are another state.
    assert digest({**tree, "a": tree["a"].reshape(2, 3)}) != digest(tree)
    assert digest({**tree, "u": tree["u"].reshape(2, 4)}) != digest(tree)
    assert digest([tree["a"], tree["b"]]) != digest([tree["b"], tree["a"]])


def test_the_first_device_scheme_is_unchanged():
    # Checkpoints saved before "device2:" carry "device:" fingerprints, which must still
    # verify. The value below was computed with the implementation of commit b336663.
    tree = {"a": jnp.arange(6, dtype=jnp.float32), "b": jnp.array([1, 2], jnp.int32),
            "c": jnp.array([True, False]), "h": jnp.ones((3,), jnp.bfloat16),
            "u": jnp.arange(7, dtype=jnp.uint8), "s": jnp.arange(3, dtype=jnp.int16),
            "k": jax.random.PRNGKey(3)}
    assert fingerprint(tree, scheme="device:") == "device:51193f596ea4cb58"


def _odd_tree():
    """Leaves of every kind the digest converts, sized so that words are left over after
    whole slices, and a [2, ...] uint8 board replay."""
    return {"a": jnp.arange(1001, dtype=jnp.float32) / 7, "b": jnp.arange(37, dtype=jnp.int32),
            "c": jnp.arange(105).reshape(3, 5, 7) % 3 == 0, "h": jnp.ones((3,), jnp.bfloat16),
            "u": (jnp.arange(4099) * 37 % 256).astype(jnp.uint8),
            "r": (jnp.arange(2 * 6 * 10 * 10 * 4) % 251).astype(jnp.uint8).reshape(2, 6, 10, 10, 4),
            "s": jnp.arange(5, dtype=jnp.int16), "k": jax.random.PRNGKey(3),
            "e": jnp.zeros((0,), jnp.float32)}


@pytest.mark.parametrize("block_words", [1, 3, 7, 64, None])
def test_device_digests_are_unchanged_by_digesting_in_slices(monkeypatch, block_words):
    # Saved checkpoints carry fingerprints of the whole-leaf digest, which must still verify
    # whatever slices a leaf is digested in. The values below were computed with the
    # implementation of commit 137be75, which mixed each leaf's words all at once.
    if block_words is not None:
        monkeypatch.setattr(checkpoint, "_DIGEST_BLOCK_WORDS", block_words)
    digest = jax.jit(checkpoint._digest_leaves, static_argnums=1)  # traced afresh
    leaves = jax.tree.leaves(_odd_tree())
    assert checkpoint._digest_hex(digest(leaves, True)) == "device2:4d46be731a585017"
    assert (checkpoint._digest_hex(digest(leaves, False), "device:")
            == "device:2a8531ad2844fe88")


@pytest.mark.parametrize("sharded", [False, True])
def test_the_digest_of_a_large_leaf_holds_no_copy_of_it(mesh, sharded):
    # A 512 MiB uint8 replay: the digest's compiled program needs a fixed few tens of MiB of
    # temporaries (slices of words), not the leaf's size or three times it (the whole leaf's
    # words mixed at once), and reads a leaf sharded on its leading axis where each device
    # holds it (no all-gather). Compiled only: nothing that large is allocated.
    shape = (2, 4096, 26, 10, 10, 24) if sharded else (512 << 20,)
    sharding = NamedSharding(mesh, PartitionSpec(replication.DEVICE_AXIS)) if sharded else None
    leaf = jax.ShapeDtypeStruct(shape, jnp.uint8, sharding=sharding)
    compiled = jax.jit(checkpoint._digest_leaves, static_argnums=1).lower([leaf], True).compile()
    per_device = np.prod(shape) // (2 if sharded else 1)
    assert compiled.memory_analysis().temp_size_in_bytes < per_device / 4
    assert "all-gather" not in compiled.as_text()


def test_a_checkpoint_with_a_first_scheme_fingerprint_verifies(tmp_path, mesh):
    directory = str(tmp_path / "ckpt")
    with Checkpointer(directory) as checkpointer:
        checkpointer.save(1, _state(mesh), {"updates": 1})
    path = os.path.join(directory, "1", "meta", "metadata")
    with open(path) as f:
        meta = json.load(f)
    meta["fingerprint"] = fingerprint(jax.device_get(_state(mesh)), scheme="device:")
    with open(path, "w") as f:
        json.dump(meta, f)
    with Checkpointer(directory) as checkpointer:
        restored = checkpointer.restore(1, _state(mesh, offset=3.0))
    _assert_identical(restored.state, _state(mesh))


def test_device_fingerprint_does_not_depend_on_sharding(mesh):
    state = _state(mesh)
    on_one_device = jax.device_put(jax.device_get(state), jax.devices()[0])
    for scheme in ("device:", "device2:"):
        assert (fingerprint(state, scheme=scheme)
                == fingerprint(on_one_device, scheme=scheme))


def _numpy_device2_digest(leaves: list[np.ndarray]) -> str:
    """The "device2:" digest of 4-byte leaves, from its definition, in numpy: per leaf, the
    wrapping sum of murmur3-mixed words, each XORed with its mixed position plus a lane's
    seed, then mixed with the crc32 of the leaf's place, shape and dtype; summed over leaves."""
    def mix(h):
        h = h ^ (h >> np.uint32(16))
        h = h * np.uint32(0x85EBCA6B)
        h = h ^ (h >> np.uint32(13))
        h = h * np.uint32(0xC2B2AE35)
        return h ^ (h >> np.uint32(16))

    seeds = np.array([0x9E3779B9, 0x7F4A7C15], np.uint32)
    total = np.zeros(2, np.uint32)
    for i, leaf in enumerate(leaves):
        words = np.ascontiguousarray(leaf).view(np.uint32).ravel()[:, None]
        position = np.arange(words.shape[0], dtype=np.uint32)[:, None]
        lanes = np.sum(mix(words ^ mix(position + seeds)), axis=0, dtype=np.uint32)
        layout = np.uint32(zlib.crc32(f"{i}:{leaf.shape}:{leaf.dtype}".encode()))
        total = total + mix(lanes ^ layout)
    return f"device2:{int(total[0]):08x}{int(total[1]):08x}"


def test_small_leaves_are_digested_together_where_they_live(mesh):
    # A learner state holds hundreds of small leaves (EfficientZero's: 278). The digest
    # batches them into a few reductions instead of one each (which made the program slow to
    # compile), reads leaves sharded on their leading axis where each device holds them, and
    # gives the value its definition gives.
    rng = np.random.default_rng(0)
    host = [rng.normal(size=(2, 1 + i % 7, 3)).astype(np.float32) for i in range(120)]
    host += [rng.integers(-9, 9, size=(2, 5 + i)).astype(np.int32) for i in range(80)]
    sharding = NamedSharding(mesh, PartitionSpec(replication.DEVICE_AXIS))
    leaves = [jax.device_put(x, sharding) for x in host]
    compiled = jax.jit(checkpoint._digest_leaves, static_argnums=1).lower(leaves, True).compile()
    text = compiled.as_text()
    assert "all-gather" not in text
    reductions = sum(line.count(" reduce(") for line in text.splitlines())
    assert reductions < 10, reductions  # one per leaf would be 200
    expected = _numpy_device2_digest(host)
    assert checkpoint._digest_hex(compiled(leaves)) == expected
    assert fingerprint(host, scheme="device2:") == expected  # on one device


def test_sigterm_becomes_a_flag_while_entered():
    previous = signal.getsignal(signal.SIGTERM)
    with Preemption() as preemption:
        assert not preemption.requested()
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption.requested()
        assert preemption.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is previous


def test_snapshot_is_a_copy_with_the_device_fingerprint(mesh):
    state = _state(mesh)
    taken = snapshot(state)
    for copy, original in zip(jax.tree.leaves(taken.state), jax.tree.leaves(state)):
        for a, b in zip(copy.addressable_shards, original.addressable_shards, strict=True):
            assert a.data.unsafe_buffer_pointer() != b.data.unsafe_buffer_pointer()
        assert copy.sharding == original.sharding
    _assert_identical(taken.state, state)
    assert taken.fingerprint() == fingerprint(state, on_device=True)
    # Host leaves are copied too: changing the caller's array later changes nothing saved.
    host = {"a": np.arange(3, dtype=np.int32)}
    taken = snapshot(host)
    host["a"][0] = 99
    assert int(taken.state["a"][0]) == 0
    assert taken.fingerprint() == fingerprint({"a": np.arange(3, dtype=np.int32)},
                                              on_device=True)


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
def _slow(x):
    # About a second or more of CPU work whose result the save must not wait for.
    def body(_, y):
        return jnp.tanh(y @ y) * 0.5
    return jax.lax.fori_loop(0, 60, body, x)


def test_asynchronous_save_does_not_wait_for_the_state(tmp_path):
    x = jnp.ones((512, 512), jnp.float32) / 512
    jax.block_until_ready(_slow(x))  # compiled
    with Checkpointer(str(tmp_path), asynchronous=True) as checkpointer:
        checkpointer.save(1, {"x": x})  # compiles the copy-and-digest program for this tree
        checkpointer.wait()
        start = time.perf_counter()
        y = _slow(x)
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
    assert restored.metadata["fingerprint"].startswith("device2:")


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
