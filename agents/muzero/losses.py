"""MuZero's model unroll and loss (Schrittwieser et al., 2020, eq. 1 and appendix G)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax.numpy as jnp
import optax

from agents.muzero import targets as tgt
from agents.muzero.networks import MuZeroNetwork, scale_gradient
from podracer.types import Array, Params


@chex.dataclass(frozen=True)
class UnrollOutput:
    policy_logits: Array  # [B, K+1, A] f's policy at each unroll step
    value_logits: Array  # [B, K+1, 2S+1] f's value
    reward_logits: Array  # [B, K+1, 2S+1] g's reward into each step (step 0: zeros, unused)
    # [B, K+1] the terminal head's logit at each step (step 0: zeros, unused); None without one
    terminal_logits: Array | None = None
    latents: Array | None = None  # [B, K, ...] the dynamics' latents at steps 1..K


@chex.dataclass(frozen=True)
class LossOutput:
    loss: Array  # [] the weighted sum, divided by K+1
    policy_loss: Array  # [] summed over unroll steps
    value_loss: Array  # []
    reward_loss: Array  # []
    terminal_loss: Array  # [] (0 without a terminal head)


def unroll_model(network: MuZeroNetwork, params: Params, observation: Array,
                 actions: Array, *, step_scale: float = 1.0,
                 reward_head: Callable[[Params, Array, Any, int], tuple[Array, Any]] | None = None,
                 reward_carry: Any = None) -> UnrollOutput:
    """Represents `observation` ([B, ...]) and unrolls the dynamics through `actions`
    ([B, K], or [B, K, D] action vectors for a model of continuous actions), predicting at every step (and, with `network.terminal_head`, whether each
    step ended the episode). Half the gradient flows into each dynamics step (MuZero
    appendix G), and `step_scale` scales the gradient of every prediction past step 0
    (appendix G's 1/K; 1: none).

    `reward_head` (params, the latent of step k + 1, carry, k) -> (reward logits, carry),
    starting from `reward_carry`, replaces the dynamics' reward (EfficientZero's value
    prefix)."""
    chex.assert_rank(actions, {2, 3})
    latent = network.apply(params, observation, method="represent")
    policies, values, rewards, latents = [], [], [], []
    ends = [jnp.zeros(observation.shape[:1], jnp.float32)]
    for k in range(actions.shape[1] + 1):
        policy_logits, value_logits = network.apply(params, latent, method="predict")
        if k > 0:
            policy_logits = scale_gradient(policy_logits, step_scale)
            value_logits = scale_gradient(value_logits, step_scale)
        policies.append(policy_logits)
        values.append(value_logits)
        if k == actions.shape[1]:
            break
        reward_logits, latent = network.apply(params, latent, actions[:, k], method="dynamics")
        if network.terminal_head:
            ends.append(scale_gradient(network.apply(params, latent, method="terminal_logit"),
                                       step_scale))
        latent = scale_gradient(latent, 0.5)
        if reward_head is not None:
            reward_logits, reward_carry = reward_head(params, latent, reward_carry, k)
        rewards.append(scale_gradient(reward_logits, step_scale))
        latents.append(latent)
    rewards = [jnp.zeros_like(values[0])] + rewards
    stack = lambda xs: jnp.stack(xs, axis=1)
    return UnrollOutput(policy_logits=stack(policies), value_logits=stack(values),
                        reward_logits=stack(rewards),
                        terminal_logits=stack(ends) if network.terminal_head else None,
                        latents=stack(latents) if latents else None)


def unroll_loss(policy_logits: Array, value_logits: Array, reward_logits: Array,
                targets: tgt.UnrollTargets, *, support_size: int,
                value_cost: float | Array, terminal_logits: Array | None = None
                ) -> LossOutput:
    """l = sum_k m^p_k CE(pi_k, p_k) + c m^v_k CE(phi(z_k), v_k) + m^r_k CE(phi(r_k), r_k),
    divided by K+1, for one sampled position (unbatched); phi is `scalar_to_probs`. With
    `terminal_logits` the sum also holds m^r_k BCE(e_k, sigmoid(logit_k)), e_k the episode
    having ended by step k (`targets.terminal`).

    Args:
      policy_logits: [K+1, A].
      value_logits: [K+1, B], B bins spread evenly over [-S, S] after h(x).
      reward_logits: [K+1, B] (step 0 is masked by `targets.reward_mask`).
      targets: `unroll_targets` of the position, leaves [K+1, ...].
      support_size: S.
      value_cost: c.
      terminal_logits: [K+1] the terminal head's logits, or None (no such term).
    """
    chex.assert_rank([policy_logits, value_logits, reward_logits], 2)
    ce = optax.softmax_cross_entropy
    policy = jnp.sum(targets.policy_mask * ce(policy_logits, targets.policy))
    value = jnp.sum(targets.value_mask * ce(
        value_logits, tgt.scalar_to_probs(targets.value, support_size, value_logits.shape[-1])))
    reward = jnp.sum(targets.reward_mask * ce(
        reward_logits, tgt.scalar_to_probs(targets.reward, support_size, reward_logits.shape[-1])))
    terminal = jnp.zeros((), jnp.float32)
    if terminal_logits is not None:
        terminal = jnp.sum(targets.reward_mask * optax.sigmoid_binary_cross_entropy(
            terminal_logits, targets.terminal))
    loss = (policy + value_cost * value + reward + terminal) / policy_logits.shape[0]
    return LossOutput(loss=loss, policy_loss=policy, value_loss=value, reward_loss=reward,
                      terminal_loss=terminal)
