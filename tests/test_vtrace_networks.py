"""The V-trace networks: the IMPALA ResNet built on `agents.layers` against the same network
built on flax's own `nn.Conv` and `nn.max_pool` (gradients by XLA's convolution transpose and
select-and-scatter)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_trees_equal

import agents
from agents.vtrace import networks
from agents.vtrace.networks import ResNetTorso
from podracer.config import ConfigError
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec


def test_resnet_torso_matches_one_built_on_flax_layers(monkeypatch):
    x = jnp.asarray(np.random.default_rng(0).integers(0, 4, (3, 20, 20, 2)).astype(np.uint8))
    torso = ResNetTorso(channels=(4, 8), hidden_size=16)
    params = torso.init(jax.random.PRNGKey(0), x)

    def value_and_grads():
        return jax.value_and_grad(lambda p: jnp.sum(torso.apply(p, x) ** 2))(params)

    got = value_and_grads()
    monkeypatch.setattr(networks, "max_pool_3x3_stride_2",
                        lambda v: nn.max_pool(v, (3, 3), strides=(2, 2), padding="SAME"))
    monkeypatch.setattr(networks, "Conv", nn.Conv)
    reference_params = torso.init(jax.random.PRNGKey(0), x)
    expected = jax.value_and_grad(lambda p: jnp.sum(torso.apply(p, x) ** 2))(params)
    # The same parameters from the same key: the layers are flax's own, only gradients differ.
    assert_trees_equal(reference_params, params)
    # The forward pass is the same ops; a kernel gradient sums at most 3 x 20 x 20 = 1,200
    # products per element in another order than XLA's: float32 rounding of such a sum stays
    # far below 1e-5 of the leaf's largest entry (measured ≈1e-7).
    assert_trees_equal(got, expected, float_rtol=1e-5)


def test_the_conv_torsos_smallest_image_is_36_pixels_by_hand():
    # By hand for 8x8/4, 4x4/2, 3x3/1 VALID: the last layer needs 3 inputs, the second
    # (3 - 1) * 2 + 4 = 8, the first (8 - 1) * 4 + 8 = 36: Atari's 84 x 84 frames fit, MinAtar's
    # 10 x 10 boards do not.
    assert networks.conv_min_size() == 36
    torso = networks.ConvTorso(channels=(2, 2, 2), hidden_size=4)
    x = jnp.zeros((1, 36, 36, 1))
    assert torso.apply(torso.init(jax.random.PRNGKey(0), x), x).shape == (1, 4)
    with pytest.raises(ZeroDivisionError):  # flax cannot initialise a layer on 0 features
        torso.init(jax.random.PRNGKey(0), jnp.zeros((1, 35, 35, 1)))


MINATAR_SPEC = EnvSpec(observation=ArraySpec((10, 10, 4), np.bool_), action=DiscreteSpec(3))
ATARI_SPEC = EnvSpec(observation=ArraySpec((84, 84, 4), np.uint8), action=DiscreteSpec(6))
CARTPOLE_SPEC = EnvSpec(observation=ArraySpec((4,), np.float32), action=DiscreteSpec(2))


@pytest.mark.parametrize("agent", ["vtrace", "ppo"])
def test_the_default_torso_fits_small_boards_and_atari_frames(agent):
    # A shipped actor-critic agent's default config on MinAtar's observations: "auto" used to
    # pick the Atari conv torso and crash initialising it on 10 x 10 boards.
    assert networks.resolve_torso("auto", MINATAR_SPEC) == "mlp"
    assert networks.resolve_torso("auto", ATARI_SPEC) == "conv"
    config = agents.default_config(agent)
    learner = agents.make(config, MINATAR_SPEC).init(jax.random.PRNGKey(0), MINATAR_SPEC)
    # The MLP reads the flattened board: a first kernel of 10 x 10 x 4 = 400 inputs.
    assert (400, 256) in [leaf.shape for leaf in jax.tree.leaves(learner.params)]


@pytest.mark.parametrize("agent", ["vtrace", "ppo"])
def test_asking_for_the_conv_torso_on_small_boards_names_the_field(agent):
    config = agents.default_config(agent)
    config.torso = "conv"
    with pytest.raises(ConfigError, match=r"config\.agent\.torso: 'conv' needs images of at "
                                          r"least 36 x 36 x C.*Fix: use 'mlp' or 'resnet'"):
        agents.make(config, MINATAR_SPEC)


def test_logit_scale_multiplies_the_policy_logits_and_nothing_else():
    # The scale is not a parameter: the same key gives the same parameters with any scale, and
    # multiplying by a power of two is exact in float32, so the scaled logits are the unscaled
    # ones times 0.25 bit for bit, and the value is untouched.
    config = agents.default_config("vtrace")
    x = jnp.asarray(np.random.default_rng(0).integers(0, 2, (5, 10, 10, 4)).astype(np.bool_))
    config.logit_scale = 1.0
    plain = networks.make_network(config, MINATAR_SPEC)
    config.logit_scale = 0.25
    scaled = networks.make_network(config, MINATAR_SPEC)
    params = plain.init(jax.random.PRNGKey(0), x)
    assert_trees_equal(scaled.init(jax.random.PRNGKey(0), x), params)
    logits, value = plain.apply(params, x)
    scaled_logits, scaled_value = scaled.apply(params, x)
    assert float(jnp.max(jnp.abs(logits))) > 0.0
    np.testing.assert_array_equal(np.asarray(scaled_logits), 0.25 * np.asarray(logits))
    np.testing.assert_array_equal(np.asarray(scaled_value), np.asarray(value))


@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_a_logit_scale_that_is_not_positive_names_the_field(scale):
    config = agents.default_config("vtrace")
    config.logit_scale = scale
    with pytest.raises(ConfigError, match=r"config\.agent\.logit_scale: must be a positive number"):
        agents.make(config, MINATAR_SPEC)


@pytest.mark.parametrize("torso, hidden_sizes, spec, expected", [
    ("auto", None, MINATAR_SPEC, 64 / 256),  # the default on boards: 2 x 256, slowed to 64's pace
    ("auto", None, CARTPOLE_SPEC, 1.0),      # the default on vectors: 2 x 64, unscaled
    ("mlp", (256, 128), MINATAR_SPEC, 64 / 128),  # the last layer's width counts
    ("mlp", (16,), CARTPOLE_SPEC, 1.0),      # narrower than 64: never sped up
    ("auto", None, ATARI_SPEC, 1.0),         # conv torso: as before
])
def test_logit_scale_left_none_is_64_over_the_mlps_width_at_most_1(torso, hidden_sizes, spec,
                                                                    expected):
    config = agents.default_config("vtrace")
    config.torso, config.hidden_sizes = torso, hidden_sizes
    assert networks.make_network(config, spec).logit_scale == expected
    config.logit_scale = 2.0  # set by hand: used as it is
    assert networks.make_network(config, spec).logit_scale == 2.0
