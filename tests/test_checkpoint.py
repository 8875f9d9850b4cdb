"""podracer.checkpoint: round trips of sharded state, retention, corrupt and partial steps,
fingerprints, and SIGTERM turned into a flag."""

import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import garble_arrays

from podracer import replication
from podracer.checkpoint import (
    Checkpointer,
    Preemption,
    fingerprint,
    load_arrays,
    read_metadata,
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
    meta = json.load(open(path))
    meta["fingerprint"] = "0123456789abcdef"
    json.dump(meta, open(path, "w"))


def _truncate_metadata(step_dir):
    path = os.path.join(step_dir, "meta", "metadata")
    data = open(path).read()
    open(path, "w").write(data[: len(data) // 2])


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
    open(os.path.join(partial, "state", "manifest.ocdbt"), "wb").write(b"\x00" * 10)

    with Checkpointer(directory) as checkpointer:
        assert checkpointer.steps() == [1]
        restored = checkpointer.restore_latest(_state(mesh))
    assert restored.step == 1
    assert read_metadata(directory)["updates"] == 1


@pytest.mark.parametrize("on_device", [False, True])
def test_fingerprint_sees_every_bit_and_position(on_device):
    def digest(tree):
        return fingerprint(tree, on_device=on_device)

    tree = {"a": jnp.arange(6, dtype=jnp.float32), "b": jnp.array([1, 2], jnp.int32),
            "c": jnp.array([True, False]), "h": jnp.ones((3,), jnp.bfloat16)}
    assert digest(tree) == digest(jax.tree.map(lambda x: x.copy(), tree))
    assert digest(tree).startswith("device:" if on_device else "host:")
    a = np.asarray(tree["a"]).copy()
    a.view(np.uint32)[3] ^= 1  # the lowest mantissa bit of one element
    assert digest({**tree, "a": jnp.asarray(a)}) != digest(tree)
    swapped = np.asarray(tree["a"])[[1, 0, 2, 3, 4, 5]]
    assert digest({**tree, "a": jnp.asarray(swapped)}) != digest(tree)
    # Same bits in another shape or another leaf order are another state.
    assert digest({**tree, "a": tree["a"].reshape(2, 3)}) != digest(tree)
    assert digest([tree["a"], tree["b"]]) != digest([tree["b"], tree["a"]])


def test_device_fingerprint_does_not_depend_on_sharding(mesh):
    state = _state(mesh)
    on_one_device = jax.device_put(jax.device_get(state), jax.devices()[0])
    assert fingerprint(state, on_device=True) == fingerprint(on_one_device, on_device=True)


def test_sigterm_becomes_a_flag_while_entered():
    previous = signal.getsignal(signal.SIGTERM)
    with Preemption() as preemption:
        assert not preemption.requested()
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption.requested()
        assert preemption.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is previous
