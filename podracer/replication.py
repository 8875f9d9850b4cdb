"""The one replication helper: a per-device program mapped over a named device axis.

Every replicated value is *stacked*: a pytree whose leaves have a leading axis of size D (one
slice per device), as with `pmap`. `replicate(fn, mesh)` returns a compiled function that
runs `fn` on each device's slice with the axis name `DEVICE_AXIS` bound, so `fn` can call
`jax.lax.pmean(x, DEVICE_AXIS)`. It is built on `jax.shard_map` over a 1-D mesh (in current
JAX `jax.pmap` is itself a shim over `shard_map`); the mesh may hold the devices of every
process when `jax.distributed` is initialised, and then collectives span processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from podracer.types import DEVICE_AXIS


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh named `DEVICE_AXIS`; by default over all devices of all processes."""
    devices = list(jax.devices() if devices is None else devices)
    return Mesh(np.asarray(devices), (DEVICE_AXIS,))


def stacked_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(DEVICE_AXIS))


def local_devices(mesh: Mesh) -> list[jax.Device]:
    """The mesh's devices that this process addresses, in mesh order."""
    pid = jax.process_index()
    return [d for d in mesh.devices.flat if d.process_index == pid]


def _from_local_slices(slices: Callable[[int], Any], mesh: Mesh, example: Any) -> Any:
    """Builds stacked global arrays from per-local-device slices `slices(i)` (a pytree)."""
    devices = local_devices(mesh)
    num_global = mesh.devices.size
    sharding = stacked_sharding(mesh)
    per_device = [slices(i) for i in range(len(devices))]

    def build(path_index: int, leaf_example: Any) -> jax.Array:
        del leaf_example
        arrays = [
            jax.device_put(jnp.expand_dims(leaves[path_index], 0), d)
            for leaves, d in zip(flat_slices, devices)
        ]
        shape = (num_global,) + arrays[0].shape[1:]
        return jax.make_array_from_single_device_arrays(shape, sharding, arrays)

    flat_slices = [jax.tree.leaves(s) for s in per_device]
    leaves, treedef = jax.tree.flatten(example)
    return jax.tree.unflatten(treedef, [build(i, leaf) for i, leaf in enumerate(leaves)])


def broadcast(tree: Any, mesh: Mesh) -> Any:
    """One identical copy of `tree` per device, stacked along a new leading axis."""
    return _from_local_slices(lambda i: tree, mesh, tree)


def distribute(stacked_local: Any, mesh: Mesh) -> Any:
    """Places a host pytree whose leading axis indexes this process's devices, one per device."""
    return _from_local_slices(lambda i: jax.tree.map(lambda x: x[i], stacked_local), mesh,
                              stacked_local)


def from_global(global_stacked: Any, mesh: Mesh) -> Any:
    """Places a host pytree whose leading axis indexes *all* the mesh's devices (every process
    holds the same copy); each process puts only its own devices' slices."""
    sharding = stacked_sharding(mesh)
    return jax.tree.map(
        lambda x: jax.make_array_from_callback(np.shape(x), sharding, lambda idx: x[idx]),
        global_stacked,
    )


def unreplicate(stacked: Any) -> Any:
    """The slice held by this process's first device (all are equal for replicated values)."""
    return jax.tree.map(lambda x: x.addressable_shards[0].data[0], stacked)


def local_slices(stacked: Any) -> list[Any]:
    """Every slice this process holds, in device order (for checks across devices)."""
    leaves, treedef = jax.tree.flatten(stacked)
    n = len(leaves[0].addressable_shards)
    return [
        jax.tree.unflatten(treedef, [np.asarray(x.addressable_shards[i].data[0]) for x in leaves])
        for i in range(n)
    ]


def replicate(
    fn: Callable[..., Any],
    mesh: Mesh,
    *,
    donate_argnums: int | Sequence[int] = (),
) -> Callable[..., Any]:
    """Maps `fn` over the leading (device) axis of every argument and output.

    `fn` sees one device's slice (leading axis removed) and may use collectives over
    `DEVICE_AXIS`. The result is jitted; call `.lower(*args).compile()` on it to compile ahead
    of time.
    """
    spec = PartitionSpec(DEVICE_AXIS)

    def per_device(*args):
        args = jax.tree.map(lambda x: x[0], args)
        out = fn(*args)
        return jax.tree.map(lambda x: jnp.expand_dims(x, 0), out)

    # Every input and output is device-varying (stacked), so there is nothing for the
    # replication checker to prove; it is off because loop carries initialised from constants
    # would otherwise need explicit casts.
    mapped = jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    return jax.jit(mapped, donate_argnums=donate_argnums)
