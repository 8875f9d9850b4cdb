"""Optimisers the agents share: Clipped LARS (SpeedyZero, Mei et al., 2023).

LARS (You et al., 2017, Algorithm 1) gives each layer l its own step size, the trust ratio

    lambda_l = eta ||w_l|| / (||g_l|| + beta ||w_l||),

and steps along lambda_l (g_l + beta w_l), beta being the weight decay. SpeedyZero clips the
ratio at 1, so that it only ever shrinks a layer's step (the large, unstable steps early in
training) and never enlarges it:

    lambda_l = min(eta ||w_l|| / (||g_l|| + beta ||w_l||), 1).

Here g_l is the update arriving at the transform (the gradient, after whatever comes before it
in an `optax.chain`, e.g. gradient clipping) and w_l the layer's parameters; a "layer" is one
leaf of the parameter pytree. Leaves outside `mask` (by default every leaf of rank < 2: biases
and normalisation scales and offsets) pass through unchanged: no trust ratio, no weight decay.
Where ||w_l|| = 0 (a layer initialised at zero) or ||g_l|| = 0 the ratio is defined to be 1
(plain SGD for that layer): the formula would give 0 (a zero layer would never move) or 0/0.

    tx = clipped_lars(optax.linear_schedule(0.0, 0.1, 1000), momentum=0.9, eta=0.001,
                      weight_decay=1e-4)

`clipped_lars` is `scale_by_clipped_trust_ratio` -> `optax.trace(momentum)` ->
`optax.scale_by_learning_rate(learning_rate)`, the order of `optax.lars` (the learning rate,
possibly a schedule, scales the momentum's output). The weight decay lives inside the trust
ratio transform rather than in a preceding `optax.add_decayed_weights`, because LARS's
denominator holds the norm of the gradient without the decay while the scaled step includes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

__all__ = ["clipped_lars", "matrices_only", "scale_by_clipped_trust_ratio"]

Mask = Any | Callable[[Any], Any]  # a pytree of bools like the params, or params -> such a tree


def matrices_only(params: Any) -> Any:
    """The default mask: True for leaves of rank >= 2 (kernels), False for biases and
    normalisation scales and offsets (rank 1) and scalars."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def _trust_ratio(update: jax.Array, param: jax.Array, eta: float, beta: float) -> jax.Array:
    param_norm = jnp.linalg.norm(param.ravel())
    update_norm = jnp.linalg.norm(update.ravel())
    zero = (param_norm == 0.0) | (update_norm == 0.0)
    # The denominator is made safe so that the branch `where` discards holds no 0/0.
    denominator = jnp.where(zero, 1.0, update_norm + beta * param_norm)
    ratio = jnp.minimum(eta * param_norm / denominator, 1.0)
    return jnp.where(zero, 1.0, ratio).astype(update.dtype)


def _unmasked_clipped_trust_ratio(eta: float, beta: float) -> optax.GradientTransformation:
    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("scale_by_clipped_trust_ratio needs the params: "
                             "call tx.update(updates, state, params)")

        def scale(update, param):
            return _trust_ratio(update, param, eta, beta) * (update + beta * param)

        return jax.tree.map(scale, updates, params), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def scale_by_clipped_trust_ratio(eta: float, beta: float = 0.0, *,
                                 mask: Mask | None = None) -> optax.GradientTransformation:
    """Clipped LARS's per-layer scaling: g -> min(eta ||w|| / (||g|| + beta ||w||), 1) (g + beta w).

    Args:
      eta: the trust coefficient (LARS's eta).
      beta: the weight decay, in the ratio's denominator and added to the step (LARS's beta).
      mask: which leaves are scaled, optax style (a pytree of bools matching the params, or a
        function of the params returning one); the others pass through unchanged. None (the
        default) means `matrices_only`: every leaf of rank >= 2. (The default is None rather
        than the function because `optax.inject_hyperparams` would take a function default for
        a schedule; pass a function mask there with `static_args=("mask",)`.)

    A leaf with ||w|| = 0 or ||g|| = 0 gets ratio 1. Stateless apart from optax's mask wrapper;
    needs `params` in `update`.
    """
    return optax.masked(_unmasked_clipped_trust_ratio(eta, beta),
                        matrices_only if mask is None else mask)


def clipped_lars(learning_rate: optax.ScalarOrSchedule, *, eta: float, momentum: float = 0.9,
                 weight_decay: float = 0.0, mask: Mask | None = None,
                 nesterov: bool = False) -> optax.GradientTransformation:
    """Clipped LARS with heavy-ball momentum: the clipped trust ratio (with weight decay), then
    `optax.trace(momentum)`, then `optax.scale_by_learning_rate(learning_rate)` (a float or an
    optax schedule of the update count, e.g. a warm-up). `mask` as in
    `scale_by_clipped_trust_ratio`; masked-out leaves get momentum SGD without weight decay.
    """
    return optax.chain(
        scale_by_clipped_trust_ratio(eta, weight_decay, mask=mask),
        optax.trace(decay=momentum, nesterov=nesterov),
        optax.scale_by_learning_rate(learning_rate),
    )
