"""V-trace's remedies for its unnormalised policy gradient (issue 27): advantage normalisation
over the global batch, PopArt value normalisation and reward scaling, against expectations
derived by hand in numpy; and their config validation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agents import popart
from agents.actor_critic import LearnerState
from agents.popart import PopArtLearnerState, PopArtStats
from agents.vtrace import default_config, learning, make_agent, make_network, vtrace_loss
from podracer.config import ConfigError
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec, StepType, TimeStep, Trajectory

GAMMA = 0.9
T, A = 4, 3


def _sequences(b, seed=0):
    """[T, b] on-policy inputs of `vtrace_loss` (behaviour = target logits, so rho = 1), with
    a masked transition and a true terminal in the first sequence."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(T, b, A)).astype(np.float32)
    mask = np.ones((T, b), np.float32)
    mask[1, 0] = 0.0
    discounts = np.ones((T, b), np.float32)
    discounts[2, 0] = 0.0
    return {"logits_t": logits,
            "values": rng.normal(size=(T + 1, b)).astype(np.float32) * 3,
            "actions": rng.integers(0, A, (T, b)).astype(np.int32),
            "behaviour_logits_t": logits,
            "rewards": rng.normal(size=(T, b)).astype(np.float32) * 5,
            "discounts": discounts, "mask": mask}


def _advantages_by_hand(inp):
    """On-policy V-trace (rho = c = 1, lambda = 1) per sequence in float64: the targets
    v_s = V(x_s) + sum_t gamma^(t-s) (prod discounts) delta_t, a masked transition cutting the
    traces with delta = 0; the pg advantage r_t + gamma_t v_{t+1} - V(x_t)."""
    v = inp["values"].astype(np.float64)
    r, d, m = (inp[k].astype(np.float64) for k in ("rewards", "discounts", "mask"))
    gamma_t = np.where(m > 0, d * GAMMA, 0.0)
    r = np.where(m > 0, r, v[:-1])
    delta = r + gamma_t * v[1:] - v[:-1]
    targets = np.zeros_like(v)
    targets[-1] = v[-1]
    acc = np.zeros(v.shape[1])
    for t in reversed(range(T)):
        acc = delta[t] + gamma_t[t] * acc
        targets[t] = v[t] + acc
    return r + gamma_t * targets[1:] - v[:-1], targets[:-1]


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _policy_losses_by_hand(inp, advantages):
    log_pi = _log_softmax(inp["logits_t"].astype(np.float64))
    log_pi_a = np.take_along_axis(log_pi, inp["actions"][..., None], -1)[..., 0]
    m = inp["mask"]
    return -np.sum(log_pi_a * advantages * m, 0) / np.maximum(m.sum(0), 1.0)


def test_advantages_are_normalised_over_the_global_batch_of_two_devices():
    inp = _sequences(4)
    raw, _ = _advantages_by_hand(inp)
    real = inp["mask"] > 0
    mean, std = raw[real].mean(), raw[real].std()  # all 4 sequences: both devices' batches
    expected = _policy_losses_by_hand(inp, (raw - mean) / std)

    loss = functools.partial(vtrace_loss, discount=GAMMA, normalize=True,
                             stats_axis_name=("sequences", "devices"))
    per_device = jax.tree.map(lambda x: np.stack([x[:, :2], x[:, 2:]]), inp)
    out = jax.pmap(jax.vmap(lambda *xs: loss(*xs), in_axes=1, axis_name="sequences"),
                   axis_name="devices", devices=jax.devices()[:2])(
        *(per_device[k] for k in ("logits_t", "values", "actions", "behaviour_logits_t",
                                  "rewards", "discounts", "mask")))
    np.testing.assert_allclose(np.asarray(out.policy_loss).reshape(-1), expected, rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.advantage_mean), mean, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(out.advantage_std), std, rtol=1e-4)
    # Each device's own statistics would give other losses: the pooling is what is tested.
    local = np.concatenate([
        (raw[:, s] - raw[:, s][real[:, s]].mean()) / raw[:, s][real[:, s]].std()
        for s in (slice(0, 2), slice(2, 4))], axis=1)
    assert not np.allclose(_policy_losses_by_hand(inp, local), expected, rtol=1e-2)


def _trajectory_and_state(b, seed=0):
    spec = EnvSpec(observation=ArraySpec((3,), np.float32), action=DiscreteSpec(A))
    config = default_config()
    network = make_network(config, spec)
    rng = np.random.default_rng(seed)
    step_type = np.full((T + 1, b), StepType.MID, np.int32)
    step_type[1, 0], step_type[2, 0] = StepType.LAST, StepType.FIRST  # a masked transition
    params = network.init(jax.random.PRNGKey(seed), jnp.zeros((1, 3)))
    obs = rng.normal(size=(T + 1, b, 3)).astype(np.float32)
    behaviour, _ = network.apply(params, obs[:-1].reshape(-1, 3))
    trajectory = Trajectory(
        timestep=TimeStep(step_type=jnp.asarray(step_type),
                          reward=jnp.asarray(rng.normal(size=(T + 1, b)) * 10, jnp.float32),
                          discount=jnp.ones((T + 1, b), jnp.float32),
                          observation=jnp.asarray(obs)),
        action=jnp.asarray(rng.integers(0, A, (T, b)), jnp.int32),
        extras={"logits": behaviour.reshape(T, b, A)})
    hparams = {"discount": GAMMA, "lambda_": 1.0, "clip_rho_threshold": 1.0,
               "clip_pg_rho_threshold": 1.0, "baseline_cost": 0.5, "entropy_cost": 0.01,
               "reward_scale": 1.0}
    state = LearnerState(params=params, opt_state=optax.sgd(0.1).init(params),
                         updates=jnp.zeros((), jnp.int32),
                         hparams={k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()})
    return network, trajectory, state


def _assert_device_equals(device, replicated, expected):
    np.testing.assert_allclose(replicated[device], expected, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("popart", [False, True])
def test_learner_step_on_two_devices_equals_one_step_on_the_whole_batch(popart):
    # The batch statistics (advantage normalisation, PopArt's target moments) are the global
    # batch's: 2 devices x 2 sequences step exactly as 1 device with all 4 sequences.
    network, trajectory, state = _trajectory_and_state(4)
    learn = learning.LearnConfig(advantage_normalization="batch", popart=popart,
                                 popart_step_size=0.1)
    if popart:
        state = PopArtLearnerState(**dict(state.items()), popart=PopArtStats(
            mean=jnp.asarray(1.0), second_moment=jnp.asarray(5.0)))
    step = functools.partial(learning.learner_step, network, optax.sgd(0.1), learn=learn)
    whole, whole_metrics = jax.jit(lambda s, tr: step(s, tr, None, axis_name=None))(
        state, trajectory)
    halves = jax.tree.map(lambda x: jnp.stack([x[:, :2], x[:, 2:]]), trajectory)
    split, split_metrics = jax.pmap(lambda s, tr: step(s, tr, None, axis_name="devices"),
                                    axis_name="devices", in_axes=(None, 0),
                                    devices=jax.devices()[:2])(state, halves)
    for device in range(2):
        jax.tree.map(functools.partial(_assert_device_equals, device), split, whole)
    for name in ("policy_loss", "advantage_mean", "advantage_std"):
        np.testing.assert_allclose(split_metrics[name][0], whole_metrics[name], rtol=2e-5)


# (popart_average_first, learner updates made before this one, the step size by hand): beta,
# or max(beta, 1 / (updates + 1)) with the option, at beta = 0.25.
@pytest.mark.parametrize("average_first, updates, step", [(False, 0, 0.25), (True, 0, 1.0),
                                                          (True, 2, 1 / 3), (True, 9, 0.25)])
def test_popart_statistics_move_towards_the_target_moments_by_hand(average_first, updates,
                                                                   step):
    network, trajectory, state = _trajectory_and_state(4, seed=1)
    old = PopArtStats(mean=jnp.asarray(2.0), second_moment=jnp.asarray(13.0))  # sigma 3
    learn = learning.LearnConfig(popart=True, popart_step_size=0.25,
                                 popart_average_first=average_first)
    fields = {**dict(state.items()), "updates": jnp.asarray(updates, jnp.int32)}
    state = PopArtLearnerState(**fields, popart=old)
    new_state, metrics = jax.jit(lambda s: learning.learner_step(
        network, optax.sgd(0.0), s, trajectory, None, axis_name=None, learn=learn))(state)
    # The targets by hand, from the unnormalised values 3 n(x) + 2 of the unchanged params.
    _, values = network.apply(state.params, trajectory.timestep.observation.reshape(-1, 3))
    values = 3.0 * np.asarray(values, np.float64).reshape(T + 1, 4) + 2.0
    inp = {"values": values, "rewards": np.asarray(trajectory.timestep.reward[1:]),
           "discounts": np.ones((T, 4)), "mask": np.asarray(trajectory.transition_mask())}
    _, targets = _advantages_by_hand(inp)
    real = inp["mask"] > 0
    mu = (1 - step) * 2.0 + step * targets[real].mean()
    nu = (1 - step) * 13.0 + step * np.square(targets[real]).mean()
    np.testing.assert_allclose(new_state.popart.mean, mu, rtol=1e-5)
    np.testing.assert_allclose(new_state.popart.second_moment, nu, rtol=1e-5)
    np.testing.assert_allclose(metrics["popart_scale"], 3.0, rtol=1e-6)
    # With a zero step size the parameters moved only by POP: the outputs are preserved.
    obs = trajectory.timestep.observation.reshape(-1, 3)
    _, before = network.apply(state.params, obs)
    _, after = network.apply(new_state.params, obs)
    sigma = np.sqrt(nu - mu ** 2)
    np.testing.assert_allclose(sigma * np.asarray(after) + mu, 3.0 * np.asarray(before) + 2.0,
                               rtol=1e-5, atol=1e-5)


def test_popart_average_first_averages_the_batches_then_forgets_them_at_beta():
    # The batches' moments m_1, m_2, ...: with the option the statistics after n <= 1/beta
    # updates are their plain mean (the initial mu = 0, nu = 1 gone after one update), after
    # that the exponential average continues from it; without it the initial values keep the
    # weight (1 - beta)^n.
    beta = 0.25
    batches = [(-10.0, 100.0), (-30.0, 910.0), (-50.0, 2504.0), (-20.0, 401.0),
               (-60.0, 3600.0), (-40.0, 1602.0)]
    for average_first in (True, False):
        stats = PopArtStats.init()
        for n, (m, s) in enumerate(batches):
            step = popart.step_size_at(beta, jnp.asarray(n, jnp.int32),
                                       average_first=average_first)
            stats = popart.update(stats, jnp.float32(m), jnp.float32(s), step)
            if average_first and n == 3:  # 1/beta = 4 updates: the plain mean of four
                np.testing.assert_allclose(stats.mean, -27.5, rtol=1e-6)
                np.testing.assert_allclose(stats.second_moment, 978.75, rtol=1e-6)
        if average_first:  # two more updates at beta, from the plain mean
            mu = 0.75 * (0.75 * -27.5 + 0.25 * -60.0) + 0.25 * -40.0
            nu = 0.75 * (0.75 * 978.75 + 0.25 * 3600.0) + 0.25 * 1602.0
        else:
            weights = [beta * (1 - beta) ** (5 - i) for i in range(6)]
            mu = sum(w * m for w, (m, _) in zip(weights, batches))
            nu = (1 - beta) ** 6 + sum(w * s for w, (_, s) in zip(weights, batches))
        np.testing.assert_allclose(stats.mean, mu, rtol=1e-6)
        np.testing.assert_allclose(stats.second_moment, nu, rtol=1e-6)
    # Without the option sigma is inflated by how far the targets are from 0: constant
    # targets of -100 (spread 0) after 4 updates at beta = 0.25 give sigma =
    # sqrt(nu - mu^2) with mu = -100 f, nu = 10^4 f + (1 - f), f = 1 - 0.75^4.
    stats = PopArtStats.init()
    for n in range(4):
        stats = popart.update(stats, jnp.float32(-100.0), jnp.float32(1e4),
                              popart.step_size_at(beta, jnp.asarray(n), average_first=False))
    f = 1 - 0.75 ** 4
    np.testing.assert_allclose(popart.scale(stats),
                               np.sqrt(1e4 * f + (1 - f) - (100 * f) ** 2), rtol=1e-5)
    assert float(popart.scale(stats)) > 40.0


def test_popart_preserves_the_unnormalised_outputs():
    spec = EnvSpec(observation=ArraySpec((5,), np.float32), action=DiscreteSpec(A))
    network = make_network(default_config(), spec)
    params = network.init(jax.random.PRNGKey(3), jnp.zeros((1, 5)))
    x = jax.random.normal(jax.random.PRNGKey(4), (16, 5))
    learn = learning.LearnConfig(popart=True)
    old = PopArtStats(mean=jnp.asarray(-40.0), second_moment=jnp.asarray(1700.0))
    new = PopArtStats(mean=jnp.asarray(-55.0), second_moment=jnp.asarray(3100.0))
    logits, n_old = network.apply(params, x)
    new_params = learning.popart_preserve(params, old, new, learn)
    new_logits, n_new = network.apply(new_params, x)
    sigma_old = np.sqrt(1700.0 - 40.0 ** 2)
    sigma_new = np.sqrt(3100.0 - 55.0 ** 2)
    np.testing.assert_allclose(sigma_new * np.asarray(n_new, np.float64) - 55.0,
                               sigma_old * np.asarray(n_old, np.float64) - 40.0, rtol=1e-5)
    np.testing.assert_array_equal(new_logits, logits)  # only the value head changes
    assert not np.allclose(n_new, n_old)


def test_reward_scale_scales_advantages_and_baseline_errors():
    inp = _sequences(1)
    inp = {k: v[:, 0] for k, v in inp.items()}
    base = vtrace_loss(**inp, discount=GAMMA, entropy_cost=0.0)
    scaled = vtrace_loss(**dict(inp, values=inp["values"] * 0.1), discount=GAMMA,
                         entropy_cost=0.0, reward_scale=0.1)
    np.testing.assert_allclose(scaled.policy_loss, 0.1 * base.policy_loss, rtol=1e-5)
    np.testing.assert_allclose(scaled.baseline_loss, 0.01 * base.baseline_loss, rtol=1e-5)
    np.testing.assert_allclose(scaled.advantage_std, 0.1 * base.advantage_std, rtol=1e-5)


def test_the_logit_gradient_scales_are_the_terms_gradients():
    inp = _sequences(1, seed=2)
    inp = {k: v[:, 0] for k, v in inp.items()}
    out = vtrace_loss(**inp, discount=GAMMA, entropy_cost=0.3)
    m = inp["mask"]

    def term(name, logits):
        o = vtrace_loss(**dict(inp, logits_t=logits), discount=GAMMA, entropy_cost=0.3)
        return o.policy_loss if name == "pg" else -0.3 * o.entropy

    for name, metric in (("pg", out.pg_logit_grad), ("entropy", out.entropy_logit_grad)):
        g = jax.grad(functools.partial(term, name))(jnp.asarray(inp["logits_t"]))
        # The loss averages over the real transitions: undo it, then average the norms.
        per_t = np.linalg.norm(np.asarray(g), axis=-1) * m.sum()
        np.testing.assert_allclose(metric, per_t[m > 0].mean(), rtol=1e-4)


@pytest.mark.parametrize("field, value", [("advantage_normalization", "global"),
                                          ("popart_step_size", 0.0),
                                          ("popart_average_first", None),
                                          ("reward_scale", -1.0)])
def test_bad_remedy_settings_are_config_errors(field, value):
    config = default_config()
    with config.unlocked():
        config[field] = value
    spec = EnvSpec(observation=ArraySpec((3,), np.float32), action=DiscreteSpec(A))
    with pytest.raises(ConfigError, match=field):
        make_agent(config, spec)


def test_popart_statistics_are_part_of_the_learner_state():
    config = default_config()
    config.popart = True
    spec = EnvSpec(observation=ArraySpec((3,), np.float32), action=DiscreteSpec(A))
    state = make_agent(config, spec).init(jax.random.PRNGKey(0), spec)
    assert isinstance(state, PopArtLearnerState)
    assert float(state.popart.mean) == 0.0 and float(state.popart.second_moment) == 1.0
