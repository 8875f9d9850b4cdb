"""The actor-critic MLP's width (V-trace, PPO) and PPO's activation when they are left to the
observations."""

import jax
import numpy as np
import pytest
from conftest import kernel_shapes

import agents
from podracer.config import ConfigError
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec

MINATAR = EnvSpec(observation=ArraySpec((10, 10, 4), np.float32), action=DiscreteSpec(5))
CARTPOLE = EnvSpec(observation=ArraySpec((4,), np.float32), action=DiscreteSpec(2))
CATCH = EnvSpec(observation=ArraySpec((10, 5), np.float32), action=DiscreteSpec(3))


@pytest.mark.parametrize("spec, first, second", [
    (MINATAR, (400, 256), (256, 256)),  # a board read flattened: 2 x 256
    (CARTPOLE, (4, 64), (64, 64)),      # a vector: 2 x 64
    (CATCH, (50, 64), (64, 64)),        # a 2-D array, not an image: 2 x 64
])
def test_vtrace_default_width_follows_the_observations(spec, first, second):
    config = agents.default_config("vtrace")
    assert config.hidden_sizes is None
    shapes = kernel_shapes(config, spec)
    assert first in shapes and second in shapes, shapes


def test_vtrace_hidden_sizes_set_by_hand_apply_to_boards_too():
    config = agents.default_config("vtrace")
    config.hidden_sizes = (32,)
    shapes = kernel_shapes(config, MINATAR)
    assert (400, 32) in shapes and (400, 256) not in shapes, shapes


@pytest.mark.parametrize("agent", ["vtrace", "ppo"])
@pytest.mark.parametrize("bad", [(), (64, 0), (64.5,)])
def test_bad_hidden_sizes_name_the_field(agent, bad):
    config = agents.default_config(agent)
    config.hidden_sizes = bad
    with pytest.raises(ConfigError, match="agent.hidden_sizes"):
        agents.make(config, CARTPOLE)


# PPO: the same widths, and the activation left to the observations too (ReLU on boards).

@pytest.mark.parametrize("spec, first, second", [
    (MINATAR, (400, 256), (256, 256)),
    (CARTPOLE, (4, 64), (64, 64)),
    (CATCH, (50, 64), (64, 64)),
])
def test_ppo_default_width_follows_the_observations(spec, first, second):
    config = agents.default_config("ppo")
    assert config.hidden_sizes is None and config.activation is None
    shapes = kernel_shapes(config, spec)
    # Separate policy and value MLPs: each layer shape twice.
    assert shapes.count(first) == 2 and shapes.count(second) == 2, shapes


def _ppo_logits_by_hand(params, x, activation):
    """The policy head's logits computed from the parameters with numpy: the actor MLP on the
    flattened observation, then the head."""
    p = jax.tree_util.tree_map(np.asarray, params["params"])
    h = x.reshape(x.shape[0], -1).astype(np.float64)
    for name in sorted(p["actor_torso"]):
        layer = p["actor_torso"][name]
        h = activation(h @ layer["kernel"] + layer["bias"])
    return h @ p["policy"]["kernel"] + p["policy"]["bias"]


@pytest.mark.parametrize("spec, activation", [
    (MINATAR, lambda h: np.maximum(h, 0.0)),  # a board: ReLU
    (CARTPOLE, np.tanh),                      # a vector: tanh, as before
])
def test_ppo_default_activation_follows_the_observations(spec, activation):
    from agents.ppo import networks
    config = agents.default_config("ppo")
    network = networks.make_network(config, spec)
    x = jax.random.uniform(jax.random.PRNGKey(1), (8,) + spec.observation.shape)
    params = network.init(jax.random.PRNGKey(0), x)
    logits, _ = network.apply(params, x)
    expected = _ppo_logits_by_hand(params, np.asarray(x, np.float64), activation)
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-4, atol=1e-6)


def test_ppo_activation_and_sizes_set_by_hand_apply_to_boards_too():
    from agents.ppo import networks
    config = agents.default_config("ppo")
    config.hidden_sizes, config.activation = (32,), "tanh"
    assert (400, 32) in kernel_shapes(config, MINATAR)
    network = networks.make_network(config, MINATAR)
    x = jax.random.uniform(jax.random.PRNGKey(1), (8,) + MINATAR.observation.shape)
    params = network.init(jax.random.PRNGKey(0), x)
    np.testing.assert_allclose(np.asarray(network.apply(params, x)[0]),
                               _ppo_logits_by_hand(params, np.asarray(x, np.float64), np.tanh),
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("spec, chosen_vtrace, chosen_ppo", [
    # A board read flattened: 2 x 256, V-trace's logits scaled by 64 / 256, PPO with ReLU.
    (MINATAR, {"torso": "mlp", "hidden_sizes": [256, 256], "logit_scale": 0.25},
     {"torso": "mlp", "hidden_sizes": [256, 256], "activation": "relu"}),
    (CARTPOLE, {"torso": "mlp", "hidden_sizes": [64, 64], "logit_scale": 1.0},
     {"torso": "mlp", "hidden_sizes": [64, 64], "activation": "tanh"}),
])
def test_the_agents_report_what_they_chose_for_fields_left_to_them(spec, chosen_vtrace,
                                                                  chosen_ppo):
    # Runs record these in config.json in place of "auto" and None (tests/test_workdir.py).
    assert agents.choices(agents.default_config("vtrace"), spec) == chosen_vtrace
    assert agents.choices(agents.default_config("ppo"), spec) == chosen_ppo
    # Set by hand, a field is the config's own: nothing to report. The conv torso reads no
    # MLP sizes or activation.
    config = agents.default_config("ppo")
    config.hidden_sizes, config.activation = (32,), "tanh"
    assert agents.choices(config, spec) == {"torso": "mlp"}
    config = agents.default_config("vtrace")
    config.torso, config.logit_scale = "conv", 1.0
    assert agents.choices(config, EnvSpec(observation=ArraySpec((84, 84, 4), np.uint8),
                                          action=DiscreteSpec(6))) == {"torso": "conv"}
