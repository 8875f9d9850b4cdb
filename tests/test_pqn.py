"""PQN: its Q(lambda) targets against a hand-worked trajectory (cut at an episode's end), one
minibatch loss by hand, the board_conv network against a hand computation, the
conformance check, and a seeded run on Catch under each runner that must learn."""

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
import pytest
from conftest import step_sizes_under_a_constant_gradient

import agents
from agents import pqn
from agents.dqn import losses, networks
from podracer.config import ConfigError
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec


def test_q_lambda_targets_are_the_hand_worked_ones_and_stop_at_an_episode_end():
    # One column, T = 3: o_1 MID, o_2 LAST (terminal), o_3 FIRST of the next episode.
    reward = jnp.asarray([[1.0], [2.0], [0.0]])
    discount = jnp.asarray([[1.0], [0.0], [1.0]])
    last = jnp.asarray([[False], [True], [False]])
    q_t = jnp.asarray([[[0.5, 3.0]], [[9.0, 9.0]], [[4.0, -1.0]]])  # Q(o_1), Q(o_2), Q(o_3)
    g = losses.q_lambda_targets(reward, discount, last, q_t, gamma=0.5, lambda_=0.5)
    # G_2 = 0 + 0.5 * 4 = 2 (bootstraps from o_3); G_1 = 2 + 0 (terminal); G_0 = 1 + 0.5 *
    # (0.5 * max Q(o_1) + 0.5 * G_1) = 1 + 0.5 * (1.5 + 1) = 2.25.
    np.testing.assert_allclose(g[:, 0], [2.25, 2.0, 2.0], rtol=1e-6)
    # With o_2 a truncation (LAST, d = 1) G_1 bootstraps from o_2: 2 + 0.5 * 9 = 6.5, and G_0
    # does not reach past it: 1 + 0.5 * (1.5 + 0.5 * 6.5) = 3.375.
    g = losses.q_lambda_targets(reward, jnp.ones_like(discount), last, q_t, gamma=0.5,
                                lambda_=0.5)
    np.testing.assert_allclose(g[:, 0], [3.375, 6.5, 2.0], rtol=1e-6)


class _Table:
    def apply(self, params, observation):
        return jnp.broadcast_to(params, (observation.shape[0], 2)), None


def test_minibatch_loss_is_the_masked_mean_squared_error():
    loss, q_mean = pqn.minibatch_loss(_Table(), jnp.asarray([1.0, 3.0]), jnp.zeros((3, 1)),
                                      jnp.asarray([0, 1, 1]), jnp.asarray([2.0, 1.0, 7.0]),
                                      jnp.asarray([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(loss, (0.5 * 1 + 0.5 * 4) / 2)  # the third is masked
    np.testing.assert_allclose(q_mean, 7.0 / 3)


def test_pqn_is_registered_and_passes_the_conformance_check():
    from experiments.conformance import check_agent

    assert "pqn" in agents.registered()
    config = pqn.default_config()
    config.hidden_sizes = (16,)
    report = check_agent("pqn", config=config)
    assert report.passed, report
    assert report.num_devices == 2


class _ByObservation:
    """Q(o) = the observation's two entries (o is [B, 2])."""

    def apply(self, params, observation):
        return observation, None


def test_targets_use_the_rewards_times_reward_scale():
    from podracer.types import StepType, TimeStep, Trajectory

    # One column, T = 2, no episode end: rewards 4 and 8, Q(o_1) = (1, 3), Q(o_2) = (2, 0).
    obs = jnp.asarray([[[0.0, 0.0]], [[1.0, 3.0]], [[2.0, 0.0]]])
    trajectory = Trajectory(
        timestep=TimeStep(step_type=jnp.full((3, 1), StepType.MID, jnp.int32),
                          reward=jnp.asarray([[0.0], [4.0], [8.0]]),
                          discount=jnp.ones((3, 1)), observation=obs),
        action=jnp.zeros((2, 1), jnp.int32), extras={})
    g = pqn.targets(_ByObservation(), None, trajectory, gamma=0.5, lambda_=0.5,
                    reward_scale=0.25)
    # G_1 = 0.25 * 8 + 0.5 * 2 = 3; G_0 = 0.25 * 4 + 0.5 * (0.5 * 3 + 0.5 * 3) = 2.5.
    np.testing.assert_allclose(g[:, 0], [2.5, 3.0], rtol=1e-6)


def test_the_step_size_falls_linearly_to_zero_over_anneal_lr_updates():
    config = pqn.default_config()
    config.learning_rate = 0.1
    config.adam_eps = 0.0
    config.num_epochs, config.num_minibatches = 1, 2  # two updates per learner step
    config.anneal_lr_updates = 2  # learner steps
    optimizer = pqn.make_optimizer(config)
    # Learner step 0 at the full rate, learner step 1 at half, then none.
    np.testing.assert_allclose(step_sizes_under_a_constant_gradient(optimizer, 6),
                               [0.1, 0.1, 0.05, 0.05, 0.0, 0.0], rtol=1e-4, atol=1e-9)


def _layer_norm(x, scale, bias, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + eps) * scale + bias


def test_board_conv_network_is_one_3x3_conv_then_dense_layers_with_layer_norm():
    spec = EnvSpec(observation=ArraySpec((10, 10, 4), np.float32), action=DiscreteSpec(3))
    config = pqn.default_config()
    config.torso, config.hidden_sizes = "board_conv", (128,)
    network = networks.make_network(config, spec)
    x = np.asarray(jax.random.bernoulli(jax.random.PRNGKey(0), 0.3, (2, 10, 10, 4)), np.float32)
    params = network.init(jax.random.PRNGKey(1), x)
    p = jax.tree.map(np.asarray, params["params"])
    conv, ln0 = p["torso"]["Conv_0"], p["torso"]["LayerNorm_0"]
    dense, ln1, head = p["torso"]["Dense_0"], p["torso"]["LayerNorm_1"], p["Dense_0"]
    assert conv["kernel"].shape == (3, 3, 4, 16) and dense["kernel"].shape == (8 * 8 * 16, 128)
    assert head["kernel"].shape == (128, 3)
    # By hand: a VALID 3 x 3 convolution (8 x 8 outputs), LayerNorm over the 16 channels of
    # each cell, ReLU; flattened row by row; dense, LayerNorm, ReLU; the head.
    h = np.zeros((2, 8, 8, 16), np.float32)
    for i in range(8):
        for j in range(8):
            patch = x[:, i:i + 3, j:j + 3, :]
            h[:, i, j] = np.einsum("bklc,klco->bo", patch, conv["kernel"]) + conv["bias"]
    h = np.maximum(_layer_norm(h, ln0["scale"], ln0["bias"]), 0).reshape(2, -1)
    h = np.maximum(_layer_norm(h @ dense["kernel"] + dense["bias"], ln1["scale"], ln1["bias"]), 0)
    q, _ = network.apply(params, x)
    np.testing.assert_allclose(q, h @ head["kernel"] + head["bias"], rtol=1e-4, atol=1e-5)


def test_board_conv_kernel_gradient_on_cpu_is_a_matrix_product_not_a_convolution():
    # XLA:CPU computes a convolution's kernel gradient as a second convolution that runs on
    # about one core; `agents.layers.Conv` computes it as an im2col matrix product
    # (tests/test_layers.py). The network's one convolution reads the observations, which are
    # not differentiated, so its compiled gradient holds the forward convolution only.
    spec = EnvSpec(observation=ArraySpec((10, 10, 4), np.float32), action=DiscreteSpec(3))
    config = pqn.default_config()
    config.torso, config.hidden_sizes, config.layer_norm = "board_conv", (128,), True
    network = networks.make_network(config, spec)
    x = jnp.asarray(jax.random.bernoulli(jax.random.PRNGKey(0), 0.3, (8, 10, 10, 4)),
                    jnp.float32)
    params = network.init(jax.random.PRNGKey(1), x)
    grad = jax.jit(jax.grad(lambda p: jnp.sum(network.apply(p, x)[0] ** 2)))
    assert jax.default_backend() == "cpu"
    assert grad.lower(params).compile().as_text().count(" convolution(") == 1


def test_board_conv_on_observations_that_are_not_boards_names_the_field():
    config = pqn.default_config()
    config.torso = "board_conv"
    spec = EnvSpec(observation=ArraySpec((4,), np.float32), action=DiscreteSpec(2))
    with pytest.raises(ConfigError, match=r"agent\.torso.*'board_conv' needs \[H, W, C\] boards"):
        networks.make_network(config, spec)


def test_pqn_minatar_config_builds_the_minatar_network_for_breakouts_boards():
    from experiments.configs import pqn_minatar
    from podracer.agent import parameter_count

    config = pqn_minatar.get_config()
    spec = EnvSpec(observation=ArraySpec((10, 10, 4), np.bool_), action=DiscreteSpec(3))
    agent = agents.make(config.agent, spec)
    # conv 3*3*4*16 + 16, LayerNorm 2*16, dense 8*8*16*128 + 128, LayerNorm 2*128, head 128*3 + 3
    assert parameter_count(agent, spec) == 592 + 32 + 131_200 + 256 + 387
    updates = 10_000_000 // (128 * 32)
    assert config.agent.anneal_lr_updates == updates  # the step size reaches 0 at the end
    assert config.agent.epsilon_anneal_steps == updates // 10


def _small_pqn() -> ml_collections.ConfigDict:
    """PQN sized for Catch in a few seconds: one layer of 64, a step size of 1e-3, two
    minibatches of 128 per epoch (16 environments x T = 16), epsilon falling over 30 learner
    steps (7,680 env steps)."""
    config = pqn.default_config()
    config.hidden_sizes, config.learning_rate, config.num_minibatches = (64,), 1e-3, 2
    config.epsilon_anneal_steps = 30
    return config


@pytest.mark.optimised
def test_more_minibatches_than_transitions_names_num_minibatches():
    """2 environments x T=2 give 4 transitions per learner step: 8 minibatches of them would
    be empty (the loss of none is NaN), and the run stops before its first update."""
    import anakin

    config = anakin.default_config()
    config.agent = _small_pqn()
    config.agent.num_minibatches = 8
    config.env.name = "catch"
    config.num_envs, config.rollout_length, config.updates_per_chunk = 2, 2, 1
    config.total_env_steps, config.num_devices = 4, 1
    with pytest.raises(ConfigError, match=r"config\.agent\.num_minibatches: 8 minibatches of "
                                          r"the 4 transitions .* Fix: use at most 4"):
        anakin.train(config)


def test_pqn_learns_catch_under_anakin():
    import anakin

    config = anakin.default_config()
    config.agent = _small_pqn()
    config.env.name = "catch"
    config.num_envs, config.rollout_length = 16, 16
    config.updates_per_chunk, config.total_env_steps = 20, 16 * 16 * 120
    config.seed, config.num_devices = 0, 1
    result = anakin.train(config)
    first, last = result.history[0]["episode_return"], result.history[-1]["episode_return"]
    # The first chunk acts almost at random (epsilon from 1); the last with epsilon 0.05.
    assert first < 0.0 and last > 0.75, (first, last)


@pytest.mark.optimised
def test_pqn_learns_catch_under_sebulba():
    import sebulba

    config = sebulba.default_config()
    config.agent = _small_pqn()
    config.env.task = "envs_jax:catch"  # stepped on the host
    config.actor_device_ids, config.learner_device_ids = (0,), (1,)
    config.envs_per_actor_thread, config.rollout_length = 16, 16  # policy_lag: the default's
    config.total_env_steps, config.log_every_updates = 16 * 16 * 120, 20
    config.timeout_s = 120.0
    result = sebulba.train(config)
    first, last = result.history[0]["episode_return"], result.history[-1]["episode_return"]
    assert first < 0.0 and last > 0.75, (first, last)
