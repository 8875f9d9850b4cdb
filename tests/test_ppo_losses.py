"""PPO's maths against hand-worked cases and rlax: GAE with a termination and a truncation,
its importance-corrected variant, the clipped surrogate, the clipped value loss, and advantage
normalisation over the global batch on 1 and 8 simulated devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from agents.ppo import (
    clipped_surrogate_loss,
    gae_advantages,
    normalize_advantages,
    value_loss,
    vtrace_value_targets,
)
from podracer import replication
from podracer.types import DEVICE_AXIS

# One sequence of T = 6 transitions over 7 timesteps (the layout of podracer/types.py):
#   x_0 MID, x_1 MID, x_2 LAST (true terminal, discount 0), x_3 FIRST (reset), x_4 MID,
#   x_5 LAST (time limit: discount 1, final observation kept), x_6 FIRST (reset).
# Transitions x_2 -> x_3 and x_5 -> x_6 are resets: masked. Rewards on arriving at x_3 and x_6
# are resets' and must not matter (9.0 here).
REWARDS = np.array([1.0, 0.0, 9.0, 2.0, 1.0, 9.0], np.float32)  # r_1 .. r_6
DISCOUNTS = np.array([1.0, 0.0, 1.0, 1.0, 1.0, 1.0], np.float32)  # at x_1 .. x_6
MASK = np.array([1.0, 1.0, 0.0, 1.0, 1.0, 0.0], np.float32)
VALUES = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], np.float32)  # V(x_0) .. V(x_6)
GAMMA, LAMBDA = 0.5, 0.5


def test_gae_hand_worked_with_a_termination_and_a_truncation():
    # delta_0 = 1 + 0.5 * 2 - 1 = 1          delta_1 = 0 + 0.5 * 0 * 3 - 2 = -2 (terminal)
    # delta_3 = 2 + 0.5 * 5 - 4 = 0.5        delta_4 = 1 + 0.5 * 1 * 6 - 5 = -1 (truncation:
    #                                                   bootstraps from V(final obs) = 6)
    # A_5 = A_2 = 0 (masked), A_4 = -1, A_3 = 0.5 + 0.25 * (-1) = 0.25,
    # A_1 = -2 (discount 0 cuts the trace), A_0 = 1 + 0.25 * (-2) = 0.5
    advantages = gae_advantages(REWARDS, DISCOUNTS, VALUES, MASK, discount=GAMMA,
                                lambda_=LAMBDA)
    np.testing.assert_allclose(advantages, [0.5, -2.0, 0.0, 0.25, -1.0, 0.0], atol=1e-6)


def test_gae_truncation_is_not_a_termination():
    terminal = DISCOUNTS.copy()
    terminal[4] = 0.0  # the same episode end at x_5, read as a terminal
    advantages = gae_advantages(REWARDS, terminal, VALUES, MASK, discount=GAMMA,
                                lambda_=LAMBDA)
    # delta_4 = 1 - 5 = -4 with no bootstrap; A_3 = 0.5 + 0.25 * (-4) = -0.5
    np.testing.assert_allclose(advantages[3:5], [-0.5, -4.0], atol=1e-6)


def test_gae_ignores_the_rewards_of_reset_transitions():
    changed = REWARDS.copy()
    changed[[2, 5]] = -100.0
    a = gae_advantages(REWARDS, DISCOUNTS, VALUES, MASK, discount=GAMMA, lambda_=LAMBDA)
    b = gae_advantages(changed, DISCOUNTS, VALUES, MASK, discount=GAMMA, lambda_=LAMBDA)
    np.testing.assert_array_equal(a, b)


def test_gae_equals_rlax_within_an_episode():
    rng = np.random.default_rng(0)
    r, v = rng.normal(size=8).astype(np.float32), rng.normal(size=9).astype(np.float32)
    d = np.ones(8, np.float32)
    ours = gae_advantages(r, d, v, np.ones(8, np.float32), discount=0.99, lambda_=0.95)
    reference = rlax.truncated_generalized_advantage_estimation(r, 0.99 * d, 0.95, v)
    np.testing.assert_allclose(ours, reference, rtol=1e-6)


RHOS = np.array([1.0, 0.2, 1.0, 3.0, 0.5, 1.0], np.float32)


def test_corrected_gae_hand_worked():
    # c_{t+1} = min(1, rho_{t+1}) scales the trace from A_t into A_{t+1}:
    # A_3 = 0.5 + 0.25 * min(1, 0.5) * (-1) = 0.375;  A_0 = 1 + 0.25 * min(1, 0.2) * (-2) = 0.9
    advantages = gae_advantages(REWARDS, DISCOUNTS, VALUES, MASK, discount=GAMMA,
                                lambda_=LAMBDA, trace_ratios=RHOS)
    np.testing.assert_allclose(advantages, [0.9, -2.0, 0.0, 0.375, -1.0, 0.0], atol=1e-6)
    # All ratios 1: exactly the on-policy estimate.
    ones = gae_advantages(REWARDS, DISCOUNTS, VALUES, MASK, discount=GAMMA, lambda_=LAMBDA,
                          trace_ratios=np.ones(6, np.float32))
    plain = gae_advantages(REWARDS, DISCOUNTS, VALUES, MASK, discount=GAMMA, lambda_=LAMBDA)
    np.testing.assert_array_equal(ones, plain)


def test_vtrace_value_targets_hand_worked():
    # v_t - V(x_t) = min(1, rho_t) delta_t + gamma_t lambda min(1, rho_t) (v_{t+1} - V(x_{t+1})):
    # t=4: 0.5 * (-1) = -0.5; t=3: 0.5 + 0.5 * 0.5 * 1 * (-0.5) = 0.375; t=1: 0.2 * (-2) = -0.4
    # (terminal); t=0: 1 + 0.5 * 0.5 * 1 * (-0.4) = 0.9; masked t=2, 5: 0.
    targets = vtrace_value_targets(REWARDS, DISCOUNTS, VALUES, MASK, RHOS, discount=GAMMA,
                                   lambda_=LAMBDA)
    np.testing.assert_allclose(targets - VALUES[:-1], [0.9, -0.4, 0.0, 0.375, -0.5, 0.0],
                               atol=1e-6)
    # ... which is min(1, rho_t) times the corrected advantage, as docs/ppo.md says.
    advantages = gae_advantages(REWARDS, DISCOUNTS, VALUES, MASK, discount=GAMMA,
                                lambda_=LAMBDA, trace_ratios=RHOS)
    np.testing.assert_allclose(targets - VALUES[:-1], np.minimum(1.0, RHOS) * advantages,
                               atol=1e-6)


RATIOS = np.array([1.5, 0.5, 1.1, 0.7], np.float32)
ADVANTAGES = np.array([1.0, 1.0, -1.0, -1.0], np.float32)


def _surrogate(mask, weights=None, old=None):
    old = np.zeros(4, np.float32) if old is None else old
    return clipped_surrogate_loss(jnp.log(RATIOS) + old, old, ADVANTAGES, mask, weights,
                                  clip_eps=0.2)


def test_clipped_surrogate_hand_worked():
    # min(r A, clip(r, 0.8, 1.2) A): 1.2, 0.5, -1.1, -0.8; mean -0.05, loss 0.05.
    out = _surrogate(np.ones(4, np.float32))
    np.testing.assert_allclose(out.loss, 0.05, atol=1e-6)
    np.testing.assert_allclose(out.clip_fraction, 0.75)  # all but r = 1.1
    # The fourth sample masked: (1.2 + 0.5 - 1.1) / 3 = 0.2.
    np.testing.assert_allclose(_surrogate(np.array([1, 1, 1, 0], np.float32)).loss, -0.2,
                               atol=1e-6)
    # Weights (truncated importance weights): (2 * 1.2 + 0.5 - 1.1 - 0.8) / 4 = 0.25.
    weighted = _surrogate(np.ones(4, np.float32), np.array([2, 1, 1, 1], np.float32))
    np.testing.assert_allclose(weighted.loss, -0.25, atol=1e-6)


def test_clipped_surrogate_gradient_is_zero_where_clipped():
    def loss(log_prob):
        return clipped_surrogate_loss(log_prob, jnp.zeros(4), ADVANTAGES, jnp.ones(4),
                                      clip_eps=0.2).loss

    grad = jax.grad(loss)(jnp.log(RATIOS))
    # d/d log pi of -r A / 4 is -r A / 4 where unclipped; 0 where the clipped term is the min.
    np.testing.assert_allclose(grad, [0.0, -0.125, 0.275, 0.0], atol=1e-6)


def test_clipped_surrogate_equals_rlax():
    rng = np.random.default_rng(1)
    log_prob = rng.normal(size=32).astype(np.float32) * 0.3
    old = rng.normal(size=32).astype(np.float32) * 0.3
    adv = rng.normal(size=32).astype(np.float32)
    ours = clipped_surrogate_loss(log_prob, old, adv, np.ones(32, np.float32), clip_eps=0.1)
    reference = rlax.clipped_surrogate_pg_loss(jnp.exp(log_prob - old), adv, 0.1)
    np.testing.assert_allclose(ours.loss, reference, rtol=1e-5)


def test_value_loss_hand_worked():
    values, old, targets = (np.array(x, np.float32) for x in ([1.0, 2.0], [0.5, 2.0],
                                                              [2.0, 1.0]))
    mask = np.ones(2, np.float32)
    # clipped: V_0 may move only to 0.5 + 0.2 = 0.7: max(1, 1.69); V_1 did not move: 1.
    np.testing.assert_allclose(value_loss(values, old, targets, mask, clip_eps=0.2),
                               0.5 * (1.69 + 1.0) / 2, rtol=1e-6)
    # unclipped: 1/2 mean(1, 1)
    np.testing.assert_allclose(value_loss(values, old, targets, mask, clip_eps=0.0), 0.5)


# ---------------------------------------------------------------------------------------------
# Normalisation over the global batch.


def _batch(seed=2, t=5, b=16):
    rng = np.random.default_rng(seed)
    advantages = (rng.normal(size=(t, b)) * 3 + np.arange(b)).astype(np.float32)
    mask = (rng.uniform(size=(t, b)) > 0.3).astype(np.float32)
    return advantages, mask


def _per_device(advantages, mask, num_devices, axis_name):
    """Splits [T, B] along B over `num_devices` devices and normalises on each."""
    mesh = replication.make_mesh(jax.devices()[:num_devices])
    t, b = advantages.shape

    def split(x):
        return x.reshape(t, num_devices, b // num_devices).transpose(1, 0, 2)

    fn = replication.replicate(
        lambda a, m: normalize_advantages(a, m, axis_name=axis_name), mesh)
    normalised, mean, std = fn(replication.from_global(split(advantages), mesh),
                               replication.from_global(split(mask), mesh))
    normalised = np.asarray(normalised).transpose(1, 0, 2).reshape(t, b)
    return normalised, np.asarray(mean), np.asarray(std)


@pytest.mark.parametrize("num_devices", [1, 8])
def test_normalisation_uses_the_global_batch(num_devices):
    advantages, mask = _batch()
    real = advantages[mask > 0].astype(np.float64)
    expected = (advantages - real.mean()) / (real.std() + 1e-8) * mask
    normalised, mean, std = _per_device(advantages, mask, num_devices, DEVICE_AXIS)
    np.testing.assert_allclose(mean, np.full(num_devices, real.mean()), rtol=1e-5)
    np.testing.assert_allclose(std, np.full(num_devices, real.std()), rtol=1e-5)
    np.testing.assert_allclose(normalised, expected, rtol=1e-5, atol=1e-5)


def test_normalisation_is_equal_on_1_and_8_devices_and_not_per_device():
    advantages, mask = _batch()
    one, *_ = _per_device(advantages, mask, 1, DEVICE_AXIS)
    eight, *_ = _per_device(advantages, mask, 8, DEVICE_AXIS)
    np.testing.assert_allclose(eight, one, rtol=1e-5, atol=1e-5)
    # Statistics per device (no pmean) would differ: each device's columns have other means.
    local, *_ = _per_device(advantages, mask, 8, None)
    assert np.max(np.abs(local - one)) > 0.5
