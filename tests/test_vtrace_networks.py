"""The V-trace networks: the IMPALA ResNet built on `agents.layers` against the same network
built on flax's own `nn.Conv` and `nn.max_pool` (gradients by XLA's convolution transpose and
select-and-scatter)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from conftest import assert_trees_equal

from agents.vtrace import networks
from agents.vtrace.networks import ResNetTorso


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
