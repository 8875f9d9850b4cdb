"""MuZero's learning targets: value transforms, n-step values, unroll targets, frame stacks.

All functions are unbatched over one window of a stream (rlax style); callers `vmap`.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import rlax

from podracer.types import Array, StepType


def scalar_to_probs(x: Array, support_size: int, num_bins: int | None = None) -> Array:
    """h(x) = sign(x)(sqrt(|x|+1)-1)+eps x (Pohlen et al., 2018), as a two-hot distribution
    over `num_bins` evenly spaced points of [-support_size, support_size] (None: 2S + 1, the
    integers)."""
    bins = 2 * support_size + 1 if num_bins is None else num_bins
    return rlax.transform_to_2hot(
        rlax.signed_hyperbolic(x), -float(support_size), float(support_size), bins)


def probs_to_scalar(probs: Array, support_size: int) -> Array:
    """The inverse of `scalar_to_probs`: expectation on the support (as many evenly spaced
    points of [-S, S] as `probs` has bins), then h^-1."""
    return rlax.signed_parabolic(
        rlax.transform_from_2hot(probs, -float(support_size), float(support_size),
                                 probs.shape[-1])
    )


def n_step_values(
    rewards: Array, discounts: Array, step_types: Array, bootstrap: Array, *, n: int | Array,
    discount: float, max_n: int | None = None,
) -> Array:
    """n-step value targets z_t for every position t = 0..L-1 of a segment of L timesteps.

        z_t = r_{t+1} + g_{t+1} r_{t+2} + ... + (g_{t+1} ... g_{t+m}) b(o_{t+m}),  g = discount * d

    with m = min(n, L-1-t), stopping early at the end of an episode: a LAST timestep o_t is
    worth b(o_t) (its bootstrap: 0 at a true terminal, the value estimate when truncated) and
    the transition out of it (into the next episode's reset) is never used.

    Args:
      rewards: [L] r_t, received on arriving at o_t (r_0 unused).
      discounts: [L] the environment's d_t at o_t (0 at a true terminal).
      step_types: [L] `StepType` of o_t.
      bootstrap: [L] value estimates of o_t (from a target network or a search).
      n: the number of steps before bootstrapping: an int, or a traced [] int with `max_n`.
      discount: the agent's gamma.
      max_n: the largest n a traced `n` can take (static); None when `n` is an int.
    """
    chex.assert_rank([rewards, discounts, step_types, bootstrap], 1)
    last = step_types == StepType.LAST
    # A true terminal is worth nothing; a truncated end is worth its estimate.
    boot = jnp.where(last & (discounts == 0), 0.0, bootstrap)
    z = boot
    for i in range(n if max_n is None else max_n):
        later = jnp.concatenate([rewards[1:] + discount * discounts[1:] * z[1:], boot[-1:]])
        later = jnp.where(last, boot, later)
        z = later if max_n is None else jnp.where(i < n, later, z)
    return z


def bootstrap_indices(step_types: Array, *, num_unroll: int, n: int | Array,
                      max_n: int | None = None) -> Array:
    """Where the n-step target of each unroll step k = 0..K of a window bootstraps.

    The window holds the K + n + 1 timesteps from a sampled position; step k's target
    bootstraps from o_{b_k}, b_k = min(k + n, the first LAST at or after k) (the target stops
    at an episode's end). Only these K + 1 observations need a value estimate.

    Args:
      step_types: [K + n + 1] `StepType` of the window's timesteps.
      num_unroll: K.
      n: the number of steps before bootstrapping (a traced [] int needs `max_n`).
      max_n: the window's n when `n` is traced: it holds K + max_n + 1 timesteps.
    Returns:
      [K + 1] int32 window indices.
    """
    chex.assert_rank(step_types, 1)
    length = step_types.shape[0]
    window_n = n if max_n is None else max_n
    if length != num_unroll + window_n + 1:
        raise ValueError(f"a window of {length} timesteps for K={num_unroll}, n={window_n}; "
                         f"expected K + n + 1 = {num_unroll + window_n + 1}")
    t = jnp.arange(length)
    next_last = jax.lax.cummin(jnp.where(step_types == StepType.LAST, t, length), reverse=True)
    k = jnp.arange(num_unroll + 1)
    return jnp.minimum(k + n, next_last[: num_unroll + 1]).astype(jnp.int32)


@chex.dataclass(frozen=True)
class UnrollTargets:
    """What unroll step k = 0..K of a sampled position is trained towards, and where."""

    reward: Array  # [K+1] float32 r for the transition into step k (step 0: none, 0)
    value: Array  # [K+1] float32 n-step value target z
    policy: Array  # [K+1, A] float32 policy target
    reward_mask: Array  # [K+1] float32 1 where the reward target is trained
    value_mask: Array  # [K+1] float32
    policy_mask: Array  # [K+1] float32
    # [K+1] float32 1 where o_k is a true terminal or past one (the episode ended by step k),
    # else 0; trained where the reward is (`reward_mask`) by a model that predicts ends
    terminal: Array


PAST_END_TARGETS = ("masked", "absorbing")


def unroll_targets(
    rewards: Array, discounts: Array, step_types: Array, policies: Array,
    bootstrap_values: Array, *, num_unroll: int, n: int | Array, discount: float,
    max_n: int | None = None, past_end: str = "masked",
) -> UnrollTargets:
    """The targets of the K-step unroll from o_0, the first timestep of a window o_0..o_{K+n}.

    Inside the episode of o_0 (no LAST before step k): reward r_k, value z_k (`n_step_values`
    with the bootstraps of `bootstrap_indices`) and the stored search policy pi_k. At a true
    terminal o_k the value target is 0 and the reward r_k; no action is taken there, and
    past it the unroll follows actions from another episode. `past_end` says what is trained
    there:

      "masked" (EfficientZero's reference, `core/reanalyze_worker.py` and the masks of
      `core/train.py`): the terminal's policy is not trained, and nothing past the terminal
      is trained;
      "absorbing" (MuZero's absorbing state): a uniform policy at the terminal and, past it,
      reward 0, value 0 and a uniform policy, all trained.

    After a truncation (LAST with discount 1, which bootstraps) nothing is known: every target
    past it is masked in both.

    Args:
      rewards: [K+n+1] r_t received on arriving at o_t.
      discounts: [K+n+1] the environment's d_t at o_t (0 at a true terminal).
      step_types: [K+n+1] `StepType` of o_t.
      policies: [K+n+1, A] the search policy stored at o_t.
      bootstrap_values: [K+1] value estimates of o_{b_k}, b = `bootstrap_indices(...)`.
      num_unroll: K.
      n: the number of steps before bootstrapping; a traced [] int (e.g. shortened for old
        data, EfficientZero's off-policy correction) needs `max_n`, the window's n.
      discount: the agent's gamma.
      max_n: see `n`.
      past_end: "masked" or "absorbing", above.
    """
    chex.assert_rank([rewards, discounts, step_types, policies, bootstrap_values],
                     [1, 1, 1, 2, 1])
    if past_end not in PAST_END_TARGETS:
        raise ValueError(f"past_end={past_end!r}: use one of {PAST_END_TARGETS}")
    k1 = num_unroll + 1
    length = rewards.shape[0]
    chex.assert_shape(bootstrap_values, (k1,))
    b = bootstrap_indices(step_types, num_unroll=num_unroll, n=n, max_n=max_n)
    boot = jnp.zeros((length,), jnp.float32).at[b].set(bootstrap_values)
    z = n_step_values(rewards, discounts, step_types, boot, n=n, discount=discount,
                      max_n=max_n)[:k1]
    last = step_types[:k1] == StepType.LAST
    terminal = last & (discounts[:k1] == 0)
    ended_before = (jnp.cumsum(last) - last) > 0  # a LAST at an earlier unroll step
    ends_in_terminal = terminal[jnp.argmax(last)]  # the first end is a true terminal
    alive = ~ended_before
    if past_end == "absorbing":
        trained = (alive | (ended_before & ends_in_terminal)).astype(jnp.float32)
        policy_trained = trained
    else:
        trained = alive.astype(jnp.float32)
        policy_trained = (alive & ~terminal).astype(jnp.float32)
    not_first = (jnp.arange(k1) > 0).astype(jnp.float32)
    uniform = jnp.full(policies.shape[1:], 1.0 / policies.shape[1], jnp.float32)
    return UnrollTargets(
        reward=jnp.where(alive, rewards[:k1], 0.0) * not_first,
        value=jnp.where(alive, z, 0.0),
        policy=jnp.where((alive & ~terminal)[:, None], policies[:k1], uniform),
        reward_mask=trained * not_first,
        value_mask=trained,
        policy_mask=policy_trained,
        terminal=(terminal | (ended_before & ends_in_terminal)).astype(jnp.float32),
    )


def stack_restarts(observations: Array) -> Array:
    """[...] bool: whether each stacked observation `[..., H, W, C]` holds one frame repeated.

    A frame stacker refills its stack with one frame at a full game reset (envpool does so
    only then, not after a life loss); flagging every such stack, reset or not, lets
    `frame_stack` rebuild stacks exactly from one frame per step."""
    return jnp.all(observations == observations[..., -1:], axis=(-3, -2, -1))


def frame_stack(frames: Array, restarts: Array, t: Array, num_stack: int) -> Array:
    """The stacked observation `[H, W, C]` at index `t` of frames stored once per step.

    A stacker keeps the C newest frames, newest last, and at a restart (`stack_restarts`)
    holds C copies of one frame; from then on each step pushes its frame. So channel c of o_t
    is frame t - (C-1-c), clamped to the latest restart at or before t. Exact when `frames`
    holds the C - 1 steps before t or a restart lies among them.

    Args:
      frames: [L, H, W] the newest frame of each step (`observation[..., -1]`).
      restarts: [L] bool `stack_restarts` of each step.
      t: [] int index of the wanted step.
      num_stack: C.
    """
    chex.assert_rank([frames, restarts, t], [3, 1, 0])
    steps = jnp.arange(frames.shape[0])
    latest = jnp.max(jnp.where(restarts & (steps <= t), steps, 0))
    source = jnp.maximum(t - (num_stack - 1) + jnp.arange(num_stack), latest)  # [C]
    return jnp.moveaxis(frames[source], 0, -1)
