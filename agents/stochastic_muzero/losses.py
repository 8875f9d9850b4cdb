"""Stochastic MuZero's unroll and the loss it adds to MuZero's (Antonoglou et al., 2022,
section 3: L = L^MuZero + L^chance).

    L^chance = sum_{k<K} m^v_k CE(phi(z_k), Q^k)              afterstate value
             + sum_{k<K} m^c_k CE(c_{k+1}, sigma^k)           chance prior against the code
             + beta sum_{k<K} m^c_k ||c_{k+1} - c^e_{k+1}||^2   commitment

z_k is MuZero's n-step value target at step k (the return of taking a_k there), c_{k+1} the
one-hot code of the encoder's output c^e_{k+1} for the transition o_k -> o_{k+1}, m^c_k 1
where that transition lies inside the episode of o_0. Like MuZero's loss, each sum is divided
by K + 1.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax

from agents.muzero import targets as tgt
from agents.muzero.losses import UnrollOutput
from agents.muzero.networks import scale_gradient
from agents.stochastic_muzero.networks import StochasticMuZeroNetwork, quantise
from podracer.types import Array, Params, StepType


@chex.dataclass(frozen=True)
class StochasticUnrollOutput(UnrollOutput):
    """MuZero's unroll output (its fields), and the afterstates' predictions."""

    afterstate_value_logits: Array | None = None  # [B, K, bins] psi's Q at each step < K
    chance_logits: Array | None = None  # [B, K, C] psi's sigma at each step < K
    encodings: Array | None = None  # [B, K, C] c^e of o_k -> o_{k+1}
    codes: Array | None = None  # [B, K, C] the one-hot codes g was given (straight-through)


@chex.dataclass(frozen=True)
class ChanceLossOutput:
    loss: Array  # [] the weighted sum, divided by K+1
    afterstate_value_loss: Array  # [] summed over unroll steps
    chance_loss: Array  # []
    commitment_loss: Array  # []


def unroll_model(network: StochasticMuZeroNetwork, params: Params, observations: Array,
                 actions: Array) -> StochasticUnrollOutput:
    """Represents o_0 and unrolls K steps: at step k, f's prediction; phi(s_k, a_k) -> the
    afterstate and psi's sigma and Q; the code of o_k -> o_{k+1} from the encoder; g(as_k,
    code) -> reward and s_{k+1} (and the terminal head). Half the gradient flows into each
    state s_{k+1} (MuZero appendix G).

    Args:
      observations: [B, K+1, ...] o_0 .. o_K.
      actions: [B, K].
    """
    chex.assert_rank(actions, 2)
    b, k = actions.shape
    flat = lambda x: x.reshape((b * k,) + x.shape[2:])
    encodings = network.apply(params, flat(observations[:, :-1]), flat(observations[:, 1:]),
                              method="encode").reshape(b, k, -1)
    codes = quantise(encodings)
    latent = network.apply(params, observations[:, 0], method="represent")
    policies, values, rewards, ends, chance, q = [], [], [], [], [], []
    for i in range(k + 1):
        policy_logits, value_logits = network.apply(params, latent, method="predict")
        policies.append(policy_logits)
        values.append(value_logits)
        if i == k:
            break
        afterstate = network.apply(params, latent, actions[:, i], method="afterstate")
        chance_logits, q_logits = network.apply(params, afterstate, method="afterstate_predict")
        chance.append(chance_logits)
        q.append(q_logits)
        reward_logits, latent = network.apply(params, afterstate, codes[:, i],
                                              method="dynamics")
        if network.terminal_head:
            ends.append(network.apply(params, latent, method="terminal_logit"))
        latent = scale_gradient(latent, 0.5)
        rewards.append(reward_logits)
    stack = lambda xs: jnp.stack(xs, axis=1)
    rewards = [jnp.zeros_like(values[0])] + rewards
    ends = [jnp.zeros((b,), jnp.float32)] + ends
    return StochasticUnrollOutput(
        policy_logits=stack(policies), value_logits=stack(values), reward_logits=stack(rewards),
        terminal_logits=stack(ends) if network.terminal_head else None,
        afterstate_value_logits=stack(q), chance_logits=stack(chance), encodings=encodings,
        codes=codes)


def transition_mask(step_types: Array, num_unroll: int) -> Array:
    """[K] 1.0 where o_{k+1} follows o_k inside the episode of o_0 (no LAST among o_0..o_k),
    k = 0..K-1: the transitions whose chance outcome is learnt.

    Args:
      step_types: [>= K] `StepType` of o_0, o_1, ...
    """
    last = (step_types[:num_unroll] == StepType.LAST).astype(jnp.int32)
    return (jnp.cumsum(last) == 0).astype(jnp.float32)


def chance_loss(afterstate_value_logits: Array, chance_logits: Array, encodings: Array,
                value_targets: Array, value_mask: Array, chance_mask: Array, *,
                support_size: int, afterstate_value_cost: float | Array,
                chance_cost: float | Array, commitment_cost: float | Array,
                prior_to_encoder: bool = False) -> ChanceLossOutput:
    """L^chance of one sampled position (unbatched), divided by K+1 (module docstring).

    Args:
      afterstate_value_logits: [K, bins] psi's Q at steps 0..K-1.
      chance_logits: [K, C] psi's sigma.
      encodings: [K, C] c^e of o_k -> o_{k+1}.
      value_targets: [K+1] MuZero's value targets z (step K unused).
      value_mask: [K+1] MuZero's value mask (step K unused).
      chance_mask: [K] `transition_mask`.
      afterstate_value_cost, chance_cost, commitment_cost: the weights of the three sums
        (the last is beta).
      prior_to_encoder: whether sigma's cross-entropy also trains the encoder (through the
        straight-through code); False: the code is its fixed target.
    """
    chex.assert_rank([afterstate_value_logits, chance_logits, encodings], 2)
    k = chance_logits.shape[0]
    ce = optax.softmax_cross_entropy
    z = tgt.scalar_to_probs(value_targets[:k], support_size, afterstate_value_logits.shape[-1])
    value = jnp.sum(value_mask[:k] * ce(afterstate_value_logits, z))
    codes = quantise(encodings)
    target = codes if prior_to_encoder else jax.lax.stop_gradient(codes)
    prior = jnp.sum(chance_mask * ce(chance_logits, target))
    commitment = jnp.sum(chance_mask * jnp.sum(
        (jax.lax.stop_gradient(codes) - encodings) ** 2, axis=-1))
    loss = (afterstate_value_cost * value + chance_cost * prior
            + commitment_cost * commitment) / (k + 1)
    return ChanceLossOutput(loss=loss, afterstate_value_loss=value, chance_loss=prior,
                            commitment_loss=commitment)


def code_entropy(codes: Array, mask: Array) -> Array:
    """[] the entropy (nats) of the histogram of one-hot `codes` ([..., C]) where `mask`
    ([...]) is set: ln C when every code is used equally, 0 when one code is used (the
    encoder has collapsed to a deterministic model)."""
    weights = mask[..., None].astype(jnp.float32)
    counts = jnp.sum(jax.lax.stop_gradient(codes) * weights,
                     axis=tuple(range(codes.ndim - 1)))
    p = counts / jnp.maximum(jnp.sum(counts), 1.0)
    return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
