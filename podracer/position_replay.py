"""On-device replay of positions: overlapping windows of a stream with per-position priorities.

A learner receives each environment's stream in trajectories of T steps. A model-based
learner samples a *position* of that stream and needs the P = K + n timesteps after it (its
K-step unroll and n-step target) and, for stacked image observations, the H timesteps before
it (the frames of its stack), whichever trajectory they arrived in. This replay stores, for
each environment column and each trajectory, one *window* of L = H + P + T timesteps: the
H + P timesteps already stored at the end of the column's previous window (the tail) followed
by the T new ones, written atomically in one slot. Window i of a column starts at stream time
i T - P - H and *owns* the T positions i T - P .. i T + T - P - 1; every stream position is
owned by exactly one window, and the window holds the H timesteps before it and the P after it:

    window i:   | H history | P lookahead (tail) |         T new timesteps          |
    owned:                  |<-------------- T positions ------------->|
    sampled:    window[u : u + H + P + 1] for owned position u in [0, T)

So a sampled position's unroll and n-step target never stop at a trajectory's edge. The tail
is read from the ring itself (the column's previous window is B slots back when every add
writes the same B columns), so the learner state holds nothing else. The positions of a
column's very first window that lie before the stream began are never sampled.

Each owned position has its own priority; new positions get the largest priority seen so far.
Sampling draws positions with P(i) ∝ p_i^alpha over the sampleable ones (alpha = 0: uniform)
and returns importance weights (M P(i))^-beta normalised by the batch's largest, M being the
number of sampleable positions (Schaul et al., 2016). alpha and beta are arguments of
`sample`, so they can be traced (swept, scheduled). Everything is a pure function over
`PositionReplayState` (optax style) and runs inside the compiled learner step; in a replicated
learner each device holds its own replay (the learner state is stacked over the device axis).

    replay = make_position_replay(capacity=1024, period=T, lookahead=K + n, history=3)
    state = replay.init(example_step)          # one timestep's fields, unbatched
    state = replay.add(state, steps, sampleable)     # steps: [T, B, ...] time-major
    sample = replay.sample(state, key, batch_size, alpha=0.6, beta=0.4)
    state = replay.update(state, sample.slots, sample.positions, new_priorities)
    state = replay.refresh(state, priority_fn, batch_windows=256)   # Priority Refresh
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
class PositionReplayState:
    items: Any  # pytree, leaves [N, L, ...]: N windows of L = H + P + T timesteps
    sampleable: Array  # [N, L] bool, the agent's flag for each stored timestep
    priorities: Array  # [N, T] float32 of the owned positions; 0 = empty or not sampleable
    max_priority: Array  # [] float32, given to new positions
    next_index: Array  # [] int32, the slot the next add writes first
    adds: Array  # [] int32, add calls so far (0: no column has a tail yet)


@chex.dataclass(frozen=True)
class PositionSample:
    slots: Array  # [S] int32 window slots, for `update`
    positions: Array  # [S] int32 owned position u in [0, T) of each, for `update`
    windows: Any  # pytree, leaves [S, H + P + 1, ...]; index H is the sampled position
    weights: Array  # [S] float32 importance weights, max-normalised over the batch
    probabilities: Array  # [S] float32 the probability each position had of being drawn


class PositionReplay(NamedTuple):
    init: Callable[[Any], PositionReplayState]
    add: Callable[[PositionReplayState, Any, Array], PositionReplayState]
    sample: Callable[..., PositionSample]
    update: Callable[[PositionReplayState, Array, Array, Array], PositionReplayState]
    size: Callable[[PositionReplayState], Array]
    refresh: Callable[..., PositionReplayState]


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


def position_replay_bytes(capacity: int, example_step: Any, *, period: int, lookahead: int,
                          history: int = 0) -> int:
    """Bytes a replay of `capacity` windows occupies (timesteps, flags and priorities).

    `example_step` may hold arrays or `jax.ShapeDtypeStruct`s: nothing is allocated."""
    def nbytes(x: Any) -> int:
        if not hasattr(x, "shape"):  # Python scalars
            x = np.asarray(x)
        return int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize

    length = history + lookahead + period
    per_step = sum(nbytes(x) for x in jax.tree.leaves(example_step)) + 1  # + sampleable flag
    return int(capacity * (length * per_step + 4 * period))


UNIFORM_PROPOSALS = 8  # proposals per draw before the exact fallback of `draw_uniform`


def is_static_zero(alpha: Any) -> bool:
    """Whether `alpha` is a Python (or NumPy) number equal to 0: uniform sampling known
    while tracing, which `sample` draws without reading every priority."""
    return isinstance(alpha, (int, float, np.number)) and not isinstance(alpha, bool) and (
        float(alpha) == 0.0)


def cond_for_any(pred: Array, true_fn: Callable[[Any], Any], false_fn: Callable[[Any], Any],
                 operands: Any) -> Any:
    """`lax.cond(pred, true_fn, false_fn, operands)` that stays a branch under `vmap`.

    `lax.cond` with a batched predicate computes both branches and selects, so an expensive
    branch that almost never runs would run at every call of a sweep. Here a batch takes
    `true_fn` for every element when any element's `pred` holds, so `true_fn` must return an
    element whose `pred` is false as `false_fn` would. The branches read only `operands`
    (`custom_vmap` refuses batched values closed over)."""
    @jax.custom_batching.custom_vmap
    def branch(pred, operands):
        return jax.lax.cond(pred, true_fn, false_fn, operands)

    @branch.def_vmap
    def branch_batched(axis_size, in_batched, pred, operands):
        pred_batched, operands_batched = in_batched
        operands = jax.tree.map(
            lambda x, b: x if b else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x)),
            operands, operands_batched)
        pred = jnp.any(pred) if pred_batched else pred
        out = cond_for_any(pred, jax.vmap(true_fn), jax.vmap(false_fn), operands)
        return out, jax.tree.map(lambda _: True, out)

    return branch(pred, operands)


def draw_uniform(key: PRNGKey, batch_size: int, operands: Any, *,
                 propose: Callable[[Any, PRNGKey, tuple[int, ...]], Array],
                 accept: Callable[[Any, Array], Array],
                 exact: Callable[[Any, PRNGKey, int], Array]) -> Array:
    """`batch_size` indices drawn independently and uniformly from the accepted ones, in time
    that does not grow with the replay when most proposals are accepted.

    Each draw takes the first accepted of `UNIFORM_PROPOSALS` proposals
    (`propose(operands, key, shape)`: indices drawn uniformly from a set that holds every
    acceptable index; `accept(operands, indices)`: which are), which is uniform over the
    accepted. Draws without one (a replay where few indices can be sampled) are made by
    `exact(operands, key, S)`, an inverse-CDF draw over the whole replay, which then runs once
    for the batch (`cond_for_any`: under `vmap`, once for a sweep when any run needs it).
    `operands` holds the arrays the three functions read."""
    propose_key, exact_key = jax.random.split(key)
    candidates = propose(operands, propose_key, (batch_size, UNIFORM_PROPOSALS))
    candidates = candidates.astype(jnp.int32)
    ok = accept(operands, candidates)
    first = jnp.argmax(ok, axis=1)
    indices = jnp.take_along_axis(candidates, first[:, None], axis=1)[:, 0]
    found = jnp.any(ok, axis=1)

    def fill(args):
        operands, key, indices, found = args
        drawn = exact(operands, key, batch_size).astype(jnp.int32)
        return jnp.where(found, indices, drawn)

    return cond_for_any(~jnp.all(found), fill, lambda args: args[2],
                        (operands, exact_key, indices, found))


def draw_positions(cumulative: Array, valid: Array, u: Array) -> Array:
    """Inverse-CDF draws: for each `u` in [0, 1), the first index whose cumulative probability
    reaches `u` times the total, moved to the nearest valid index after it (else before it).

    A float32 cumulative sum is not exact: XLA's `cumsum` adds in a tree, so across an
    entry of probability zero the running sum can still rise or fall by an ulp
    (measured: 89 of 6,958 zero entries among 100,000), and plain inverse-CDF sampling
    (`jax.random.choice`) then draws, about once in 10^5-10^6 draws, a position that cannot
    be sampled: an empty or terminal one, whose importance weight is infinite. Moving such a
    draw to a valid neighbour changes the probabilities by at most that rounding.

    Args:
      cumulative: [N] running sum of the probabilities.
      valid: [N] bool, the indices that may be returned (probability > 0).
      u: [S] uniforms in [0, 1).
    Returns:
      [S] int32 indices, all valid when any index is.
    """
    n = cumulative.shape[0]
    index = jnp.arange(n, dtype=jnp.int32)
    r = cumulative[-1] * (1.0 - u)  # in (0, total]
    drawn = jnp.minimum(jnp.searchsorted(cumulative, r).astype(jnp.int32), n - 1)
    next_valid = jax.lax.cummin(jnp.where(valid, index, n), reverse=True)
    previous_valid = jax.lax.cummax(jnp.where(valid, index, -1))
    after, before = next_valid[drawn], previous_valid[drawn]
    return jnp.where(after < n, after, jnp.maximum(before, 0)).astype(jnp.int32)


def make_position_replay(capacity: int, *, period: int, lookahead: int, history: int = 0,
                         epsilon: float = 1e-6) -> PositionReplay:
    """A replay of `capacity` windows, each owning `period` (T) positions that can be sampled
    with `history` (H) timesteps before and `lookahead` (P) after them."""
    if capacity < 1 or period < 1 or lookahead < 0 or history < 0:
        raise ValueError(f"position replay needs capacity, period >= 1 and lookahead, history "
                         f">= 0; got {capacity}, {period}, {lookahead}, {history}")
    tail = history + lookahead
    length = tail + period

    def init(example_step: Any) -> PositionReplayState:
        items = jax.tree.map(
            lambda x: jnp.zeros((capacity, length) + tuple(jnp.shape(x)), jnp.asarray(x).dtype),
            example_step,
        )
        return PositionReplayState(
            items=items,
            sampleable=jnp.zeros((capacity, length), bool),
            priorities=jnp.zeros((capacity, period), jnp.float32),
            max_priority=jnp.ones((), jnp.float32),
            next_index=jnp.zeros((), jnp.int32),
            adds=jnp.zeros((), jnp.int32),
        )

    def add(state: PositionReplayState, steps: Any, sampleable: Array) -> PositionReplayState:
        """Appends T new timesteps of B columns (`steps` leaves [T, B, ...], `sampleable`
        [T, B] bool). Every add must hand over the same B columns in the same order."""
        chex.assert_rank(sampleable, 2)
        t, b = sampleable.shape
        if t != period:
            raise ValueError(f"adding {t} timesteps per column to a replay of period {period}")
        if b > capacity:
            raise ValueError(f"adding {b} columns to a replay of {capacity} windows")
        columns = jnp.arange(b, dtype=jnp.int32)
        previous = (state.next_index - b + columns) % capacity  # [B] each column's last window
        slots = (state.next_index + columns) % capacity  # [B]

        def window(buf, new):  # buf [N, L, ...], new [T, B, ...] -> [B, L, ...]
            return jnp.concatenate([buf[previous, period:], jnp.swapaxes(new, 0, 1)], axis=1)

        items = jax.tree.map(lambda buf, new: buf.at[slots].set(window(buf, new).astype(
            buf.dtype)), state.items, steps)
        flags = window(state.sampleable, sampleable.astype(bool))  # [B, L]
        has_tail = state.adds > 0
        # Owned position u sits at window index H + u; before the stream began when u < P in
        # a column's first window.
        owned_ok = flags[:, history:history + period] & (
            has_tail | (jnp.arange(period) >= lookahead))[None, :]
        return PositionReplayState(
            items=items,
            sampleable=state.sampleable.at[slots].set(flags),
            priorities=state.priorities.at[slots].set(
                jnp.where(owned_ok, state.max_priority, 0.0)),
            max_priority=state.max_priority,
            next_index=(state.next_index + b) % capacity,
            adds=state.adds + 1,
        )

    def probabilities(state: PositionReplayState, alpha: Array) -> Array:
        """[N * T] P(i) ∝ p_i^alpha over the sampleable positions (p_i > 0)."""
        p = state.priorities.reshape(-1)
        scores = jnp.where(p > 0, (p + epsilon) ** alpha, 0.0)
        return scores / jnp.maximum(scores.sum(), 1e-30)

    def sample(state: PositionReplayState, key: PRNGKey, batch_size: int, *,
               alpha: float | Array, beta: float | Array) -> PositionSample:
        probs = probabilities(state, jnp.asarray(alpha, jnp.float32))
        u = jax.random.uniform(key, (batch_size,), jnp.float32)
        flat = draw_positions(jnp.cumsum(probs), probs > 0, u)
        slots, positions = flat // period, flat % period
        p = probs[flat]
        num = size(state).astype(jnp.float32)
        weights = (num * p) ** (-jnp.asarray(beta, jnp.float32))
        weights = weights / jnp.max(weights)
        offsets = positions[:, None] + jnp.arange(tail + 1)[None, :]  # [S, H + P + 1]
        windows = jax.tree.map(lambda buf: buf[slots[:, None], offsets], state.items)
        return PositionSample(slots=slots, positions=positions, windows=windows,
                              weights=weights, probabilities=p)

    def update(state: PositionReplayState, slots: Array, positions: Array,
               priorities: Array) -> PositionReplayState:
        priorities = jnp.maximum(priorities.astype(jnp.float32), epsilon)
        return state.replace(
            priorities=state.priorities.at[slots, positions].set(priorities),
            max_priority=jnp.maximum(state.max_priority, priorities.max()),
        )

    def refresh(state: PositionReplayState, priority_fn: Callable[[Any], Array],
                batch_windows: int) -> PositionReplayState:
        """Every sampleable position's priority recomputed by `priority_fn` (stored windows,
        leaves [b, L, ...] -> [b, T] priorities of the positions they own), `batch_windows`
        windows at a time inside one compiled loop; unsampleable positions stay at 0 and
        the largest priority (given to new data) becomes the largest refreshed one."""
        b = min(batch_windows, capacity)
        batches = -(-capacity // b)

        def body(i, priorities):
            start = jnp.minimum(i * b, capacity - b)  # the last batch may overlap the one before
            items = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, b),
                                 state.items)
            old = jax.lax.dynamic_slice_in_dim(priorities, start, b)
            new = jnp.where(old > 0, jnp.maximum(priority_fn(items).astype(jnp.float32),
                                                 epsilon), 0.0)
            return jax.lax.dynamic_update_slice_in_dim(priorities, new, start, 0)

        priorities = jax.lax.fori_loop(0, batches, body, state.priorities)
        return state.replace(priorities=priorities,
                             max_priority=jnp.maximum(priorities.max(), epsilon))

    def size(state: PositionReplayState) -> Array:
        """[] int32: the positions that can be sampled."""
        return jnp.sum(state.priorities > 0).astype(jnp.int32)

    return PositionReplay(init=init, add=add, sample=sample, update=update, size=size,
                          refresh=refresh)
