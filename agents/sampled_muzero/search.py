"""Sampled MuZero's search (Hubert et al., 2021, section 4) on mctx's PUCT search.

Every node's embedding carries the K actions sampled at it: {"latent": s, "samples": [B, K, D]
pre-squash actions u_1..u_K drawn from beta}. mctx sees K discrete actions; `recurrent_fn`
maps a child index k of a node to the node's sample u_k, steps the model with tanh(u_k), and
samples the child's own K actions (with the key mctx hands it) for its expansion. So mctx's
tree, selection and backups are used unchanged, as in EfficientZero's value-prefix search.

The prior over a node's K children is the paper's sample-based correction (beta_hat / beta) pi:
beta the sampling distribution, here pi^(1/tau) (for a Gaussian, N(mean, tau sigma^2)), and
beta_hat the empirical distribution of the samples, 1/K per sample. Each child holds one
sample, so child k's prior is proportional to (1/K) pi(u_k) / beta(u_k); samples that repeat
an action (possible only for discrete actions) each hold 1/K, so that action's prior summed
over its children is beta_hat(a) / beta(a) pi(a), beta_hat(a) = count(a) / K. With tau = 1
(beta = pi) the prior is uniform over the samples: beta_hat itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mctx

from agents.muzero.search import SearchConfig, search_with, value_to_scalar
from agents.sampled_muzero.networks import SampledMuZeroNetwork, gaussian, log_prob, squash
from podracer.types import Array, Params, PRNGKey


def sampled_prior_logits(log_pi: Array, log_beta: Array) -> Array:
    """[..., K] logits of the prior (beta_hat / beta) pi over K samples, from log pi and log
    beta at each sample ([..., K]); softmax gives the prior, duplicates each at 1/K (module
    docstring). log(1/K) is the same for every sample and drops out."""
    return log_pi - log_beta


def sample_actions(policy_params: Array, key: PRNGKey, *, num_samples: int,
                   temperature: float, log_std_min: float, log_std_max: float
                   ) -> tuple[Array, Array]:
    """K pre-squash actions from beta = pi^(1/tau) at each of B nodes and their prior logits:
    ([B, K, D], [B, K]). pi is f's Gaussian (`policy_params` [B, 2D]); beta, its
    normalised power 1/tau, is the Gaussian with the same mean and variance tau sigma^2."""
    mean, log_std = gaussian(policy_params, log_std_min=log_std_min, log_std_max=log_std_max)
    beta_log_std = log_std + 0.5 * jnp.log(jnp.float32(temperature))
    noise = jax.random.normal(key, mean.shape[:1] + (num_samples,) + mean.shape[1:])
    u = mean[:, None] + jnp.exp(beta_log_std)[:, None] * noise
    log_pi = log_prob(mean[:, None], log_std[:, None], u)
    log_beta = log_prob(mean[:, None], beta_log_std[:, None], u)
    return u, sampled_prior_logits(log_pi, log_beta)


def root_output(network: SampledMuZeroNetwork, params: Params, observation: Array,
                key: PRNGKey, support_size: int, sampling: dict) -> mctx.RootFnOutput:
    """The search root of each observation [B, ...]: h(o), f's value, K actions sampled from
    f's policy (`sampling`: `sample_actions`' keyword arguments) and their prior."""
    latent = network.apply(params, observation, method="represent")
    policy_params, value_logits = network.apply(params, latent, method="predict")
    samples, prior_logits = sample_actions(policy_params, key, **sampling)
    return mctx.RootFnOutput(
        prior_logits=prior_logits,
        value=value_to_scalar(value_logits, support_size),
        embedding={"latent": latent, "samples": samples})


def make_recurrent_fn(network: SampledMuZeroNetwork, support_size: int, discount: float,
                      sampling: dict):
    """mctx's `recurrent_fn`: child `action` ([B] int32, an index into the parent's samples)
    -> the parent's sample u, one model step with tanh(u), and the child's own K samples and
    prior (`sampling`: `sample_actions`' keyword arguments), drawn with mctx's `key`. The
    discount is MuZero's (gamma, times 1 - P(end) with a terminal head)."""

    def recurrent_fn(params, key, action, embedding):
        u = jnp.take_along_axis(embedding["samples"], action[:, None, None], axis=1)[:, 0]
        reward_logits, latent = network.apply(params, embedding["latent"], squash(u),
                                              method="dynamics")
        policy_params, value_logits = network.apply(params, latent, method="predict")
        samples, prior_logits = sample_actions(policy_params, key, **sampling)
        step_discount = jnp.full(action.shape, discount, jnp.float32)
        if network.terminal_head:
            end_logit = network.apply(params, latent, method="terminal_logit")
            step_discount = step_discount * jax.nn.sigmoid(-end_logit)
        output = mctx.RecurrentFnOutput(
            reward=value_to_scalar(reward_logits, support_size), discount=step_discount,
            prior_logits=prior_logits, value=value_to_scalar(value_logits, support_size))
        return output, {"latent": latent, "samples": samples}

    return recurrent_fn


def evaluation_key(key: PRNGKey) -> PRNGKey:
    """A fixed key of `key`'s kind: evaluation's samples and tie-breaks then do not depend on
    the key (the runners' evaluation is deterministic)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key(0)
    return jax.random.PRNGKey(0)


def run_search(network: SampledMuZeroNetwork, params: Params, observation: Array,
               key: PRNGKey, search_config: SearchConfig, sampling: dict, *, evaluation: bool,
               temperature: Array | float | None = None) -> mctx.PolicyOutput:
    """One batched PUCT search over sampled actions from `observation` ([B, ...]): MuZero's
    `search_with` (mctx `muzero_policy`, its Q transform and Dirichlet noise on the K
    children of the root) on the sampled model. Evaluation turns the noise off and searches
    with a fixed key (`evaluation_key`). The root's samples are
    `output.search_tree.embeddings["samples"][:, 0]`."""
    if evaluation:
        key = evaluation_key(key)
    root_key, search_key = jax.random.split(key)
    root = root_output(network, params, observation, root_key, search_config.support_size,
                       sampling)
    recurrent_fn = make_recurrent_fn(network, search_config.support_size,
                                     search_config.discount, sampling)
    return search_with(root, recurrent_fn, params, search_key, search_config,
                       evaluation=evaluation, temperature=temperature)


def root_samples(output: mctx.PolicyOutput) -> Array:
    """[B, K, D] the pre-squash actions sampled at the root of a search."""
    return output.search_tree.embeddings["samples"][:, mctx.Tree.ROOT_INDEX]
