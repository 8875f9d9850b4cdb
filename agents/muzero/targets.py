"""MuZero's learning targets: value/reward transforms, categorical supports and n-step values.

All functions are unbatched over one trajectory segment (rlax style); callers `vmap`.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import rlax

from podracer.types import Array, StepType


def scalar_to_probs(x: Array, support_size: int) -> Array:
    """h(x) = sign(x)(sqrt(|x|+1)-1)+eps x (Pohlen et al., 2018), as a two-hot distribution
    over the integer support [-support_size, support_size]."""
    return rlax.transform_to_2hot(
        rlax.signed_hyperbolic(x), -float(support_size), float(support_size), 2 * support_size + 1
    )


def probs_to_scalar(probs: Array, support_size: int) -> Array:
    """The inverse of `scalar_to_probs`: expectation on the support, then h^-1."""
    return rlax.signed_parabolic(
        rlax.transform_from_2hot(probs, -float(support_size), float(support_size),
                                 2 * support_size + 1)
    )


def n_step_values(
    rewards: Array, discounts: Array, step_types: Array, bootstrap: Array, *, n: int,
    discount: float,
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
      n: the number of steps before bootstrapping.
      discount: the agent's gamma.
    """
    chex.assert_rank([rewards, discounts, step_types, bootstrap], 1)
    last = step_types == StepType.LAST
    # A true terminal is worth nothing; a truncated end is worth its estimate.
    boot = jnp.where(last & (discounts == 0), 0.0, bootstrap)
    z = boot
    for _ in range(n):
        later = jnp.concatenate([rewards[1:] + discount * discounts[1:] * z[1:], boot[-1:]])
        z = jnp.where(last, boot, later)
    return z


def rebuild_frame_stacks(frames: Array, first_stack: Array, step_types: Array) -> Array:
    """The stacked observations `[L, H, W, C]` of a segment stored as one frame per step.

    Frame stacking keeps the C newest frames with the newest last, and a reset fills the stack
    with copies of the episode's first frame (envpool's behaviour). A segment stores only the
    newest frame of each timestep (`frames`, [L, H, W]) and the whole stack of its first
    timestep (`first_stack`, [H, W, C]), so each frame is stored once.

    Channel c of o_t is frame t - (C-1-c), clamped to the start of o_t's episode; frames from
    before the segment come from `first_stack`.
    """
    chex.assert_rank([frames, first_stack, step_types], [3, 3, 1])
    length = frames.shape[0]
    num_stack = first_stack.shape[-1]
    t = jnp.arange(length)
    first = step_types == StepType.FIRST
    # Index of the latest FIRST at or before t, or -1 if the episode began before the segment.
    episode_start = jnp.maximum(jax.lax.cummax(jnp.where(first, t, -1)), -1)
    c = jnp.arange(num_stack)
    source = t[:, None] - (num_stack - 1 - c)[None, :]  # [L, C]
    source = jnp.maximum(source, episode_start[:, None])
    from_segment = frames[jnp.maximum(source, 0)]  # [L, C, H, W]
    # source < 0 only when the episode began before the segment: channel (c + t) of the
    # first stack holds that frame.
    before = first_stack[..., jnp.clip(c[None, :] + t[:, None], 0, num_stack - 1)]  # [H,W,L,C]
    before = jnp.moveaxis(before, (2, 3), (0, 1))  # [L, C, H, W]
    stacks = jnp.where((source < 0)[:, :, None, None], before, from_segment)
    return jnp.moveaxis(stacks, 1, -1)  # [L, H, W, C]
