"""EfficientZero's search: MuZero's (mctx, unchanged) with rewards from a value prefix.

The model predicts, for a node at depth d, the sum of rewards since the last LSTM reset; resets
happen at depths that are multiples of the horizon H (the root, depth 0, is one). The reward
of the edge into a node is its prefix minus its parent's, except when the parent is a reset
point: then the node's prefix itself. So that mctx needs nothing special, each node's
embedding carries what its children need:

    {"latent": s, "carry": LSTM state (zeros after a reset), "prefix": [B] the node's prefix
     (0 after a reset), "depth": [B] int32}
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mctx

from agents.efficientzero.networks import EfficientZeroNetwork, initial_carry, reset_carry
from agents.muzero.search import SearchConfig, search_with, value_to_scalar
from podracer.types import Array, Params, PRNGKey


def root_output(network: EfficientZeroNetwork, params: Params, observation: Array, *,
                support_size: int, lstm_size: int) -> mctx.RootFnOutput:
    """The search root of each observation `[B, ...]`: h(o), f's prior and value, and the
    embedding of a reset point (a zero LSTM state of `lstm_size` and prefix, depth 0)."""
    latent = network.apply(params, observation, method="represent")
    prior_logits, value_logits = network.apply(params, latent, method="predict")
    b = observation.shape[0]
    embedding = {"latent": latent, "carry": initial_carry(b, lstm_size),
                 "prefix": jnp.zeros((b,), jnp.float32), "depth": jnp.zeros((b,), jnp.int32)}
    return mctx.RootFnOutput(prior_logits=prior_logits,
                             value=value_to_scalar(value_logits, support_size),
                             embedding=embedding)


def make_recurrent_fn(network: EfficientZeroNetwork, *, support_size: int, discount: float,
                      value_prefix: bool, value_prefix_horizon: int):
    """mctx's `recurrent_fn` for EfficientZero's model (see the module docstring), the LSTM
    reset every `value_prefix_horizon` steps; with `value_prefix` off, MuZero's per-step
    reward head gives the rewards."""
    support, horizon = support_size, value_prefix_horizon

    def recurrent_fn(params, key, action, embedding):
        del key
        reward_logits, latent = network.apply(params, embedding["latent"], action,
                                              method="dynamics")
        depth = embedding["depth"] + 1
        if value_prefix:
            prefix_logits, carry = network.apply(params, latent, embedding["carry"],
                                                 method="prefix")
            prefix = value_to_scalar(prefix_logits, support)
            reward = prefix - embedding["prefix"]  # the parent's is 0 after a reset
            reset = depth % horizon == 0
            carry = reset_carry(carry, reset)
            prefix = jnp.where(reset, 0.0, prefix)
        else:
            reward = value_to_scalar(reward_logits, support)
            carry, prefix = embedding["carry"], embedding["prefix"]
        prior_logits, value_logits = network.apply(params, latent, method="predict")
        step_discount = jnp.full(action.shape, discount, jnp.float32)
        if network.muzero.terminal_head:  # gamma (1 - P(end)), as MuZero's search
            end_logit = network.apply(params, latent, method="terminal_logit")
            step_discount = step_discount * jax.nn.sigmoid(-end_logit)
        output = mctx.RecurrentFnOutput(
            reward=reward,
            discount=step_discount,
            prior_logits=prior_logits,
            value=value_to_scalar(value_logits, support),
        )
        return output, {"latent": latent, "carry": carry, "prefix": prefix, "depth": depth}

    return recurrent_fn


def run_search(network: EfficientZeroNetwork, params: Params, observation: Array,
               key: PRNGKey, search_config: SearchConfig, *, value_prefix: bool,
               value_prefix_horizon: int, lstm_size: int, evaluation: bool,
               temperature: Array | float | None = None) -> mctx.PolicyOutput:
    """One batched search from `observation` ([B, ...]), MuZero's `search_with` on
    EfficientZero's model (`value_prefix`, `value_prefix_horizon` and `lstm_size` as in the
    agent's config; `temperature`: the acting temperature, None for `search_config`'s)."""
    root = root_output(network, params, observation, support_size=search_config.support_size,
                       lstm_size=lstm_size)
    recurrent_fn = make_recurrent_fn(
        network, support_size=search_config.support_size, discount=search_config.discount,
        value_prefix=value_prefix, value_prefix_horizon=value_prefix_horizon)
    return search_with(root, recurrent_fn, params, key, search_config,
                       evaluation=evaluation, temperature=temperature)
