"""The IMPALA loss: V-trace targets (rlax), policy gradient, baseline and entropy terms, with the
optional remedies for unnormalised policy gradients: reward scaling, advantage normalisation over
the batch, and PopArt's value scale (`value_scale`, the statistics kept by `learning.py`)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import rlax

from agents.actor_critic import normalize_advantages
from podracer.types import Array

AxisName = str | tuple[str, ...] | None


@chex.dataclass(frozen=True)
class LossOutput:
    loss: Array  # [] total, what is minimised
    policy_loss: Array  # []
    baseline_loss: Array  # []
    entropy: Array  # [] mean policy entropy over real transitions
    mean_rho: Array  # [] mean importance ratio pi/mu over real transitions
    # Scales, for diagnosis (the policy-gradient and entropy terms' gradients w.r.t. the logits
    # are analytic, so measuring them costs no backward pass):
    advantage_mean: Array  # [] of the raw pg advantages (value units), over `stats_axis_name`
    advantage_std: Array  # [] idem
    pg_logit_grad: Array  # [] mean over real t of |d policy term / d logits_t| (what is used)
    entropy_logit_grad: Array  # [] mean over real t of |entropy_cost * d H_t / d logits_t|
    # The first two moments of the V-trace targets v_s (value units) over `stats_axis_name`:
    # what PopArt's statistics track.
    target_mean: Array  # []
    target_sq_mean: Array  # []


def vtrace_loss(
    logits_t: Array,
    values: Array,
    actions: Array,
    behaviour_logits_t: Array,
    rewards: Array,
    discounts: Array,
    mask: Array,
    *,
    discount: float,
    lambda_: float = 1.0,
    clip_rho_threshold: float = 1.0,
    clip_pg_rho_threshold: float = 1.0,
    baseline_cost: float = 0.5,
    entropy_cost: float = 0.01,
    reward_scale: float = 1.0,
    value_scale: Array | float = 1.0,
    normalize: bool = False,
    stats_axis_name: AxisName = None,
) -> LossOutput:
    """IMPALA's loss for one time-major sequence (Espeholt et al., 2018, eq. 1 and 4).

    For each transition t (with rho_t = pi(a_t|x_t) / mu(a_t|x_t), clipped as in the paper):
        v_s = V(x_s) + sum_{t>=s} gamma^{t-s} (prod_{i<t} c_i) rho_t (r_{t+1} + gamma V(x_{t+1}) - V(x_t))
        policy loss   = -rho_t (r_{t+1} + gamma v_{t+1} - V(x_t)) log pi(a_t|x_t)
        baseline loss = 1/2 (v_t - V(x_t))^2
    averaged over the real transitions (`mask == 1`). A masked transition (its x_t is LAST,
    so x_{t+1} belongs to the next episode) contributes nothing and cuts the traces: its reward
    is replaced by V(x_t) and its discount by 0, which makes v_t = V(x_t) exactly.

    Args:
      logits_t: [T, A] the learner's policy logits at x_0 .. x_{T-1}.
      values: [T+1] the learner's values at x_0 .. x_T.
      actions: [T] a_0 .. a_{T-1}.
      behaviour_logits_t: [T, A] the actor's logits when it chose a_t.
      rewards: [T] r_1 .. r_T, received on arriving at x_1 .. x_T.
      discounts: [T] the environment's discounts at x_1 .. x_T (0 at a true terminal).
      mask: [T] 1.0 for real transitions, 0.0 for masked ones.
      discount: the agent's discount factor gamma.
      reward_scale: the rewards are multiplied by it before anything else.
      value_scale: PopArt's sigma: `values` are unnormalised (sigma n(x) + mu), the baseline
        error and the pg advantage are divided by it, i.e. measured in normalised units.
      normalize: the pg advantages are normalised to mean 0 and standard deviation 1 over the
        real transitions of the batch named by `stats_axis_name` (as PPO does).
      stats_axis_name: the axes (a vmap over sequences, the device axis) over which batch
        statistics are pooled; `None`: this sequence alone.
    """
    chex.assert_rank([logits_t, values, actions, behaviour_logits_t, rewards, discounts, mask],
                     [2, 1, 1, 2, 1, 1, 1])
    chex.assert_type([actions], [int])
    v_tm1, v_t = values[:-1], values[1:]
    real = mask > 0
    r_t = jnp.where(real, rewards * reward_scale, jax.lax.stop_gradient(v_tm1))
    discount_t = jnp.where(real, discounts * discount, 0.0)

    log_pi = jax.nn.log_softmax(logits_t)
    log_mu = jax.nn.log_softmax(behaviour_logits_t)
    log_rho = jnp.take_along_axis(log_pi - log_mu, actions[:, None], axis=-1)[:, 0]
    rho_tm1 = jnp.exp(jax.lax.stop_gradient(log_rho))

    vtrace = rlax.vtrace_td_error_and_advantage(
        v_tm1, v_t, r_t, discount_t, rho_tm1,
        lambda_=lambda_,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
    )
    num_real = jnp.maximum(mask.sum(), 1.0)

    def pooled_mean(x):  # masked mean over this sequence and the axes `stats_axis_name`
        total, count = jnp.sum(x * mask), jnp.sum(mask)
        if stats_axis_name is not None:
            total, count = jax.lax.pmean((total, count), stats_axis_name)
        return total / jnp.maximum(count, 1.0)

    raw_advantage = jax.lax.stop_gradient(vtrace.pg_advantage)
    advantage_mean = pooled_mean(raw_advantage)
    advantage_std = jnp.sqrt(pooled_mean(jnp.square(raw_advantage - advantage_mean)))
    targets = jax.lax.stop_gradient(vtrace.errors + v_tm1)  # v_s
    target_mean, target_sq_mean = pooled_mean(targets), pooled_mean(jnp.square(targets))

    advantage = raw_advantage / value_scale
    if normalize:
        advantage, _, _ = normalize_advantages(advantage, mask, axis_name=stats_axis_name)
    log_pi_a = jnp.take_along_axis(log_pi, actions[:, None], axis=-1)[:, 0]
    policy_loss = -jnp.sum(log_pi_a * advantage * mask) / num_real
    baseline_loss = 0.5 * jnp.sum(jnp.square(vtrace.errors / value_scale) * mask) / num_real
    pi = jax.nn.softmax(logits_t)
    entropy_t = -jnp.sum(pi * log_pi, axis=-1)
    entropy = jnp.sum(entropy_t * mask) / num_real
    loss = policy_loss + baseline_cost * baseline_loss - entropy_cost * entropy

    # d(-A log pi_a)/dlogits = -A (onehot_a - pi);  d(c_e H)/dlogits = -c_e pi (log pi + H).
    pi, log_pi = jax.lax.stop_gradient(pi), jax.lax.stop_gradient(log_pi)
    onehot = jax.nn.one_hot(actions, pi.shape[-1])
    pg_grad_t = jnp.abs(advantage) * jnp.linalg.norm(onehot - pi, axis=-1)
    entropy_grad_t = entropy_cost * jnp.linalg.norm(
        pi * (log_pi + jax.lax.stop_gradient(entropy_t)[:, None]), axis=-1)
    return LossOutput(
        loss=loss,
        policy_loss=policy_loss,
        baseline_loss=baseline_loss,
        entropy=entropy,
        mean_rho=jnp.sum(rho_tm1 * mask) / num_real,
        advantage_mean=advantage_mean,
        advantage_std=advantage_std,
        pg_logit_grad=jnp.sum(pg_grad_t * mask) / num_real,
        entropy_logit_grad=jnp.sum(entropy_grad_t * mask) / num_real,
        target_mean=target_mean,
        target_sq_mean=target_sq_mean,
    )
