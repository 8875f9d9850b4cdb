"""`agents.vtrace.learning` alone: one learner step of a two-parameter "table" network (logits
and a value that ignore the observation) with plain SGD, against the IMPALA update derived by
hand for one on-policy transition per sequence, and the same step pmean'd over two devices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agents.actor_critic import LearnerState
from agents.vtrace import learning
from podracer.types import StepType, TimeStep, Trajectory

GAMMA, BASELINE_COST, ENTROPY_COST, LR = 0.9, 0.5, 0.01, 0.1
HPARAMS = {"discount": GAMMA, "lambda_": 1.0, "clip_rho_threshold": 1.0,
           "clip_pg_rho_threshold": 1.0, "baseline_cost": BASELINE_COST,
           "entropy_cost": ENTROPY_COST}


class Table:
    """The same logits [A] and value for every observation [B, ...]."""

    def apply(self, params, observation):
        b = observation.shape[0]
        return (jnp.broadcast_to(params["logits"], (b,) + params["logits"].shape),
                jnp.broadcast_to(params["value"], (b,)))


def _state(logits, value):
    params = {"logits": jnp.asarray(logits, jnp.float32), "value": jnp.asarray(value, jnp.float32)}
    return LearnerState(params=params, opt_state=optax.sgd(LR).init(params),
                        updates=jnp.zeros((), jnp.int32),
                        hparams={k: jnp.asarray(v, jnp.float32) for k, v in HPARAMS.items()})


def _trajectory(logits, actions, rewards):
    """T = 1: x_0 -> x_1 in each of B sequences, acted on by the current policy (rho = 1)."""
    b = len(actions)
    return Trajectory(
        timestep=TimeStep(step_type=jnp.asarray([[StepType.FIRST] * b, [StepType.MID] * b]),
                          reward=jnp.asarray([[0.0] * b, rewards], jnp.float32),
                          discount=jnp.ones((2, b), jnp.float32),
                          observation=jnp.zeros((2, b, 3), jnp.float32)),
        action=jnp.asarray([actions], jnp.int32),
        extras={"logits": jnp.broadcast_to(jnp.asarray(logits, jnp.float32),
                                           (1, b, len(logits)))})


def _by_hand(logits, value, actions, rewards):
    """IMPALA for one on-policy transition (rho = c = 1, lambda = 1, V(x_1) = V(x_0) = V):
    v_0 = r + gamma V, so the TD error delta = r + gamma V - V is both the baseline error and
    the policy-gradient advantage. Per sequence:
        loss = -log pi_a delta + c_b delta^2 / 2 - c_e H,   H = -sum pi log pi
        d/dlogits = -delta (onehot_a - pi) + c_e pi (log pi + H)
        d/dV = -c_b delta            (the targets carry no gradient)
    averaged over the B sequences."""
    logits = np.asarray(logits, np.float64)
    pi = np.exp(logits - logits.max())
    pi /= pi.sum()
    log_pi = np.log(pi)
    entropy = -np.sum(pi * log_pi)
    losses, policy_losses, baseline_losses, g_logits, g_value = [], [], [], [], []
    for a, r in zip(actions, rewards):
        delta = r + GAMMA * value - value
        policy_losses.append(-log_pi[a] * delta)
        baseline_losses.append(0.5 * delta ** 2)
        losses.append(policy_losses[-1] + BASELINE_COST * baseline_losses[-1]
                      - ENTROPY_COST * entropy)
        g_logits.append(-delta * (np.eye(len(pi))[a] - pi) + ENTROPY_COST * pi * (log_pi + entropy))
        g_value.append(-BASELINE_COST * delta)
    grads = {"logits": np.mean(g_logits, axis=0), "value": np.mean(g_value)}
    metrics = {"loss": np.mean(losses), "policy_loss": np.mean(policy_losses),
               "baseline_loss": np.mean(baseline_losses), "entropy": entropy, "mean_rho": 1.0,
               "grad_norm": np.sqrt(np.sum(grads["logits"] ** 2) + grads["value"] ** 2)}
    return grads, metrics


LOGITS, VALUE = [np.log(3.0), 0.0], 0.5


def test_learner_step_alone_is_the_hand_derived_impala_update():
    actions, rewards = [0, 1], [1.0, -0.5]
    state = _state(LOGITS, VALUE)
    new_state, metrics = jax.jit(lambda s, tr: learning.learner_step(
        Table(), optax.sgd(LR), s, tr, None, axis_name=None))(
            state, _trajectory(LOGITS, actions, rewards))
    grads, expected = _by_hand(LOGITS, VALUE, actions, rewards)
    for name, value in expected.items():
        np.testing.assert_allclose(metrics[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(new_state.params["logits"], np.asarray(LOGITS) - LR * grads["logits"],
                               rtol=1e-6)
    np.testing.assert_allclose(new_state.params["value"], VALUE - LR * grads["value"], rtol=1e-6)
    assert int(new_state.updates) == 1


def test_learner_step_averages_gradients_and_metrics_over_the_device_axis():
    # Two devices, each with its own sequence: the step equals one on both sequences at once.
    actions, rewards = [0, 1], [1.0, -0.5]
    per_device = jax.tree.map(lambda *xs: jnp.stack(xs), *[
        _trajectory(LOGITS, [a], [r]) for a, r in zip(actions, rewards)])
    state = _state(LOGITS, VALUE)
    new_state, metrics = jax.pmap(
        lambda s, tr: learning.learner_step(Table(), optax.sgd(LR), s, tr, None,
                                            axis_name="devices"),
        axis_name="devices", in_axes=(None, 0), devices=jax.devices()[:2])(state, per_device)
    grads, expected = _by_hand(LOGITS, VALUE, actions, rewards)
    for name in ("loss", "policy_loss", "baseline_loss"):
        np.testing.assert_allclose(metrics[name], [expected[name]] * 2, rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(new_state.params["value"], [VALUE - LR * grads["value"]] * 2,
                               rtol=1e-6)
    np.testing.assert_allclose(new_state.params["logits"],
                               [np.asarray(LOGITS) - LR * grads["logits"]] * 2, rtol=1e-6)


def test_actor_step_samples_or_takes_the_argmax():
    logits = jnp.asarray([[0.0, 5.0, 1.0]] * 4)
    timestep = TimeStep(step_type=jnp.zeros((4,), jnp.int32), reward=None, discount=None,
                        observation=jnp.zeros((4, 3)))
    params = {"logits": logits[0], "value": jnp.zeros(())}
    action, state, extras = learning.actor_step(Table(), params, (), timestep,
                                                jax.random.PRNGKey(0), evaluation=True)
    np.testing.assert_array_equal(action, [1, 1, 1, 1])
    assert action.dtype == jnp.int32 and state == ()
    np.testing.assert_array_equal(extras["logits"], logits)
    keys = jax.random.split(jax.random.PRNGKey(1), 2000)
    sampled = jax.vmap(lambda k: learning.actor_step(Table(), params, (), timestep, k)[0])(keys)
    frequency = np.bincount(np.asarray(sampled).reshape(-1), minlength=3) / sampled.size
    np.testing.assert_allclose(frequency, np.asarray(jax.nn.softmax(logits[0])), atol=0.02)
