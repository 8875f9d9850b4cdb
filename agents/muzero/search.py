"""MuZero's search: the learnt model as mctx's `root_fn` and `recurrent_fn`, and one search.

Acting searches from each observation (PUCT `muzero_policy` with Dirichlet noise at the root,
or `gumbel_muzero_policy`); Reanalyse searches again with the target network.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mctx
import ml_collections

from agents.muzero import targets as tgt
from agents.muzero.networks import MuZeroNetwork
from podracer.types import Array, Params, PRNGKey


def value_to_scalar(logits: Array, support_size: int) -> Array:
    """[..., 2S+1] categorical logits on the h-transformed support -> [...] scalar values."""
    return tgt.probs_to_scalar(jax.nn.softmax(logits), support_size)


def make_recurrent_fn(network: MuZeroNetwork, support_size: int, discount: float):
    """mctx's `recurrent_fn`: one step of the learnt model from `embedding` ([B, ...]) with
    `action` ([B]) -> (RecurrentFnOutput with [B] reward, discount, value and [B, A] prior
    logits, next embedding). Consumes no randomness."""

    def recurrent_fn(params, key, action, embedding):
        del key
        reward_logits, latent = network.apply(params, embedding, action, method="dynamics")
        prior_logits, value_logits = network.apply(params, latent, method="predict")
        output = mctx.RecurrentFnOutput(
            reward=value_to_scalar(reward_logits, support_size),
            # The learnt model does not predict episode ends: MuZero plans as if the episode
            # went on, and terminal states are handled by the value targets instead (the
            # absorbing state after a terminal is trained to value 0).
            discount=jnp.full(action.shape, discount, jnp.float32),
            prior_logits=prior_logits,
            value=value_to_scalar(value_logits, support_size),
        )
        return output, latent

    return recurrent_fn


def root_output(network: MuZeroNetwork, params: Params, observation: Array,
                support_size: int) -> mctx.RootFnOutput:
    """The search root of each observation `[B, ...]`: h(o), then f's prior and value."""
    latent = network.apply(params, observation, method="represent")
    prior_logits, value_logits = network.apply(params, latent, method="predict")
    return mctx.RootFnOutput(prior_logits=prior_logits,
                             value=value_to_scalar(value_logits, support_size),
                             embedding=latent)


def run_search(network: MuZeroNetwork, params: Params, observation: Array, key: PRNGKey,
               config: ml_collections.ConfigDict, *, evaluation: bool) -> mctx.PolicyOutput:
    """One batched search from `observation` ([B, ...]) with the fields `search`,
    `num_simulations`, `support_size`, `discount` and the chosen search's own of `config`.
    `evaluation` turns the root noise off. `key` is consumed by mctx (root noise, Gumbel
    draws, action sampling)."""
    root = root_output(network, params, observation, config.support_size)
    recurrent_fn = make_recurrent_fn(network, config.support_size, config.discount)
    return search_with(root, recurrent_fn, params, key, config, evaluation=evaluation)


def search_with(root: mctx.RootFnOutput, recurrent_fn, params: Params, key: PRNGKey,
                config: ml_collections.ConfigDict, *, evaluation: bool) -> mctx.PolicyOutput:
    """The search `config.search` from `root` with the model `recurrent_fn` (any agent's:
    MuZero's, or EfficientZero's with its value prefix); see `run_search`."""
    if config.search == "gumbel":
        return mctx.gumbel_muzero_policy(
            params, key, root, recurrent_fn,
            num_simulations=config.num_simulations,
            max_num_considered_actions=config.max_num_considered_actions,
            gumbel_scale=0.0 if evaluation else config.gumbel_scale,
        )
    return mctx.muzero_policy(
        params, key, root, recurrent_fn,
        num_simulations=config.num_simulations,
        dirichlet_fraction=0.0 if evaluation else config.dirichlet_fraction,
        dirichlet_alpha=config.dirichlet_alpha,
        temperature=config.temperature,
    )
