"""PPO under Anakin: learns CartPole to >= 475 and improves on Pendulum (Gaussian policy), the
ratio is 1 at the first minibatch (on-policy by construction), advantage statistics of one
learner step are those of the global batch on 1 and 8 devices, hyperparameters sweep in one
program, and bad configs fail naming the field."""

import functools

import jax
import numpy as np
import pytest

import agents
import anakin
from agents import ppo, vtrace
from experiments.configs import ppo_cartpole, ppo_pendulum
from podracer import replication
from podracer.config import ConfigError
from podracer.types import DEVICE_AXIS, ArraySpec, DiscreteSpec, EnvSpec, TimeStep, Trajectory

# The learning runs are the module's longest programs: compiled as a researcher's run is.
pytestmark = pytest.mark.optimised


@pytest.fixture(scope="module")
def cartpole_run():
    config = ppo_cartpole.get_config()  # PureJaxRL's settings: 4 envs, T=128, 976 updates
    config.num_devices = 1
    return anakin.train(config)


def test_learns_cartpole_to_475(cartpole_run):
    history = cartpole_run.history
    assert history[-1]["env_steps"] == 499_712
    # The last chunk (the last 122 updates' episodes) averages at least 475 of 500.
    assert history[-1]["episode_return"] >= 475, [h["episode_return"] for h in history]
    assert history[0]["episode_return"] < 200  # it learnt, rather than started good


def test_anakin_is_on_policy_at_the_first_minibatch(cartpole_run):
    # The actor's log-probabilities came from the very parameters the learner starts from:
    # the ratio of the first epoch's first minibatch is 1 (here to float rounding at most).
    for record in cartpole_run.history:
        assert record["first_ratio_deviation"] <= 1e-5, record
    # ... and the later minibatches did move the policy.
    assert all(record["approx_kl"] > 0 for record in cartpole_run.history)


def test_gaussian_policy_improves_on_pendulum():
    config = ppo_pendulum.get_config()
    config.num_devices = 1
    config.updates_per_chunk = 5
    config.total_env_steps = 9 * 5 * 16 * 128  # 92,160 steps
    config.eval_every_updates = 0
    result = anakin.train(config)
    returns = [h["episode_return"] for h in result.history]
    # Random torques score about -1200 per 200-step episode; a swing-up policy above -600.
    assert returns[0] < -900, returns
    assert returns[-1] > -600, returns


# ---------------------------------------------------------------------------------------------
# One learner step on 1 and 8 devices.


def _trajectory(t=8, b=16, seed=0):
    rng = np.random.default_rng(seed)
    step_type = rng.choice([0, 1, 1, 1, 2], size=(t + 1, b)).astype(np.int32)
    last = step_type == 2
    discount = np.where(last & (rng.uniform(size=(t + 1, b)) < 0.5), 0.0, 1.0)
    timestep = TimeStep(step_type=step_type, reward=rng.normal(size=(t + 1, b)).astype(np.float32),
                        discount=discount.astype(np.float32),
                        observation=rng.normal(size=(t + 1, b, 4)).astype(np.float32))
    return Trajectory(timestep=timestep, action=rng.integers(0, 2, (t, b)).astype(np.int32),
                      extras={"log_prob": np.log(rng.uniform(0.2, 0.8, (t, b))).astype(np.float32),
                              "value": rng.normal(size=(t, b)).astype(np.float32)})


SPEC = EnvSpec(observation=ArraySpec((4,), np.float32), action=DiscreteSpec(2))


@pytest.mark.parametrize("off_policy", ["plain", "corrected"])
def test_learner_step_normalises_over_the_global_batch(off_policy):
    config = ppo.default_config()
    config.off_policy = off_policy
    config.num_minibatches = 2
    config.advantage_normalization = "batch"
    agent = agents.make(config, SPEC)
    state = agent.init(jax.random.PRNGKey(0))
    trajectory = _trajectory()
    _, alone = jax.jit(lambda s, tr, k: agent.learner_step(s, tr, k, axis_name=None))(
        state, trajectory, jax.random.PRNGKey(1))

    mesh = replication.make_mesh(jax.devices()[:8])
    split = jax.tree.map(lambda x: np.stack(np.split(np.asarray(x), 8, axis=1)), trajectory)
    step = replication.replicate(
        lambda s, tr, k: agent.learner_step(s, tr, k, axis_name=DEVICE_AXIS), mesh)
    _, eight = step(replication.broadcast(state, mesh), replication.from_global(split, mesh),
                    replication.from_global(jax.random.split(jax.random.PRNGKey(1), 8), mesh))
    for name in ("advantage_mean", "advantage_std"):
        per_device = np.asarray(eight[name])
        np.testing.assert_allclose(per_device, np.full(8, float(alone[name])), rtol=1e-5,
                                   err_msg=name)
    assert float(alone["advantage_std"]) > 0.1


def _acted_by(agent, params, trajectory):
    """`trajectory` with the actions, log-probabilities and values of `agent` acting with
    `params` at its observations."""
    obs = trajectory.timestep.observation[:-1]
    t, b = obs.shape[:2]
    flat = TimeStep(step_type=None, reward=None, discount=None,
                    observation=obs.reshape((t * b,) + obs.shape[2:]))
    action, _, extras = agent.actor_step(params, (), flat, jax.random.PRNGKey(2))
    return trajectory.replace(action=action.reshape(t, b),
                              extras=jax.tree.map(lambda x: x.reshape(t, b), extras))


@pytest.mark.parametrize("off_policy", ["plain", "corrected"])
def test_ratio_is_one_at_the_first_minibatch_on_the_actors_own_data(off_policy):
    """Data acted with the parameters the learner starts from: ratio 1 at the first minibatch
    of the first epoch in both modes. Stale log-probabilities show in the plain mode's ratio;
    the corrected mode recomputes pi_0 and moves the staleness into its weights."""
    config = ppo.default_config()
    config.off_policy = off_policy
    agent = agents.make(config, SPEC)
    state = agent.init(jax.random.PRNGKey(0))
    own = _acted_by(agent, state.params, _trajectory())
    learner_step = jax.jit(lambda s, tr, k: agent.learner_step(s, tr, k, axis_name=None))
    _, metrics = learner_step(state, own, jax.random.PRNGKey(3))
    assert float(metrics["first_ratio_deviation"]) <= 1e-5
    np.testing.assert_allclose(float(metrics["importance_weight"]), 1.0, rtol=1e-5)

    stale = own.replace(extras={**own.extras, "log_prob": own.extras["log_prob"] - 0.1})
    _, metrics = learner_step(state, stale, jax.random.PRNGKey(3))
    if off_policy == "plain":  # r = pi_0 / mu = e^0.1 everywhere
        np.testing.assert_allclose(float(metrics["first_ratio_deviation"]), np.exp(0.1) - 1,
                                   rtol=1e-4)
    else:  # weights min(1, pi_0 / mu) = min(1, e^0.1) = 1; the ratio starts at 1
        assert float(metrics["first_ratio_deviation"]) <= 1e-5
        np.testing.assert_allclose(float(metrics["importance_weight"]), 1.0, rtol=1e-5)
        lower = own.replace(extras={**own.extras, "log_prob": own.extras["log_prob"] + 0.1})
        _, metrics = learner_step(state, lower, jax.random.PRNGKey(3))
        # real transitions only: weights e^-0.1
        np.testing.assert_allclose(float(metrics["importance_weight"]), np.exp(-0.1),
                                   rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# Sweeps and configs.


def test_the_flat_optimizer_makes_the_per_array_update():
    # optax's clipping and Adam applied array by array are the reference: stepping all the
    # parameters as one vector must give the same learner step, to float rounding (the global
    # norm sums the squares in another order). A large step size makes the clipping bind.
    trajectory = _trajectory()
    params = {}
    for flat in (True, False):
        config = ppo.default_config()
        config.flat_optimizer = flat
        config.learning_rate = 1e-2
        agent = agents.make(config, SPEC)
        state = agent.init(jax.random.PRNGKey(0))
        step = jax.jit(functools.partial(agent.learner_step, axis_name=None))
        new, metrics = step(state, trajectory, jax.random.PRNGKey(1))
        assert float(metrics["grad_norm"]) > config.max_grad_norm  # clipped
        params[flat] = new.params
        moved = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), new.params, state.params)
        assert min(jax.tree.leaves(moved)) > 0, moved
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 params[True], params[False])


def test_learning_rate_is_swept_in_one_program():
    config = ppo_cartpole.get_config()
    config.num_devices = 1
    config.updates_per_chunk = 4
    config.total_env_steps = 2 * 4 * 4 * 128
    config.sweep.agent.learning_rate = (2.5e-4, 0.0 + 1e-9)
    result = anakin.train(config)
    first, second = result.run_histories
    # A (near) zero step size leaves the policy where it started: its ratio never moves.
    assert first[-1]["approx_kl"] > 10 * second[-1]["approx_kl"]


@pytest.mark.parametrize("overrides, field", [
    ({"agent.num_minibatches": 3}, "agent.num_minibatches"),  # 3 does not divide 4 x 128
    ({"agent.off_policy": "vtrace"}, "agent.off_policy"),
    ({"agent.activation": "gelu"}, "agent.activation"),
    ({"agent.flat_optimizer": None}, "agent.flat_optimizer"),
])
def test_bad_ppo_config_fails_naming_the_field(overrides, field):
    config = ppo_cartpole.get_config()
    config.num_devices = 1
    for key, value in overrides.items():
        section, leaf = key.split(".")
        config[section][leaf] = value
    with pytest.raises(ConfigError, match=f"config.{field}") as info:
        anakin.train(config)
    assert "Fix:" in str(info.value)


def test_continuous_actions_refused_for_an_agent_without_them():
    config = ppo_pendulum.get_config()
    config.num_devices = 1
    config.agent = vtrace.default_config()
    with pytest.raises(ConfigError, match="config.env.name.*continuous actions.*ppo"):
        anakin.validate(config, 1)
