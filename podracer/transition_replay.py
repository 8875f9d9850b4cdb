"""On-device replay of transitions with n-step lookahead: uniform or prioritised.

A learner receives each environment's stream in trajectories `[T+1, B]` whose last timestep
arrives again as the next trajectory's first. This replay stores the T new timesteps
o_0 .. o_{T-1} of each trajectory (with the action taken at each), one ring slot per timestep,
time-major: the B columns of time t, then those of t + 1, and so on across adds. With the
same B columns in the same order at every add, the timestep k steps after the one in slot s
is in slot (s + k B) mod N, whichever add it arrived in, so a sampled position reads its
n-step lookahead without a trajectory edge in the way and no timestep is stored twice:

    slot:   ... | t: b_0 .. b_{B-1} | t+1: b_0 .. b_{B-1} | ... | t+n: b_0 .. b_{B-1} | ...
    sampled position s: items at s, s + B, ..., s + n B  (leaves [S, n + 1, ...])

A position can be sampled once its n following timesteps are stored (the newest n B slots
wait for the next add) and when the agent flagged it (typically: not LAST, where no action is
taken). Where the episode ends inside the lookahead the agent stops there (`n_step_target`).

Each position has its own priority; new positions get the largest priority seen so far.
Sampling draws positions with P(i) ∝ p_i^alpha over the sampleable ones (alpha = 0: uniform)
and returns importance weights (M P(i))^-beta normalised by the batch's largest, M being the
number of sampleable positions (Schaul et al., 2016). alpha and beta are arguments of `sample`,
so they can be traced (swept, scheduled). Those draws read every priority; alpha given as a
Python 0 draws uniformly by rejection instead (`position_replay.draw_uniform`), reading only
the slots it proposes, so its time does not grow with the capacity (the weights are then 1).
Everything is a pure function over `TransitionReplayState` (optax style), a pytree of arrays that runs inside the compiled
learner step, is checkpointed with the learner state and is batched by `vmap` over runs; in a
replicated learner each device holds its own replay.

    replay = make_transition_replay(capacity=65536, lookahead=n)
    state = replay.init(example_step)                 # one timestep's fields, unbatched
    state = replay.add(state, steps, sampleable)      # steps: [T, B, ...] time-major
    sample = replay.sample(state, key, batch_size, alpha=0.6, beta=0.4)
    state = replay.update_priorities(state, sample.indices, new_priorities)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from podracer.position_replay import draw_positions, draw_uniform, is_static_zero
from podracer.types import Array, PRNGKey


@chex.dataclass(frozen=True)
class TransitionReplayState:
    items: Any  # pytree, leaves [N, ...]: N timesteps, time-major over adds
    priorities: Array  # [N] float32; 0 = empty or not sampleable
    max_priority: Array  # [] float32, given to new positions
    next_index: Array  # [] int32, the slot the next add writes first
    stored: Array  # [] int32, slots written so far, at most N
    columns: Array  # [] int32, B of the adds: the slot stride from one timestep to the next


@chex.dataclass(frozen=True)
class TransitionSample:
    indices: Array  # [S] int32 slots of the sampled positions, for `update_priorities`
    items: Any  # pytree, leaves [S, n + 1, ...]: the position and the n timesteps after it
    weights: Array  # [S] float32 importance weights, max-normalised over the batch
    probabilities: Array  # [S] float32 the probability each position had of being drawn


class TransitionReplay(NamedTuple):
    init: Callable[[Any], TransitionReplayState]
    add: Callable[[TransitionReplayState, Any, Array], TransitionReplayState]
    sample: Callable[..., TransitionSample]
    update_priorities: Callable[[TransitionReplayState, Array, Array], TransitionReplayState]
    size: Callable[[TransitionReplayState], Array]


def transition_replay_bytes(capacity: int, example_step: Any) -> int:
    """Bytes a replay of `capacity` timesteps occupies (timesteps and priorities).

    `example_step` may hold arrays or `jax.ShapeDtypeStruct`s: nothing is allocated."""
    def nbytes(x: Any) -> int:
        if not hasattr(x, "shape"):  # Python scalars
            x = np.asarray(x)
        return int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize

    per_step = sum(nbytes(x) for x in jax.tree.leaves(example_step)) + 4  # + priority
    return int(capacity) * per_step


def n_step_target(reward: Array, discount: Array, last: Array, *,
                  gamma: float | Array) -> tuple[Array, Array, Array]:
    """The n-step return from a position and where it bootstraps, stopping at an episode's
    end (Sutton & Barto, 2018, 7.1):

        k = the first j in 1..n whose timestep is LAST, else n
        G = sum_{j=1..k} gamma^(j-1) (prod_{i<j} d_i) r_j,   bootstrap discount gamma^k prod_{i<=k} d_i

    so a terminal (d = 0) ends the return and a truncation (LAST with d = 1) bootstraps from
    the episode's final observation.

    Args:
      reward: [n] r_1 .. r_n, received on arriving at the n timesteps after the position.
      discount: [n] d_1 .. d_n, the environment's discounts at them.
      last: [n] bool, which of them is LAST.
      gamma: the agent's discount per step.
    Returns:
      G [], the bootstrap discount [], and k [] int32, the index (1..n) of the timestep to
      bootstrap from.
    """
    chex.assert_rank([reward, discount, last], 1)
    n = reward.shape[0]
    last = last.astype(bool)
    ended_before = jnp.cumsum(last.astype(jnp.int32)) - last.astype(jnp.int32) > 0  # [n]
    alive = 1.0 - ended_before.astype(jnp.float32)  # j <= k
    gammas = jnp.asarray(gamma, jnp.float32) ** jnp.arange(n, dtype=jnp.float32)
    discounts_before = jnp.cumprod(jnp.concatenate([jnp.ones((1,)), discount[:-1]]))
    g = jnp.sum(alive * gammas * discounts_before * reward)
    k = jnp.where(jnp.any(last), jnp.argmax(last) + 1, n).astype(jnp.int32)
    to_k = jnp.arange(1, n + 1) <= k
    bootstrap = jnp.asarray(gamma, jnp.float32) ** k * jnp.prod(jnp.where(to_k, discount, 1.0))
    return g, bootstrap, k


def make_transition_replay(capacity: int, *, lookahead: int,
                           epsilon: float = 1e-6) -> TransitionReplay:
    """A replay of `capacity` timesteps whose positions are sampled with the `lookahead` (n)
    timesteps that follow them."""
    if capacity < 1 or lookahead < 0:
        raise ValueError(f"transition replay needs capacity >= 1 and lookahead >= 0; got "
                         f"{capacity}, {lookahead}")

    def init(example_step: Any) -> TransitionReplayState:
        items = jax.tree.map(
            lambda x: jnp.zeros((capacity,) + tuple(jnp.shape(x)), jnp.asarray(x).dtype),
            example_step)
        return TransitionReplayState(
            items=items,
            priorities=jnp.zeros((capacity,), jnp.float32),
            max_priority=jnp.ones((), jnp.float32),
            next_index=jnp.zeros((), jnp.int32),
            stored=jnp.zeros((), jnp.int32),
            columns=jnp.zeros((), jnp.int32),
        )

    def add(state: TransitionReplayState, steps: Any,
            sampleable: Array) -> TransitionReplayState:
        """Appends T timesteps of B columns (`steps` leaves [T, B, ...], `sampleable` [T, B]
        bool). Every add must hand over the same B columns in the same order."""
        chex.assert_rank(sampleable, 2)
        t, b = sampleable.shape
        if (lookahead + 1) * b > capacity:
            raise ValueError(f"a replay of {capacity} timesteps cannot hold the "
                             f"{lookahead + 1} x {b} timesteps of one sampled position's "
                             "lookahead over every column")
        count = t * b
        slots = (state.next_index + jnp.arange(count, dtype=jnp.int32)) % capacity
        if count > capacity:  # only the newest `capacity` land: keep writes unique
            slots, keep = slots[-capacity:], slice(count - capacity, count)
        else:
            keep = slice(0, count)
        flat = lambda x: x.reshape((count,) + x.shape[2:])[keep]
        items = jax.tree.map(lambda buf, new: buf.at[slots].set(flat(new).astype(buf.dtype)),
                             state.items, steps)
        priorities = jnp.where(flat(sampleable.astype(bool)), state.max_priority, 0.0)
        return TransitionReplayState(
            items=items,
            priorities=state.priorities.at[slots].set(priorities),
            max_priority=state.max_priority,
            next_index=(state.next_index + count) % capacity,
            stored=jnp.minimum(state.stored + count, capacity),
            columns=jnp.asarray(b, jnp.int32),
        )

    def eligible(state: TransitionReplayState) -> Array:
        """[N] bool: flagged, and its lookahead is stored."""
        age = (state.next_index - 1 - jnp.arange(capacity, dtype=jnp.int32)) % capacity
        return (state.priorities > 0) & (age >= lookahead * state.columns) & (
            age < state.stored)

    def draw_prioritised(state: TransitionReplayState, key: PRNGKey, batch_size: int,
                         alpha: float | Array) -> tuple[Array, Array]:
        """Inverse-CDF draws over every slot: the indices and the probabilities of all."""
        valid = eligible(state)
        scores = jnp.where(valid, (state.priorities + epsilon) ** jnp.asarray(alpha,
                                                                              jnp.float32), 0.0)
        probs = scores / jnp.maximum(scores.sum(), 1e-30)
        u = jax.random.uniform(key, (batch_size,), jnp.float32)
        return draw_positions(jnp.cumsum(probs), valid, u), probs

    def draw_uniformly(state: TransitionReplayState, key: PRNGKey,
                       batch_size: int) -> Array:
        """Uniform draws by rejection: a slot of an age in [n B, stored) (its lookahead is
        stored), kept when it is flagged."""

        def propose(state, key, shape):
            first_age = lookahead * state.columns
            ages = jnp.maximum(state.stored - first_age, 1)
            age = first_age + jax.random.randint(key, shape, 0, ages)
            return (state.next_index - 1 - age) % capacity

        return draw_uniform(key, batch_size, state.replace(items=()), propose=propose,
                            accept=lambda state, i: state.priorities[i] > 0,
                            exact=lambda state, k, s: draw_prioritised(state, k, s, 0.0)[0])

    def sample(state: TransitionReplayState, key: PRNGKey, batch_size: int, *,
               alpha: float | Array, beta: float | Array) -> TransitionSample:
        """`batch_size` positions drawn with P(i) ∝ p_i^alpha (consumes `key`). With alpha a
        Python 0 (uniform, known while tracing) the draw reads only the slots it proposes,
        not every priority, and the importance weights are 1."""
        # M. With alpha a Python 0 only `probabilities` reads it (compiled away when unused).
        num = jnp.sum(eligible(state)).astype(jnp.float32)
        if is_static_zero(alpha):
            indices = draw_uniformly(state, key, batch_size)
            p = jnp.full((batch_size,), 1.0, jnp.float32) / jnp.maximum(num, 1.0)
            weights = jnp.ones((batch_size,), jnp.float32)
        else:
            indices, probs = draw_prioritised(state, key, batch_size, alpha)
            p = probs[indices]
            weights = (num * p) ** (-jnp.asarray(beta, jnp.float32))
            weights = weights / jnp.max(weights)
        offsets = indices[:, None] + state.columns * jnp.arange(lookahead + 1)[None, :]
        items = jax.tree.map(lambda buf: buf[offsets % capacity], state.items)
        return TransitionSample(indices=indices, items=items, weights=weights,
                                probabilities=p)

    def update_priorities(state: TransitionReplayState, indices: Array,
                          priorities: Array) -> TransitionReplayState:
        priorities = jnp.maximum(priorities.astype(jnp.float32), epsilon)
        return state.replace(priorities=state.priorities.at[indices].set(priorities),
                             max_priority=jnp.maximum(state.max_priority, priorities.max()))

    def size(state: TransitionReplayState) -> Array:
        """[] int32: the positions that can be sampled now."""
        return jnp.sum(eligible(state)).astype(jnp.int32)

    return TransitionReplay(init=init, add=add, sample=sample,
                            update_priorities=update_priorities, size=size)
