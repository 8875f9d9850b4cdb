"""`agents.ppo.learning` alone: GAE targets and one PPO iteration of a two-parameter "table"
network (logits and a value that ignore the observation) with plain SGD, one epoch of one
minibatch, against the values and the update derived by hand; and the same iteration with the
batch split over two devices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agents.actor_critic import LearnerState
from agents.ppo import learning
from podracer.types import StepType, TimeStep, Trajectory

GAMMA, LAMBDA, VALUE_COST, ENTROPY_COST, LR = 0.9, 0.8, 0.5, 0.01, 0.1
HPARAMS = {"discount": GAMMA, "gae_lambda": LAMBDA, "clip_eps": 0.2, "value_clip_eps": 0.2,
           "value_cost": VALUE_COST, "entropy_cost": ENTROPY_COST, "clip_rho_threshold": 1.0}
LOGITS, VALUE = np.array([np.log(3.0), 0.0]), 0.5
ACTIONS = np.array([[0, 1], [1, 1]], np.int32)  # [T=2, B=2]
REWARDS = np.array([[1.0, -0.5], [0.0, 2.0]])  # r_1, r_2 of each sequence


def _learn(normalize=True):
    return learning.LearnConfig(num_epochs=1, num_minibatches=1, off_policy="plain",
                                advantage_normalization="batch" if normalize else "none",
                                unroll_updates=False,
                                continuous=False, observation_rank=1)


class Table:
    """The same logits [A] and value for every observation [B, ...]."""

    def apply(self, params, observation):
        b = observation.shape[0]
        return (jnp.broadcast_to(params["logits"], (b,) + params["logits"].shape),
                jnp.broadcast_to(params["value"], (b,)))


def _state():
    params = {"logits": jnp.asarray(LOGITS, jnp.float32), "value": jnp.asarray(VALUE, jnp.float32)}
    return LearnerState(params=params, opt_state=optax.sgd(LR).init(params),
                        updates=jnp.zeros((), jnp.int32),
                        hparams={k: jnp.asarray(v, jnp.float32) for k, v in HPARAMS.items()})


def _trajectory(actions=ACTIONS, rewards=REWARDS):
    """x_0 -> x_1 -> x_2 in each sequence, acted on by the table's policy (on-policy)."""
    t, b = actions.shape
    log_pi = LOGITS - np.log(np.sum(np.exp(LOGITS)))
    return Trajectory(
        timestep=TimeStep(
            step_type=jnp.asarray([[StepType.FIRST] * b] + [[StepType.MID] * b] * t),
            reward=jnp.asarray(np.concatenate([np.zeros((1, b)), rewards]), jnp.float32),
            discount=jnp.ones((t + 1, b), jnp.float32),
            observation=jnp.zeros((t + 1, b, 3), jnp.float32)),
        action=jnp.asarray(actions),
        extras={"log_prob": jnp.asarray(log_pi[actions], jnp.float32),
                "value": jnp.full((t, b), VALUE, jnp.float32)})


def _advantages():
    """GAE(lambda) with V = VALUE everywhere: delta_t = r_{t+1} + gamma V - V, A_1 = delta_1,
    A_0 = delta_0 + gamma lambda A_1."""
    delta = REWARDS + GAMMA * VALUE - VALUE
    return np.stack([delta[0] + GAMMA * LAMBDA * delta[1], delta[1]])


def _update_by_hand():
    """One minibatch of all N = 4 samples at theta_0: the ratio is 1 (no clipping, and the
    value is at its old value, so both value losses agree), so per sample i, with the
    normalised advantages A'_i and the returns R_i = A_i + V:
        loss = -mean A'_i + c_v mean (V - R_i)^2 / 2 - c_e H
        d/dlogits = -mean A'_i (onehot_{a_i} - pi) + c_e pi (log pi + H)
        d/dV = c_v mean (V - R_i)"""
    a = _advantages().reshape(-1)
    normalised = (a - a.mean()) / (a.std() + 1e-8)
    returns = a + VALUE
    pi = np.exp(LOGITS) / np.sum(np.exp(LOGITS))
    log_pi, entropy = np.log(pi), -np.sum(pi * np.log(pi))
    onehot = np.eye(2)[ACTIONS.reshape(-1)]
    grads = {"logits": -np.mean(normalised[:, None] * (onehot - pi), axis=0)
             + ENTROPY_COST * pi * (log_pi + entropy),
             "value": VALUE_COST * np.mean(VALUE - returns)}
    metrics = {"loss": -normalised.mean() + VALUE_COST * 0.5 * np.mean((VALUE - returns) ** 2)
               - ENTROPY_COST * entropy,
               "policy_loss": -normalised.mean(),
               "value_loss": 0.5 * np.mean((VALUE - returns) ** 2),
               "entropy": entropy, "clip_fraction": 0.0, "first_ratio_deviation": 0.0,
               "advantage_mean": a.mean(), "advantage_std": a.std(), "importance_weight": 1.0,
               "grad_norm": np.sqrt(np.sum(grads["logits"] ** 2) + grads["value"] ** 2)}
    return grads, metrics


def test_targets_alone_are_gae_by_hand():
    batch, metrics = learning.targets(Table(), _learn(normalize=False), _state().params,
                                      _trajectory(), HPARAMS, axis_name=None)
    np.testing.assert_allclose(batch["advantage"], _advantages(), rtol=1e-6)
    np.testing.assert_allclose(batch["return"], _advantages() + VALUE, rtol=1e-6)
    np.testing.assert_allclose(batch["old_value"], np.full((2, 2), VALUE))
    assert "weight" not in batch  # on-policy ("plain"): every weight is 1, none is carried
    np.testing.assert_allclose(metrics["importance_weight"], 1.0)
    np.testing.assert_allclose(metrics["advantage_mean"], _advantages().mean(), rtol=1e-6)


def test_learner_step_alone_is_the_hand_derived_ppo_update():
    grads, expected = _update_by_hand()
    new_state, metrics = jax.jit(lambda s, tr, k: learning.learner_step(
        Table(), optax.sgd(LR), _learn(), s, tr, k, axis_name=None))(
            _state(), _trajectory(), jax.random.PRNGKey(0))
    for name, value in expected.items():
        np.testing.assert_allclose(metrics[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(new_state.params["logits"], LOGITS - LR * grads["logits"],
                               rtol=1e-5)
    np.testing.assert_allclose(new_state.params["value"], VALUE - LR * grads["value"], rtol=1e-5)
    assert int(new_state.updates) == 1


def test_learner_step_on_two_devices_is_the_step_on_the_whole_batch():
    # Each device holds one of the two sequences; advantages are normalised over both and
    # the gradients averaged, so the update is the one derived for the whole batch.
    grads, expected = _update_by_hand()
    split = jax.tree.map(lambda x: jnp.stack(jnp.split(x, 2, axis=1)), _trajectory())
    new_state, metrics = jax.pmap(
        lambda s, tr, k: learning.learner_step(Table(), optax.sgd(LR), _learn(), s, tr, k,
                                               axis_name="devices"),
        axis_name="devices", in_axes=(None, 0, 0), devices=jax.devices()[:2])(
            _state(), split, jax.random.split(jax.random.PRNGKey(0), 2))
    for name in ("loss", "advantage_mean", "advantage_std", "grad_norm"):
        np.testing.assert_allclose(metrics[name], [expected[name]] * 2, rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(new_state.params["logits"],
                               [LOGITS - LR * grads["logits"]] * 2, rtol=1e-5)
    np.testing.assert_allclose(new_state.params["value"], [VALUE - LR * grads["value"]] * 2,
                               rtol=1e-5)


class GaussianTable:
    """A Gaussian policy with the same mean and log standard deviation [D] for every
    observation, and value 0."""

    def apply(self, params, observation):
        b = observation.shape[0]
        mean = jnp.broadcast_to(params["mean"], (b,) + params["mean"].shape)
        log_std = jnp.broadcast_to(params["log_std"], mean.shape)
        return (mean, log_std), jnp.zeros((b,))


@pytest.mark.parametrize("continuous", [False, True])
def test_each_policy_kind_takes_its_own_entropy_cost(continuous):
    # The loss's entropy term is -cost * H: a categorical policy's cost is entropy_cost, a
    # Gaussian's gaussian_entropy_cost. H by hand: categorical [3, 1]/4; a Gaussian with
    # log sigma = (0.3, -0.5) has H = sum(0.5 log(2 pi e) + log sigma).
    if continuous:
        network, params = GaussianTable(), {"mean": jnp.zeros(2),
                                            "log_std": jnp.asarray([0.3, -0.5])}
        action = jnp.zeros((4, 2))
        entropy = 2 * 0.5 * np.log(2 * np.pi * np.e) + 0.3 - 0.5
    else:
        network, params = Table(), {"logits": jnp.asarray(LOGITS, jnp.float32),
                                    "value": jnp.asarray(VALUE, jnp.float32)}
        action = jnp.zeros((4,), jnp.int32)
        p = np.array([0.75, 0.25])
        entropy = -np.sum(p * np.log(p))
    learn = learning.LearnConfig(num_epochs=1, num_minibatches=1, off_policy="plain",
                                 advantage_normalization="none", unroll_updates=False,
                                 continuous=continuous, observation_rank=1)
    mb = {"observation": jnp.zeros((4, 3)), "action": action,
          "old_log_prob": jnp.zeros((4,)), "old_value": jnp.zeros((4,)),
          "advantage": jnp.zeros((4,)), "return": jnp.zeros((4,)),
          "weight": jnp.ones((4,)), "mask": jnp.ones((4,))}

    def loss(entropy_cost, gaussian_entropy_cost):
        hparams = {**HPARAMS, "entropy_cost": entropy_cost,
                   "gaussian_entropy_cost": gaussian_entropy_cost}
        return float(learning.minibatch_loss(network, learn, params, mb, hparams)[0])

    base = loss(0.0, 0.0)
    own, other = (loss(0.0, 0.2), loss(0.2, 0.0)) if continuous else (loss(0.2, 0.0),
                                                                        loss(0.0, 0.2))
    np.testing.assert_allclose(own - base, -0.2 * entropy, rtol=1e-5)
    np.testing.assert_allclose(other, base, rtol=1e-6)
