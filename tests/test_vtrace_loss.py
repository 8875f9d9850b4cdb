"""The V-trace loss against a hand-written IMPALA recursion and rlax on hand-made inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from agents.vtrace import vtrace_loss

GAMMA = 0.9


def _inputs():
    rng = np.random.default_rng(0)
    t, a = 5, 3
    return {
        "logits_t": rng.normal(size=(t, a)).astype(np.float32),
        "values": rng.normal(size=(t + 1,)).astype(np.float32),
        "actions": np.array([0, 2, 1, 1, 0], np.int32),
        "behaviour_logits_t": rng.normal(size=(t, a)).astype(np.float32),
        "rewards": np.array([0.5, -1.0, 0.0, 2.0, 1.0], np.float32),
        "discounts": np.array([1.0, 1.0, 0.0, 1.0, 1.0], np.float32),  # x_3 is a true terminal
    }


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _reference(inp, mask, entropy_cost=0.01, baseline_cost=0.5):
    """IMPALA's equations written out with numpy loops (Espeholt et al., 2018, sec. 4)."""
    log_pi = _log_softmax(inp["logits_t"].astype(np.float64))
    log_mu = _log_softmax(inp["behaviour_logits_t"].astype(np.float64))
    a = inp["actions"]
    v = inp["values"].astype(np.float64)
    t_len = len(a)
    rho = np.exp(log_pi[np.arange(t_len), a] - log_mu[np.arange(t_len), a])
    clipped_rho, c = np.minimum(1.0, rho), np.minimum(1.0, rho)
    r = np.where(mask > 0, inp["rewards"], v[:-1])
    gamma = np.where(mask > 0, GAMMA * inp["discounts"], 0.0)
    delta = clipped_rho * (r + gamma * v[1:] - v[:-1])
    vs = np.zeros(t_len + 1)
    vs[t_len] = v[t_len]
    acc = 0.0
    for s in reversed(range(t_len)):
        acc = delta[s] + gamma[s] * c[s] * acc
        vs[s] = v[s] + acc
    pg_adv = clipped_rho * (r + gamma * vs[1:] - v[:-1])
    n = max(mask.sum(), 1.0)
    policy = -np.sum(log_pi[np.arange(t_len), a] * pg_adv * mask) / n
    baseline = 0.5 * np.sum((vs[:-1] - v[:-1]) ** 2 * mask) / n
    entropy = np.sum(-(np.exp(log_pi) * log_pi).sum(-1) * mask) / n
    return policy + baseline_cost * baseline - entropy_cost * entropy, policy, baseline, entropy


def _reference_targets(inp, mask):
    """The V-trace targets v_s of the reference recursion above (no masking of rewards)."""
    log_pi = _log_softmax(inp["logits_t"].astype(np.float64))
    log_mu = _log_softmax(inp["behaviour_logits_t"].astype(np.float64))
    a, v = inp["actions"], inp["values"].astype(np.float64)
    rho = np.minimum(1.0, np.exp((log_pi - log_mu)[np.arange(len(a)), a]))
    gamma = GAMMA * inp["discounts"] * mask
    vs, acc = v.copy(), 0.0
    for s in reversed(range(len(a))):
        acc = rho[s] * (inp["rewards"][s] + gamma[s] * v[s + 1] - v[s]) + gamma[s] * rho[s] * acc
        vs[s] = v[s] + acc
    return vs


def test_loss_matches_the_hand_written_recursion():
    inp = _inputs()
    mask = np.ones(5, np.float32)
    out = vtrace_loss(**inp, mask=mask, discount=GAMMA)
    total, policy, baseline, entropy = _reference(inp, mask)
    np.testing.assert_allclose(out.policy_loss, policy, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.baseline_loss, baseline, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.entropy, entropy, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.loss, total, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("masked", [2, 4])
def test_masked_transition_contributes_nothing_and_cuts_the_trace(masked):
    # x_masked was LAST: x_masked -> x_masked+1 is a reset. At 2 its discount is already 0
    # (a terminal); at 4 it is 1, so only the mask cuts the trace there.
    inp = _inputs()
    mask = np.ones(5, np.float32)
    mask[masked] = 0.0
    out = vtrace_loss(**inp, mask=mask, discount=GAMMA)
    total, policy, baseline, _ = _reference(inp, mask)
    np.testing.assert_allclose(out.loss, total, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.policy_loss, policy, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.baseline_loss, baseline, rtol=1e-5, atol=1e-6)
    # Changing the reward of the masked transition must not change anything.
    changed = dict(inp, rewards=inp["rewards"].copy())
    changed["rewards"][masked] = 100.0
    out_changed = vtrace_loss(**changed, mask=mask, discount=GAMMA)
    np.testing.assert_allclose(out_changed.loss, out.loss, rtol=1e-6)


def test_policy_and_baseline_terms_agree_with_rlax():
    inp = _inputs()
    mask = np.ones(5, np.float32)
    out = vtrace_loss(**inp, mask=mask, discount=GAMMA, entropy_cost=0.0)
    log_pi = jax.nn.log_softmax(inp["logits_t"])
    log_mu = jax.nn.log_softmax(inp["behaviour_logits_t"])
    idx = jnp.arange(5), inp["actions"]
    rho = jnp.exp(log_pi[idx] - log_mu[idx])
    v = jnp.asarray(inp["values"])
    errors = rlax.vtrace(v[:-1], v[1:], inp["rewards"], GAMMA * inp["discounts"], rho)
    vs = errors + v[:-1]
    q = inp["rewards"] + GAMMA * inp["discounts"] * jnp.append(vs[1:], v[-1])
    adv = jnp.minimum(1.0, rho) * (q - v[:-1])
    expected_policy = rlax.policy_gradient_loss(inp["logits_t"], inp["actions"], adv,
                                                jnp.ones(5))
    np.testing.assert_allclose(out.policy_loss, expected_policy, rtol=1e-5)
    np.testing.assert_allclose(out.baseline_loss, 0.5 * jnp.mean(errors**2), rtol=1e-5)
    expected_entropy = -rlax.entropy_loss(inp["logits_t"], jnp.ones(5))
    np.testing.assert_allclose(out.entropy, expected_entropy, rtol=1e-5)


def test_value_gradients_come_from_the_baseline_term_only():
    inp = _inputs()
    mask = np.ones(5, np.float32)

    def loss(values):
        return vtrace_loss(**dict(inp, values=values), mask=mask, discount=GAMMA).loss

    grad = jax.grad(loss)(jnp.asarray(inp["values"]))
    # Targets and advantages are stopped, so only the baseline term reaches the values:
    # d/dV(x_s) of baseline_cost * 1/2 mean_s (v_s - V(x_s))^2 = -baseline_cost (v_s - V(x_s)) / T
    # for s < T, and the bootstrap V(x_T) gets no gradient at all.
    vs = _reference_targets(inp, mask)
    expected = -0.5 * (vs[:-1] - inp["values"][:-1]) / 5
    np.testing.assert_allclose(grad[:-1], expected, rtol=1e-4, atol=1e-6)
    assert float(grad[-1]) == 0.0
