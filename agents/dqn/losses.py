"""The DQN family's losses over a batch of n-step transitions, with rlax's TD maths:

    double_q_loss        Double DQN (van Hasselt et al., 2016) on n-step returns
    categorical_loss     C51 (Bellemare et al., 2017), double or not, on n-step returns
    q_lambda_targets     PQN's Q(lambda) returns along a trajectory (Gallici et al., 2024)

Each takes unbatched or [S]-batched arrays as documented; n-step returns come from
`podracer.transition_replay.n_step_target`.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import rlax

from podracer.types import Array


def double_q_loss(q_tm1: Array, a_tm1: Array, r_t: Array, discount_t: Array,
                  q_t_target: Array, q_t_online: Array, *, double: bool = True,
                  huber_delta: float = 1.0) -> tuple[Array, Array]:
    """Per-sample losses [S] and TD errors [S] of (Double) Q-learning:

        td = r_t + discount_t Q_target(o_t, argmax_a Q_select(o_t, a)) - Q(o_{t-1}, a_{t-1})

    with Q_select the online network (`double`) or the target one (plain DQN, whose target is
    then max_a Q_target(o_t, a)). The loss is Huber(td, `huber_delta`), or td^2 / 2 when
    `huber_delta` is 0.

    Args:
      q_tm1: [S, A] online Q at the sampled positions.
      a_tm1: [S] int32 actions taken there.
      r_t: [S] n-step returns.
      discount_t: [S] bootstrap discounts (gamma^k times the environment's discounts).
      q_t_target: [S, A] target-network Q where the returns bootstrap.
      q_t_online: [S, A] online Q there (read only when `double`).
    """
    chex.assert_rank([q_tm1, a_tm1, r_t, discount_t, q_t_target, q_t_online], [2, 1, 1, 1, 2, 2])
    selector = q_t_online if double else q_t_target
    td = jax.vmap(rlax.double_q_learning)(q_tm1, a_tm1, r_t, discount_t, q_t_target,
                                          jax.lax.stop_gradient(selector))
    loss = rlax.huber_loss(td, huber_delta) if huber_delta > 0 else 0.5 * td**2
    return loss, td


def categorical_loss(atoms: Array, logits_tm1: Array, a_tm1: Array, r_t: Array,
                     discount_t: Array, logits_t_target: Array, q_t_online: Array, *,
                     double: bool = True) -> Array:
    """Per-sample cross-entropies [S] between the online return distribution at (o_{t-1},
    a_{t-1}) and the target one, r_t + discount_t Z_target(o_t, a*), projected onto `atoms`,
    with a* = argmax of the online Q (`double`) or of the target's expected Q.

    Args:
      atoms: [M] the fixed returns of the distributions' support.
      logits_tm1: [S, A, M]; a_tm1: [S]; r_t, discount_t: [S] as in `double_q_loss`.
      logits_t_target: [S, A, M] the target network's where the returns bootstrap.
      q_t_online: [S, A] the online Q there (read only when `double`).
    """
    chex.assert_rank([atoms, logits_tm1, logits_t_target], [1, 3, 3])
    if not double:
        q_t_online = jnp.sum(jax.nn.softmax(logits_t_target) * atoms, axis=-1)
    return jax.vmap(rlax.categorical_double_q_learning, in_axes=(None, 0, 0, 0, 0, None, 0, 0))(
        atoms, logits_tm1, a_tm1, r_t, discount_t, atoms, logits_t_target,
        jax.lax.stop_gradient(q_t_online))


def q_lambda_targets(reward: Array, discount: Array, last: Array, q_t: Array, *,
                     gamma: float | Array, lambda_: float | Array) -> Array:
    """PQN's Q(lambda) returns G_0 .. G_{T-1} along a time-major trajectory [T+1, B]:

        G_t = r_{t+1} + gamma d_{t+1} ((1 - lambda_{t+1}) max_a Q(o_{t+1}, a) + lambda_{t+1} G_{t+1})

    (Peng's Q(lambda), Watkins' 1989 recursion as rlax.lambda_returns computes it), with
    lambda_{t+1} = 0 where o_{t+1} is LAST, so that no return reaches across an episode's
    end; the last return bootstraps from max_a Q(o_T, a).

    Args:
      reward, discount: [T, B] r and d received on arriving at o_1 .. o_T.
      last: [T, B] bool, whether o_1 .. o_T is LAST.
      q_t: [T, B, A] Q(o_1 .. o_T), held fixed (no gradient flows into the targets).
    Returns:
      [T, B] the targets.
    """
    chex.assert_rank([reward, discount, last, q_t], [2, 2, 2, 3])
    v_t = jnp.max(jax.lax.stop_gradient(q_t), axis=-1)
    lambdas = jnp.asarray(lambda_, jnp.float32) * (1.0 - last.astype(jnp.float32))
    returns = jax.vmap(rlax.lambda_returns, in_axes=(1, 1, 1, 1), out_axes=1)(
        reward, jnp.asarray(gamma, jnp.float32) * discount, v_t, lambdas)
    return jax.lax.stop_gradient(returns)
