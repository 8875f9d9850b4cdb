"""The DQN agent: its loss on a hand-made batch of replay windows against rlax (Double DQN and
C51, with the n-step returns worked by hand), the exploration schedule, the conformance check,
and a seeded Anakin run on Catch that must learn."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from conftest import step_sizes_under_a_constant_gradient

import agents
from agents import dqn
from agents.dqn import learning, networks
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec

GAMMA = 0.9
SPEC = EnvSpec(observation=ArraySpec((3,), np.float32), action=DiscreteSpec(2))


def _windows():
    """Two sampled positions with n = 2: the first runs on (G = 1 + 0.9 * 2 = 2.8, bootstrap
    0.81 from its index 2), the second ends at a terminal at index 1 (G = -1, bootstrap 0)."""
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 3)), jnp.float32)
    return {
        "observation": obs,
        "action": jnp.asarray([[1, 0, 0], [0, 1, 1]], jnp.int32),
        "reward": jnp.asarray([[0.0, 1.0, 2.0], [0.0, -1.0, 5.0]]),
        "discount": jnp.asarray([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]]),
        "last": jnp.asarray([[False, False, False], [False, True, False]]),
    }


G, BOOTSTRAP, BOOTSTRAP_INDEX = jnp.asarray([2.8, -1.0]), jnp.asarray([0.81, 0.0]), [2, 1]
WEIGHTS = jnp.asarray([1.0, 0.5])


def _setup(head):
    config = dqn.default_config()
    config.hidden_sizes, config.head, config.num_atoms = (8,), head, 11
    config.v_min, config.v_max = -3.0, 3.0
    network = networks.make_network(config, SPEC)
    online = network.init(jax.random.key(0), jnp.zeros((1, 3)))
    target = network.init(jax.random.key(1), jnp.zeros((1, 3)))
    return network, dqn.learn_config(config), online, target


def test_n_step_targets_of_sampled_windows_are_the_hand_worked_ones():
    g, discount, obs_t = learning.batch_targets(_windows(), gamma=GAMMA)
    np.testing.assert_allclose(g, G, rtol=1e-6)
    np.testing.assert_allclose(discount, BOOTSTRAP, rtol=1e-6)
    w = _windows()["observation"]
    np.testing.assert_array_equal(obs_t, jnp.stack([w[0, 2], w[1, 1]]))


def test_double_dqn_loss_is_rlaxs_on_the_hand_worked_returns():
    network, learn, online, target = _setup("q")
    windows = _windows()
    obs_tm1, obs_t = windows["observation"][:, 0], windows["observation"][[0, 1], BOOTSTRAP_INDEX]
    a_tm1 = windows["action"][:, 0]

    def reference(params):
        q_tm1 = network.apply(params, obs_tm1)[0]
        q_t_select = network.apply(params, obs_t)[0]
        q_t_value = network.apply(target, obs_t)[0]
        td = jax.vmap(rlax.double_q_learning)(q_tm1, a_tm1, G, BOOTSTRAP, q_t_value,
                                              q_t_select)
        return jnp.mean(WEIGHTS * rlax.huber_loss(td, 1.0)), jnp.abs(td)

    (loss, (priorities, _)), grads = jax.value_and_grad(learning.sample_loss, argnums=2,
                                                        has_aux=True)(
        network, learn, online, target, windows, WEIGHTS, jnp.asarray(GAMMA))
    expected, expected_priorities = reference(online)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(priorities, expected_priorities, rtol=1e-5)
    expected_grads = jax.grad(lambda p: reference(p)[0])(online)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), grads,
                 expected_grads)


def test_c51_loss_is_rlaxs_categorical_double_q_learning():
    network, learn, online, target = _setup("c51")
    windows = _windows()
    obs_tm1, obs_t = windows["observation"][:, 0], windows["observation"][[0, 1], BOOTSTRAP_INDEX]
    atoms = jnp.linspace(-3.0, 3.0, 11)
    logits_tm1 = network.apply(online, obs_tm1)[1]
    q_t_select = network.apply(online, obs_t)[0]
    logits_t = network.apply(target, obs_t)[1]
    per_sample = jax.vmap(rlax.categorical_double_q_learning,
                          in_axes=(None, 0, 0, 0, 0, None, 0, 0))(
        atoms, logits_tm1, windows["action"][:, 0], G, BOOTSTRAP, atoms, logits_t, q_t_select)
    loss, (priorities, _) = learning.sample_loss(network, learn, online, target, windows,
                                                 WEIGHTS, jnp.asarray(GAMMA))
    np.testing.assert_allclose(loss, jnp.mean(WEIGHTS * per_sample), rtol=1e-5)
    np.testing.assert_allclose(priorities, per_sample, rtol=1e-5)


def test_epsilon_falls_linearly_over_learner_steps_then_stays():
    at = lambda s: float(learning.epsilon_at(jnp.asarray(s), start=1.0, end=0.1,
                                             anneal_steps=10))
    assert [at(0), at(5), at(10), at(50)] == pytest.approx([1.0, 0.55, 0.1, 0.1])


def test_the_step_size_falls_linearly_to_zero_over_anneal_lr_updates():
    config = dqn.default_config()
    config.learning_rate, config.adam_eps = 0.1, 0.0
    config.replay_ratio = 2  # two updates per learner step
    config.anneal_lr_updates = 2  # learner steps
    optimizer = dqn.make_optimizer(config)
    # Learner step 0 at the full rate, learner step 1 at half, then none.
    np.testing.assert_allclose(step_sizes_under_a_constant_gradient(optimizer, 6),
                               [0.1, 0.1, 0.05, 0.05, 0.0, 0.0], rtol=1e-4, atol=1e-9)


def test_without_an_anneal_the_optimiser_is_optax_clipped_adam_with_the_earlier_state():
    import optax

    config = dqn.default_config()
    assert config.anneal_lr_updates == 0
    config.max_grad_norm = 1.0
    reference = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adam(config.learning_rate, eps=config.adam_eps))
    optimizer = dqn.make_optimizer(config)
    params = {"w": jnp.zeros((3,)), "b": jnp.zeros(())}
    ours, theirs = optimizer.init(params), reference.init(params)
    # The state of the optimiser before `anneal_lr_updates` existed, which earlier checkpoints
    # hold: that chain with its hyperparameters injected, and no schedule count.
    earlier = optax.inject_hyperparams(lambda learning_rate, adam_eps, max_grad_norm: optax.chain(
        optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate, eps=adam_eps)))(
        learning_rate=1e-3, adam_eps=1e-5, max_grad_norm=1.0)
    assert jax.tree.structure(ours) == jax.tree.structure(earlier.init(params)), ours
    rng = np.random.default_rng(0)
    for _ in range(5):
        grads = {"w": jnp.asarray(rng.normal(size=3) * 2, jnp.float32),
                 "b": jnp.asarray(rng.normal(), jnp.float32)}
        a, ours = optimizer.update(grads, ours, params)
        b, theirs = reference.update(grads, theirs, params)
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), a, b)
        params = optax.apply_updates(params, a)


def test_dqn_is_registered_and_passes_the_conformance_check():
    from experiments.conformance import check_agent

    assert "dqn" in agents.registered()
    config = dqn.default_config()
    config.hidden_sizes, config.batch_size, config.warmup = (16,), 8, 8
    config.replay_capacity = 256
    report = check_agent("dqn", config=config)
    assert report.passed, report
    assert report.num_devices == 2


@pytest.mark.optimised
def test_double_dqn_learns_catch_under_anakin():
    import anakin

    config = anakin.default_config()
    config.agent = dqn.default_config()
    config.env.name = "catch"
    config.num_envs, config.rollout_length = 16, 4
    config.agent.batch_size, config.agent.warmup = 64, 256
    config.agent.epsilon_anneal_steps, config.agent.target_update_interval = 200, 50
    config.updates_per_chunk, config.total_env_steps = 100, 16 * 4 * 600
    config.seed, config.num_devices = 0, 1
    result = anakin.train(config)
    first, last = result.history[0]["episode_return"], result.history[-1]["episode_return"]
    assert first < 0.0 and last > 0.8, (first, last)


@pytest.mark.optimised
def test_double_dqn_learns_catch_under_sebulba():
    import sebulba

    config = sebulba.default_config()
    config.agent = dqn.default_config()
    config.env.task = "envs_jax:catch"  # stepped on the host
    config.actor_device_ids, config.learner_device_ids = (0,), (1,)
    config.envs_per_actor_thread, config.rollout_length, config.policy_lag = 16, 4, 0
    config.agent.batch_size, config.agent.warmup = 64, 256
    config.agent.epsilon_anneal_steps, config.agent.target_update_interval = 200, 50
    config.total_env_steps, config.log_every_updates = 16 * 4 * 500, 100
    config.timeout_s = 120.0
    result = sebulba.train(config)
    first, last = result.history[0]["episode_return"], result.history[-1]["episode_return"]
    assert first < 0.0 and last > 0.8, (first, last)


def test_shipped_dqn_configs_are_valid():
    import anakin
    import sebulba
    from experiments.configs import (
        dqn_cartpole,
        dqn_catch,
        sebulba_dqn_atari,
        sebulba_dqn_cartpole,
    )

    assert anakin.validate(dqn_catch.get_config(), 8) == 1
    assert anakin.validate(dqn_cartpole.get_config(), 8) == 1
    sebulba.validate(sebulba_dqn_cartpole.get_config(), num_local_devices=1, num_processes=1)
    atari = sebulba_dqn_atari.get_config()
    sebulba.validate(atari, num_local_devices=1, num_processes=1)
    assert atari.env.task == "Pong-v5" and atari.agent.torso == "conv"


def test_a_sweep_of_alpha_is_refused_when_the_configs_alpha_is_0():
    # With alpha 0 the learner is compiled to draw uniformly (without reading priorities), so
    # a swept alpha would be ignored; from a prioritised config it is an input like the rest.
    import anakin
    from experiments.configs import dqn_catch
    from podracer.config import ConfigError

    config = dqn_catch.get_config()
    config.sweep.seeds = (0, 1)
    config.sweep.agent.priority_exponent = (0.0, 0.6)
    with pytest.raises(ConfigError, match="sweep.agent.priority_exponent.*cannot sweep"):
        anakin.validate(config, 1)
    config.agent.priority_exponent = 0.6
    assert anakin.validate(config, 1) == 1


def test_dqn_minatar_config_is_the_cartpole_settings_with_the_minatar_network():
    # (the runner's validation needs gymnax for the environment: test_default_configs checks
    # the config's fields without it)
    from agents.dqn.agent import validate
    from experiments.configs import dqn_cartpole, dqn_minatar
    from podracer.agent import parameter_count

    config, cartpole = dqn_minatar.get_config(), dqn_cartpole.get_config()
    validate(config.agent)
    for field in ("num_envs", "rollout_length", "updates_per_chunk"):
        assert config[field] == cartpole[field], field
    for field in ("replay_ratio", "batch_size", "learning_rate", "layer_norm", "n_step",
                  "target_update_interval", "epsilon_end", "replay_capacity"):
        assert config.agent[field] == cartpole.agent[field], field
    # epsilon anneals over the same 32% of the run as CartPole's: 5,000 of 15,625 learner steps,
    # and at a run length set on the command line, 50,000 of 10M / 64 = 156,250
    assert config.agent.epsilon_anneal_steps / (config.total_env_steps / 64) == 0.32
    config.total_env_steps = 10_000_000
    assert config.agent.epsilon_anneal_steps == 50_000
    spec = EnvSpec(observation=ArraySpec((10, 10, 4), np.bool_), action=DiscreteSpec(3))
    agent = agents.make(config.agent, spec)
    # conv 3*3*4*16 + 16, LayerNorm 2*16, dense 8*8*16*128 + 128, LayerNorm 2*128, q 128*3 + 3
    assert parameter_count(agent, spec) == 592 + 32 + 131_200 + 256 + 387


def test_the_conformance_check_builds_dqn_at_its_defaults():
    # The check lowers the 1,000-transition warm-up to what its trajectories bring; DQN refuses
    # a warm-up below one batch, so the batch is lowered with it (and the report says so).
    from experiments.conformance import check_agent

    report = check_agent("dqn", rules=["interface"], raise_on_failure=False)
    assert report.passed, report
    assert "agent.batch_size = 16 (was 128)" in str(report)
