"""The V-trace networks: the IMPALA ResNet's max-pooling against flax's `nn.max_pool`.

`max_pool_3x3_stride_2` replaces only how the gradient is computed, so the reference is flax's
own `nn.max_pool` differentiated by JAX (XLA's select-and-scatter): values and gradients must
agree bit for bit, including where a window holds several equal maxima (small integer inputs
make those common, as flat regions of Atari frames do).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.vtrace.networks import ResNetTorso, max_pool_3x3_stride_2


def _reference(x):
    return nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")


@pytest.mark.parametrize("shape", [(2, 84, 84, 3), (2, 21, 21, 2), (1, 7, 8, 1), (1, 2, 5, 1),
                                   (1, 1, 1, 1)])
@pytest.mark.parametrize("levels", [3, 100_000])
def test_max_pool_value_and_gradient_equal_flax_bit_for_bit(shape, levels):
    rng = np.random.default_rng(sum(shape) + levels)
    x = jnp.asarray(rng.integers(0, levels, shape).astype(np.float32))
    cotangent = jnp.asarray(rng.normal(size=_reference(x).shape).astype(np.float32))

    expected, expected_vjp = jax.vjp(_reference, x)
    got, got_vjp = jax.vjp(max_pool_3x3_stride_2, x)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(jax.jit(got_vjp)(cotangent)[0],
                                  jax.jit(expected_vjp)(cotangent)[0])


def test_resnet_torso_gradients_match_one_built_on_flax_max_pool(monkeypatch):
    from agents.vtrace import networks

    x = jnp.asarray(np.random.default_rng(0).integers(0, 4, (3, 20, 20, 2)).astype(np.uint8))
    torso = ResNetTorso(channels=(4, 8), hidden_size=16)
    params = torso.init(jax.random.PRNGKey(0), x)

    def grads():
        return jax.grad(lambda p: jnp.sum(torso.apply(p, x) ** 2))(params)

    got = grads()
    monkeypatch.setattr(networks, "max_pool_3x3_stride_2", _reference)
    expected = grads()
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), got,
                 expected)
