"""Probes of a learnt EfficientZero model, for tests and diagnostics: whether the consistency
heads have collapsed (every state projected to one direction) and whether the dynamics
predict the projection of the true next state rather than of any state.

    projection_similarity   mean pairwise cosine of the target projections of distinct states
    prediction_alignment    cosine of predictor(projector(g(h(o), a))) to the target projection
                            of the true next observation, and to that of an unrelated one

The heads run over the given observations as one batch, as in learning (batch statistics).
"""

from __future__ import annotations

import jax.numpy as jnp

from agents.efficientzero.networks import EfficientZeroNetwork
from podracer.types import Array, Params


def _unit(x: Array) -> Array:
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-8)


def target_projections(network: EfficientZeroNetwork, params: Params,
                       observations: Array) -> Array:
    """[N, P] projector(h(o)) of `observations` [N, ...], normalised to unit length."""
    latent = network.apply(params, observations, method="represent")
    return _unit(network.apply(params, latent, method="project"))


def projection_similarity(network: EfficientZeroNetwork, params: Params,
                          observations: Array) -> Array:
    """[] the mean cosine between the target projections of every pair of distinct
    `observations` [N, ...]: near 1 when the projector maps every state to one direction
    (collapse), near 0 for spread-out projections."""
    z = target_projections(network, params, observations)
    n = z.shape[0]
    cosines = z @ z.T
    return (jnp.sum(cosines) - jnp.trace(cosines)) / (n * (n - 1))


def prediction_alignment(network: EfficientZeroNetwork, params: Params, observations: Array,
                         actions: Array, next_observations: Array) -> tuple[Array, Array]:
    """([], []) the mean cosine of the prediction p = predictor(projector(g(h(o), a))) to the
    target projection of the true next observation, and to that of the next observation of
    another sample (the batch rolled by half its size): a model that has learnt the dynamics
    scores high on the first and low on the second.

    Args:
      observations: [N, ...] o.
      actions: [N] int32 a.
      next_observations: [N, ...] the observation after taking a in o.
    """
    latent = network.apply(params, observations, method="represent")
    _, next_latent = network.apply(params, latent, actions, method="dynamics")
    prediction = _unit(network.apply(
        params, network.apply(params, next_latent, method="project"), method="project_predict"))
    target = target_projections(network, params, next_observations)
    unrelated = jnp.roll(target, target.shape[0] // 2, axis=0)
    return (jnp.mean(jnp.sum(prediction * target, axis=-1)),
            jnp.mean(jnp.sum(prediction * unrelated, axis=-1)))
