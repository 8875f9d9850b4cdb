"""On-device experience replay: a fixed-capacity ring of items that lives on the learner
devices and is added to, sampled and re-prioritised inside the compiled train step.

Following the in-GPU experience replay design, experience crosses to the accelerator once and
never comes back to the host. An *item* is a whole trajectory segment written atomically in
one slot, so a sample can never span old and new data however the ring wraps. In a replicated
learner every device holds its own buffer (the learner state is stacked over the device axis),
so the buffer is sharded across the learner devices with no extra code.

`make_replay` returns an optax-style set of pure functions:

    replay = make_replay(capacity=..., alpha=0.6, beta=0.4)
    state = replay.init(example_item)               # zeros; memory = replay_bytes(...)
    state = replay.add(state, items)                # items: [N, ...], at max priority
    sample = replay.sample(state, key, batch_size)  # indices, items, importance weights
    state = replay.update(state, sample.indices, new_priorities)

`alpha = 0` samples uniformly over the filled slots (Schaul et al. 2016 with alpha = 0).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from podracer.types import Array, PRNGKey


@chex.dataclass(frozen=True)
class ReplayState:
    items: Any  # pytree, leaves [capacity, ...] in their native dtypes
    priorities: Array  # [capacity] float32; 0 marks an empty slot
    max_priority: Array  # [] float32, given to new items
    next_index: Array  # [] int32, the slot the next add writes first
    size: Array  # [] int32, filled slots


@chex.dataclass(frozen=True)
class ReplaySample:
    indices: Array  # [B] int32 slots, for `update`
    items: Any  # pytree, leaves [B, ...]
    weights: Array  # [B] float32 importance weights, max-normalised over the batch
    probabilities: Array  # [B] float32 the probability each slot had of being drawn


class Replay(NamedTuple):
    init: Callable[[Any], ReplayState]
    add: Callable[[ReplayState, Any], ReplayState]
    sample: Callable[[ReplayState, PRNGKey, int], ReplaySample]
    update: Callable[[ReplayState, Array, Array], ReplayState]


def replay_bytes(capacity: int, example_item: Any) -> int:
    """Bytes a buffer of `capacity` items like `example_item` occupies (items + priorities).

    `example_item` may hold arrays or `jax.ShapeDtypeStruct`s: nothing is allocated."""
    def nbytes(x: Any) -> int:
        if not hasattr(x, "shape"):  # Python scalars
            x = np.asarray(x)
        return int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize

    per_item = sum(nbytes(x) for x in jax.tree.leaves(example_item))
    return int(capacity * (per_item + 4))


def device_memory_bytes(device: jax.Device) -> int | None:
    """How many bytes `device` can hold, when the backend says (GPUs and TPUs do); on CPU the
    host's physical memory."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001  (backends without memory stats raise various errors)
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    return None


def make_replay(capacity: int, *, alpha: float = 0.0, beta: float = 1.0,
                epsilon: float = 1e-6) -> Replay:
    """A replay of `capacity` items; `alpha > 0` makes it prioritised (P(i) ∝ p_i^alpha) with
    importance weights (N P(i))^-beta normalised by the batch's largest."""
    if capacity < 1:
        raise ValueError(f"replay capacity must be >= 1, got {capacity}")

    def init(example_item: Any) -> ReplayState:
        items = jax.tree.map(
            lambda x: jnp.zeros((capacity,) + tuple(jnp.shape(x)), jnp.asarray(x).dtype),
            example_item,
        )
        return ReplayState(
            items=items,
            priorities=jnp.zeros((capacity,), jnp.float32),
            max_priority=jnp.ones((), jnp.float32),
            next_index=jnp.zeros((), jnp.int32),
            size=jnp.zeros((), jnp.int32),
        )

    def add(state: ReplayState, items: Any) -> ReplayState:
        num = jax.tree.leaves(items)[0].shape[0]
        if num > capacity:
            raise ValueError(f"adding {num} items to a replay of capacity {capacity}")
        slots = (state.next_index + jnp.arange(num, dtype=jnp.int32)) % capacity
        stored = jax.tree.map(lambda buf, x: buf.at[slots].set(x.astype(buf.dtype)),
                              state.items, items)
        return ReplayState(
            items=stored,
            priorities=state.priorities.at[slots].set(state.max_priority),
            max_priority=state.max_priority,
            next_index=(state.next_index + num) % capacity,
            size=jnp.minimum(state.size + num, capacity),
        )

    def probabilities(state: ReplayState) -> Array:
        filled = state.priorities > 0
        if alpha == 0.0:
            scores = filled.astype(jnp.float32)
        else:
            scores = jnp.where(filled, (state.priorities + epsilon) ** alpha, 0.0)
        return scores / jnp.maximum(scores.sum(), 1e-30)

    def sample(state: ReplayState, key: PRNGKey, batch_size: int) -> ReplaySample:
        probs = probabilities(state)
        indices = jax.random.choice(key, capacity, (batch_size,), p=probs).astype(jnp.int32)
        p = probs[indices]
        weights = (state.size.astype(jnp.float32) * p) ** (-beta)
        weights = weights / jnp.max(weights)
        items = jax.tree.map(lambda buf: buf[indices], state.items)
        return ReplaySample(indices=indices, items=items, weights=weights, probabilities=p)

    def update(state: ReplayState, indices: Array, priorities: Array) -> ReplayState:
        priorities = jnp.maximum(priorities.astype(jnp.float32), epsilon)
        return state.replace(
            priorities=state.priorities.at[indices].set(priorities),
            max_priority=jnp.maximum(state.max_priority, priorities.max()),
        )

    return Replay(init=init, add=add, sample=sample, update=update)
