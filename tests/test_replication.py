"""The replication helper on 8 simulated CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podracer import replication
from podracer.types import DEVICE_AXIS


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() == 8, "tests/conftest.py should simulate 8 CPU devices"
    return replication.make_mesh()


def test_pmean_and_psum_span_every_device(mesh):
    values = replication.from_global(np.arange(8, dtype=np.float32), mesh)

    def per_device(x):
        return jax.lax.pmean(x, DEVICE_AXIS), jax.lax.psum(x, DEVICE_AXIS), x * 2

    mean, total, doubled = replication.replicate(per_device, mesh)(values)
    np.testing.assert_array_equal(np.asarray(mean), np.full(8, 3.5))  # (0 + ... + 7) / 8
    np.testing.assert_array_equal(np.asarray(total), np.full(8, 28.0))
    np.testing.assert_array_equal(np.asarray(doubled), np.arange(8) * 2.0)


def test_each_slice_lives_on_its_own_device(mesh):
    stacked = replication.from_global(np.arange(16, dtype=np.int32).reshape(8, 2), mesh)
    shards = sorted(stacked.addressable_shards, key=lambda s: s.index[0].start)
    assert [s.device for s in shards] == list(mesh.devices.flat)
    for i, shard in enumerate(shards):
        np.testing.assert_array_equal(np.asarray(shard.data), [[2 * i, 2 * i + 1]])


def test_broadcast_and_unreplicate_round_trip(mesh):
    tree = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(())}
    stacked = replication.broadcast(tree, mesh)
    assert stacked["w"].shape == (8, 2, 3)
    for slice_ in replication.local_slices(stacked):
        np.testing.assert_array_equal(slice_["w"], tree["w"])
    np.testing.assert_array_equal(replication.unreplicate(stacked)["b"], 1.0)


def test_a_sub_mesh_uses_only_its_devices(mesh):
    sub = replication.make_mesh(jax.devices()[2:4])
    x = replication.from_global(np.array([1.0, 3.0], np.float32), sub)
    out = replication.replicate(lambda v: jax.lax.pmean(v, DEVICE_AXIS), sub)(x)
    assert {s.device for s in out.addressable_shards} == set(jax.devices()[2:4])
    np.testing.assert_array_equal(np.asarray(out), [2.0, 2.0])
