"""PPO's maths (Schulman et al., 2017): GAE(lambda) over the transition layout of
`podracer.types`, its importance-corrected variant for stale data, advantage normalisation over
the global batch (`agents.actor_critic.normalize_advantages`, re-exported), and the clipped
surrogate and value losses. Unbatched and time-major where time matters; callers batch with
`vmap`.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import rlax

from agents.actor_critic import normalize_advantages  # noqa: F401 - part of this module's API
from podracer.types import Array


def _masked_inputs(rewards: Array, discounts: Array, values: Array, mask: Array, *,
                   discount: float) -> tuple[Array, Array]:
    """r_t and gamma_t for rlax, with a masked transition (x_t LAST, x_{t+1} a reset) made into
    a zero TD error that cuts the trace: its reward is V(x_t) and its discount 0."""
    real = mask > 0
    r_t = jnp.where(real, rewards, values[:-1])
    discount_t = jnp.where(real, discounts * discount, 0.0)
    return r_t, discount_t


def gae_advantages(
    rewards: Array,
    discounts: Array,
    values: Array,
    mask: Array,
    *,
    discount: float,
    lambda_: float,
    trace_ratios: Array | None = None,
) -> Array:
    """GAE(lambda) advantages for one time-major sequence (Schulman et al., 2016).

        delta_t = r_{t+1} + gamma d_{t+1} V(x_{t+1}) - V(x_t)
        A_t     = delta_t + gamma d_{t+1} lambda c_{t+1} A_{t+1},    A_T = 0

    where d_{t+1} is the environment's discount at x_{t+1}: 0 at a true terminal, 1 at a
    time-limit end, whose x_{t+1} is the episode's final observation, so a truncated episode
    bootstraps from V(final observation). A masked transition (`mask == 0`: x_t is LAST and
    x_{t+1} the next episode's first observation) gets A_t = 0 and cuts the trace.

    `trace_ratios` ([T], optional) are importance ratios rho_t = pi(a_t|x_t) / mu(a_t|x_t)
    of the policy being evaluated over the one that acted; then c_{t+1} = min(1, rho_{t+1}),
    V-trace's truncated traces (Espeholt et al., 2018), and A_t estimates pi's advantage of
    a_t from mu's data. Without them c = 1, the on-policy estimate; with every rho = 1 the
    two are equal.

    Args:
      rewards: [T] r_1 .. r_T, received on arriving at x_1 .. x_T.
      discounts: [T] the environment's discounts at x_1 .. x_T.
      values: [T+1] V(x_0) .. V(x_T).
      mask: [T] 1.0 for real transitions, 0.0 for masked ones.
      discount: the agent's discount factor gamma.
      lambda_: the trace parameter lambda.
      trace_ratios: [T] rho_0 .. rho_{T-1}, or None.

    Returns:
      [T] A_0 .. A_{T-1}, with gradients stopped.
    """
    chex.assert_rank([rewards, discounts, values, mask], [1, 1, 1, 1])
    r_t, discount_t = _masked_inputs(rewards, discounts, values, mask, discount=discount)
    lambdas = jnp.full_like(discount_t, lambda_)
    if trace_ratios is not None:
        chex.assert_rank(trace_ratios, 1)
        # A_t's trace into A_{t+1} is cut by rho_{t+1}; A_T = 0 makes the last entry moot.
        c = jnp.minimum(1.0, trace_ratios[1:])
        lambdas = lambdas * jnp.concatenate([c, jnp.ones((1,), c.dtype)])
    return rlax.truncated_generalized_advantage_estimation(
        r_t, discount_t, lambdas, values, stop_target_gradients=True)


def vtrace_value_targets(
    rewards: Array,
    discounts: Array,
    values: Array,
    mask: Array,
    rhos: Array,
    *,
    discount: float,
    lambda_: float,
    clip_rho_threshold: float = 1.0,
) -> Array:
    """V-trace value targets v_t for x_0 .. x_{T-1} (Espeholt et al., 2018, eq. 1), from rlax,
    with masked transitions handled as in `gae_advantages`. With every rho = 1 they are the
    lambda-returns A_t + V(x_t) of `gae_advantages`; with clip_rho_threshold = 1,
    v_t - V(x_t) = min(1, rho_t) A_t for `gae_advantages(..., trace_ratios=rhos)`.

    Args are those of `gae_advantages`, with `rhos` [T] the importance ratios. Returns [T].
    """
    chex.assert_rank([rewards, discounts, values, mask, rhos], [1, 1, 1, 1, 1])
    r_t, discount_t = _masked_inputs(rewards, discounts, values, mask, discount=discount)
    errors = rlax.vtrace(values[:-1], values[1:], r_t, discount_t, rhos, lambda_=lambda_,
                         clip_rho_threshold=clip_rho_threshold, stop_target_gradients=True)
    return jax.lax.stop_gradient(errors + values[:-1])


@chex.dataclass(frozen=True)
class SurrogateOutput:
    loss: Array  # [] what is minimised: - weighted mean of the clipped objective
    clip_fraction: Array  # [] fraction of real samples whose ratio lies outside [1-eps, 1+eps]
    approx_kl: Array  # [] mean of (r - 1) - log r, an estimate of KL(old || new)


def clipped_surrogate_loss(
    log_prob: Array,
    old_log_prob: Array,
    advantages: Array,
    mask: Array,
    weights: Array | None = None,
    *,
    clip_eps: float,
) -> SurrogateOutput:
    """PPO's clipped surrogate objective (Schulman et al., 2017, eq. 7), as a loss:

        r_i  = pi_theta(a_i|x_i) / pi_old(a_i|x_i)
        loss = - sum_i m_i w_i min(r_i A_i, clip(r_i, 1 - eps, 1 + eps) A_i) / sum_i m_i

    over a batch of samples i; m is the mask of real transitions and w optional per-sample
    weights (truncated importance weights pi_old/mu when the data came from another policy mu;
    1 otherwise). Advantages get no gradient.

    Args:
      log_prob: [N] log pi_theta(a_i|x_i), differentiated.
      old_log_prob: [N] log pi_old(a_i|x_i).
      advantages: [N] A_i.
      mask: [N] 1.0 for real transitions.
      weights: [N] w_i, or None for 1.
      clip_eps: epsilon.
    """
    chex.assert_rank([log_prob, old_log_prob, advantages, mask], 1)
    advantages = jax.lax.stop_gradient(advantages)
    log_ratio = log_prob - jax.lax.stop_gradient(old_log_prob)
    ratio = jnp.exp(log_ratio)
    objective = jnp.minimum(ratio * advantages,
                            jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages)
    if weights is not None:
        objective = objective * jax.lax.stop_gradient(weights)
    count = jnp.maximum(jnp.sum(mask), 1.0)

    def masked_mean(x):
        return jnp.sum(x * mask) / count

    clipped = (jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32)
    return SurrogateOutput(
        loss=-masked_mean(objective),
        clip_fraction=masked_mean(clipped),
        approx_kl=masked_mean(jax.lax.stop_gradient((ratio - 1.0) - log_ratio)),
    )


def value_loss(values: Array, old_values: Array, targets: Array, mask: Array, *,
               clip_eps: float) -> Array:
    """1/2 mean over real samples of (V - R)^2, or with clipping (clip_eps > 0) of
    max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2), which keeps V from moving
    more than eps from the values the advantages were computed with (the PPO code of
    Schulman et al.). `clip_eps` may be traced; 0 turns clipping off. All args [N]."""
    chex.assert_rank([values, old_values, targets, mask], 1)
    targets = jax.lax.stop_gradient(targets)
    old_values = jax.lax.stop_gradient(old_values)
    unclipped = jnp.square(values - targets)
    clipped_values = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
    clipped = jnp.maximum(unclipped, jnp.square(clipped_values - targets))
    per_sample = jnp.where(clip_eps > 0, clipped, unclipped)
    return 0.5 * jnp.sum(per_sample * mask) / jnp.maximum(jnp.sum(mask), 1.0)
