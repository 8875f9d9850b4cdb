"""PPO's PopArt value normalisation (issue 27, `agents/popart.py`): one learner step of a
"table" network (logits and a value that ignore the observation) against the statistics, the
preserved outputs and the value loss derived by hand; the update's invariance to the rewards'
scale, which plain PPO lacks; the same step with the batch split over two devices; and the
config's validation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agents import ppo
from agents.actor_critic import LearnerState
from agents.popart import PopArtLearnerState, PopArtStats
from agents.ppo import learning
from podracer.config import ConfigError
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec, StepType, TimeStep, Trajectory

GAMMA, LAMBDA = 0.9, 0.8
HPARAMS = {"discount": GAMMA, "gae_lambda": LAMBDA, "clip_eps": 0.2, "value_clip_eps": 0.2,
           "value_cost": 0.5, "entropy_cost": 0.01, "clip_rho_threshold": 1.0}
LOGITS = np.array([np.log(3.0), 0.0])
KERNEL, BIAS = 0.2, 0.3  # n(x) = KERNEL * 1 + BIAS = 0.5 for every x
ACTIONS = np.array([[0, 1], [1, 1], [0, 0]], np.int32)  # [T=3, B=2]
REWARDS = np.array([[1.0, -0.5], [0.0, 2.0], [-3.0, 0.5]])  # r_1 .. r_3 of each sequence


class Table:
    """The same logits [A] for every observation [B, ...], and the normalised value
    n(x) = kernel . 1 + bias from a layer named "value", the layer PopArt rescales."""

    def apply(self, params, observation):
        b = observation.shape[0]
        p = params["params"]
        value = (jnp.ones((b, 1)) @ p["value"]["kernel"] + p["value"]["bias"])[:, 0]
        return jnp.broadcast_to(p["logits"], (b,) + p["logits"].shape), value


def _learn(popart=True, step_size=0.25, normalization="batch", average_first=False):
    return learning.LearnConfig(num_epochs=1, num_minibatches=1, off_policy="plain",
                                advantage_normalization=normalization, unroll_updates=False,
                                continuous=False, observation_rank=1, popart=popart,
                                popart_step_size=step_size, popart_average_first=average_first)


def _state(optimizer, stats=None):
    params = {"params": {"logits": jnp.asarray(LOGITS, jnp.float32),
                         "value": {"kernel": jnp.full((1, 1), KERNEL, jnp.float32),
                                   "bias": jnp.full((1,), BIAS, jnp.float32)}}}
    state = LearnerState(params=params, opt_state=optimizer.init(params),
                         updates=jnp.zeros((), jnp.int32),
                         hparams={k: jnp.asarray(v, jnp.float32) for k, v in HPARAMS.items()})
    if stats is None:
        return state
    return PopArtLearnerState(**dict(state.items()), popart=stats)


def _stats(mean, second_moment):
    return PopArtStats(mean=jnp.asarray(mean, jnp.float32),
                       second_moment=jnp.asarray(second_moment, jnp.float32))


def _trajectory(rewards=REWARDS):
    """x_0 .. x_3 in each sequence, acted on by the table's policy; the actor's value is the
    network's normalised output n(x) = 0.5."""
    t, b = ACTIONS.shape
    log_pi = LOGITS - np.log(np.sum(np.exp(LOGITS)))
    return Trajectory(
        timestep=TimeStep(
            step_type=jnp.asarray([[StepType.FIRST] * b] + [[StepType.MID] * b] * t),
            reward=jnp.asarray(np.concatenate([np.zeros((1, b)), rewards]), jnp.float32),
            discount=jnp.ones((t + 1, b), jnp.float32),
            observation=jnp.zeros((t + 1, b, 3), jnp.float32)),
        action=jnp.asarray(ACTIONS),
        extras={"log_prob": jnp.asarray(log_pi[ACTIONS], jnp.float32),
                "value": jnp.full((t, b), KERNEL + BIAS, jnp.float32)})


def _gae_by_hand(value, rewards=REWARDS):
    """GAE(lambda) with the same value V everywhere: delta_t = r_{t+1} + gamma V - V and
    A_t = delta_t + gamma lambda A_{t+1}, A_T = 0; in float64."""
    delta = rewards + GAMMA * value - value
    adv = np.zeros_like(delta)
    acc = np.zeros(delta.shape[1])
    for t in reversed(range(delta.shape[0])):
        acc = delta[t] + GAMMA * LAMBDA * acc
        adv[t] = acc
    return adv


def _step(learn, state, trajectory, optimizer):
    return jax.jit(lambda s, tr: learning.learner_step(
        Table(), optimizer, learn, s, tr, jax.random.PRNGKey(0), axis_name=None))(
            state, trajectory)


def test_statistics_preserved_outputs_and_value_loss_by_hand():
    # sigma = sqrt(13 - 2^2) = 3: the unnormalised value is 3 * 0.5 + 2 = 3.5 everywhere.
    state = _state(optax.sgd(0.0), _stats(2.0, 13.0))
    new_state, metrics = _step(_learn(), state, _trajectory(), optax.sgd(0.0))
    returns = _gae_by_hand(3.5) + 3.5
    mu = 0.75 * 2.0 + 0.25 * returns.mean()
    nu = 0.75 * 13.0 + 0.25 * np.square(returns).mean()
    sigma = np.sqrt(nu - mu ** 2)
    np.testing.assert_allclose(new_state.popart.mean, mu, rtol=1e-5)
    np.testing.assert_allclose(new_state.popart.second_moment, nu, rtol=1e-5)
    np.testing.assert_allclose(metrics["popart_scale"], sigma, rtol=1e-5)
    # A zero step size leaves only POP's change: sigma' n'(x) + mu' is still 3.5.
    _, after = Table().apply(new_state.params, jnp.zeros((1, 3)))
    np.testing.assert_allclose(sigma * float(after[0]) + mu, 3.5, rtol=1e-5)
    # The value loss compares n'(x) with the targets normalised by the new statistics.
    np.testing.assert_allclose(metrics["value_loss"],
                               0.5 * np.mean(np.square(3.5 - returns)) / sigma ** 2, rtol=1e-5)


# The statistics' step at the update after `updates` earlier ones: beta = 0.25 without the
# option; max(beta, 1 / (updates + 1)) with it (1 at the first update: the batch's moments).
@pytest.mark.parametrize("average_first, updates, step", [(False, 0, 0.25), (True, 0, 1.0),
                                                          (True, 2, 1 / 3), (True, 9, 0.25)])
def test_average_first_steps_the_statistics_by_one_over_the_updates_made(average_first,
                                                                         updates, step):
    state = _state(optax.sgd(0.0), _stats(2.0, 13.0))
    state = state.replace(updates=jnp.asarray(updates, jnp.int32))
    new_state, _ = _step(_learn(average_first=average_first), state, _trajectory(),
                         optax.sgd(0.0))
    returns = _gae_by_hand(3.5) + 3.5
    np.testing.assert_allclose(new_state.popart.mean,
                               (1 - step) * 2.0 + step * returns.mean(), rtol=1e-5)
    np.testing.assert_allclose(new_state.popart.second_moment,
                               (1 - step) * 13.0 + step * np.square(returns).mean(), rtol=1e-5)
    assert int(new_state.updates) == updates + 1


def test_unnormalised_advantages_are_divided_by_the_statistics_scale():
    # advantage_normalization="none": GAE on sigma n(x) + mu = 3.5, divided by the sigma the
    # values were computed with (3, before the statistics move), as V-trace's policy gradient.
    state = _state(optax.sgd(0.0), _stats(2.0, 13.0))
    batch, _ = learning.targets(Table(), _learn(normalization="none"), state.params,
                                _trajectory(), HPARAMS, axis_name=None,
                                popart_stats=state.popart)
    np.testing.assert_allclose(batch["advantage"], _gae_by_hand(3.5) / 3.0, rtol=1e-5)
    plain = _state(optax.sgd(0.0))
    batch, _ = learning.targets(Table(), _learn(popart=False, normalization="none"),
                                plain.params, _trajectory(), HPARAMS, axis_name=None)
    np.testing.assert_allclose(batch["advantage"], _gae_by_hand(KERNEL + BIAS), rtol=1e-5)


@pytest.mark.parametrize("normalization", ["batch", "none"])
def test_the_update_does_not_depend_on_the_rewards_scale_with_popart_only(normalization):
    # Rewards x 10 with statistics x 10 (mu, and nu x 100): the same normalised advantages,
    # targets and value-clipping range, so the same parameters; without PopArt the value's
    # gradient grows with the rewards and the update differs.
    optimizer = optax.sgd(0.1)
    learn = _learn(normalization=normalization)
    small = _step(learn, _state(optimizer, _stats(1.0, 5.0)), _trajectory(), optimizer)[0]
    large = _step(learn, _state(optimizer, _stats(10.0, 500.0)),
                  _trajectory(REWARDS * 10.0), optimizer)[0]
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6),
                 small.params, large.params)
    np.testing.assert_allclose(large.popart.mean, 10.0 * small.popart.mean, rtol=1e-5)
    np.testing.assert_allclose(large.popart.second_moment, 100.0 * small.popart.second_moment,
                               rtol=1e-5)
    plain_small = _step(_learn(popart=False), _state(optimizer), _trajectory(), optimizer)[0]
    plain_large = _step(_learn(popart=False), _state(optimizer), _trajectory(REWARDS * 10.0),
                        optimizer)[0]
    assert abs(float(plain_small.params["params"]["value"]["bias"][0])
               - float(plain_large.params["params"]["value"]["bias"][0])) > 0.01


def test_two_devices_step_as_one_on_the_whole_batch():
    # PopArt's moments are the global batch's: each device holds one sequence.
    optimizer = optax.sgd(0.1)
    state = _state(optimizer, _stats(1.0, 5.0))
    whole, _ = _step(_learn(), state, _trajectory(), optimizer)
    halves = jax.tree.map(lambda x: jnp.stack(jnp.split(x, 2, axis=1)), _trajectory())
    split, _ = jax.pmap(lambda s, tr: learning.learner_step(
        Table(), optimizer, _learn(), s, tr, jax.random.PRNGKey(0), axis_name="d"),
        axis_name="d", in_axes=(None, 0), devices=jax.devices()[:2])(state, halves)
    for device in range(2):
        jax.tree.map(lambda a, b, i=device: np.testing.assert_allclose(a[i], b, rtol=1e-5,
                                                                        atol=1e-6),
                     split, whole)


def test_the_default_agent_keeps_the_statistics_in_its_learner_state():
    spec = EnvSpec(observation=ArraySpec((4,), jnp.float32), action=DiscreteSpec(2))
    state = ppo.make_agent(ppo.default_config(), spec).init(jax.random.PRNGKey(0))
    assert isinstance(state, PopArtLearnerState)
    config = ppo.default_config()
    config.popart = False
    assert not isinstance(ppo.make_agent(config, spec).init(jax.random.PRNGKey(0)),
                          PopArtLearnerState)


@pytest.mark.parametrize("field,value", [("popart_step_size", 0.0), ("popart_step_size", 1.5),
                                         ("popart_average_first", None)])
def test_bad_popart_fields_name_the_field(field, value):
    config = ppo.default_config()
    config[field] = value
    spec = EnvSpec(observation=ArraySpec((4,), jnp.float32), action=DiscreteSpec(2))
    with pytest.raises(ConfigError, match=f"agent.{field}"):
        ppo.make_agent(config, spec)
