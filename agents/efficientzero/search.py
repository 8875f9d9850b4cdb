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

import jax.numpy as jnp
import mctx
import ml_collections

from agents.efficientzero.networks import EfficientZeroNetwork, initial_carry, reset_carry
from agents.muzero.search import search_with, value_to_scalar
from podracer.types import Array, Params, PRNGKey


def root_output(network: EfficientZeroNetwork, params: Params, observation: Array,
                config: ml_collections.ConfigDict) -> mctx.RootFnOutput:
    latent = network.apply(params, observation, method="represent")
    prior_logits, value_logits = network.apply(params, latent, method="predict")
    b = observation.shape[0]
    embedding = {"latent": latent, "carry": initial_carry(b, config.lstm_size),
                 "prefix": jnp.zeros((b,), jnp.float32), "depth": jnp.zeros((b,), jnp.int32)}
    return mctx.RootFnOutput(prior_logits=prior_logits,
                             value=value_to_scalar(value_logits, config.support_size),
                             embedding=embedding)


def make_recurrent_fn(network: EfficientZeroNetwork, config: ml_collections.ConfigDict):
    """mctx's `recurrent_fn` for EfficientZero's model (see the module docstring); with
    `config.value_prefix` off, MuZero's per-step reward head gives the rewards."""
    support, horizon = config.support_size, config.value_prefix_horizon

    def recurrent_fn(params, key, action, embedding):
        del key
        reward_logits, latent = network.apply(params, embedding["latent"], action,
                                              method="dynamics")
        depth = embedding["depth"] + 1
        if config.value_prefix:
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
        output = mctx.RecurrentFnOutput(
            reward=reward,
            discount=jnp.full(action.shape, config.discount, jnp.float32),
            prior_logits=prior_logits,
            value=value_to_scalar(value_logits, support),
        )
        return output, {"latent": latent, "carry": carry, "prefix": prefix, "depth": depth}

    return recurrent_fn


def run_search(network: EfficientZeroNetwork, params: Params, observation: Array,
               key: PRNGKey, config: ml_collections.ConfigDict, *,
               evaluation: bool, temperature: Array | float | None = None
               ) -> mctx.PolicyOutput:
    """One batched search from `observation` ([B, ...]), MuZero's `search_with` on
    EfficientZero's model (`temperature`: the acting temperature, None for the config's)."""
    root = root_output(network, params, observation, config)
    return search_with(root, make_recurrent_fn(network, config), params, key, config,
                       evaluation=evaluation, temperature=temperature)
