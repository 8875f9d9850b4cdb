"""`agents.layers`: flax's convolution and max-pooling with gradients computed another way.

References: the defining sums in float64 NumPy for the convolution's kernel gradient, and
flax's own `nn.max_pool` / `lax.conv_general_dilated` differentiated by JAX (XLA's
select-and-scatter and convolution transpose) for values and the other gradients.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from agents import layers

_NHWC = ("NHWC", "HWIO", "NHWC")


# ---------------------------------------------------------------------------------------------
# CONVOLUTION


def _kernel_grad_by_hand(x, g, kernel, strides, pads):
    """dw[i, j, c, d] = sum_{n, p, q} xpad[n, s_h p + i, s_w q + j, c] g[n, p, q, d], float64."""
    x = np.pad(np.asarray(x, np.float64), ((0, 0), pads[0], pads[1], (0, 0)))
    g = np.asarray(g, np.float64)
    _, oh, ow, _ = g.shape
    (kh, kw), (sh, sw) = kernel, strides
    dw = np.zeros((kh, kw, x.shape[-1], g.shape[-1]))
    for i in range(kh):
        for j in range(kw):
            window = x[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :]
            dw[i, j] = np.einsum("npqc,npqd->cd", window, g)
    return dw


# (input shape, kernel shape, strides, padding): the ResNets' 3x3 "SAME" convolutions at
# strides 1 and 2 (odd sizes), the DQN torso's 8x8/4 and 4x4/2 "VALID" ones (a border that no
# window reads), a 1x1 and explicit uneven padding.
CASES = [
    ((5, 9, 9, 3), (3, 3, 3, 4), (1, 1), "SAME"),
    ((5, 11, 7, 2), (3, 3, 2, 3), (2, 2), "SAME"),
    ((3, 22, 22, 4), (8, 8, 4, 5), (4, 4), "VALID"),
    ((4, 9, 9, 3), (4, 4, 3, 2), (2, 2), "VALID"),
    ((2, 5, 6, 3), (1, 1, 3, 4), (1, 1), "SAME"),
    ((3, 6, 5, 2), (2, 3, 2, 2), (1, 2), ((2, 0), (1, 3))),
]


def _case(shape, kernel_shape, strides, padding, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    w = jnp.asarray(rng.normal(size=kernel_shape).astype(np.float32))
    pads = (lax.padtype_to_pads(shape[1:3], kernel_shape[:2], strides, padding)
            if isinstance(padding, str) else padding)
    pads = tuple(tuple(p) for p in pads)
    y = lax.conv_general_dilated(x, w, strides, pads, dimension_numbers=_NHWC)
    g = jnp.asarray(rng.normal(size=y.shape).astype(np.float32))
    return x, w, g, pads


def _assert_close_to_hand(got, expected):
    # float32 products summed (at most 5 x 11 x 11 x 9 terms here) against a float64 sum.
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=0,
                               atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("shape,kernel_shape,strides,padding", CASES)
@pytest.mark.parametrize("chunk_bytes", [1, layers.CHUNK_BYTES])
def test_im2col_kernel_gradient_equals_the_defining_sum(shape, kernel_shape, strides, padding,
                                                        chunk_bytes):
    # chunk_bytes=1: one sample per chunk (a scan over the whole batch); the default: one chunk.
    x, _, g, pads = _case(shape, kernel_shape, strides, padding)
    got = jax.jit(lambda x, g: layers.kernel_grad_im2col(
        x, g, kernel_shape[:2], strides, pads, chunk_bytes=chunk_bytes))(x, g)
    _assert_close_to_hand(got, _kernel_grad_by_hand(x, g, kernel_shape[:2], strides, pads))


def test_im2col_chunks_that_do_not_divide_the_batch_pad_with_zero_samples():
    x, _, g, pads = _case((7, 6, 6, 2), (3, 3, 2, 3), (1, 1), "SAME")
    per_sample = 6 * 6 * 9 * 2 * 4  # bytes of patches per sample
    got = layers.kernel_grad_im2col(x, g, (3, 3), (1, 1), pads, chunk_bytes=3 * per_sample)
    # 7 samples in chunks of at most 3: three chunks of 3, the last with two zero samples.
    _assert_close_to_hand(got, _kernel_grad_by_hand(x, g, (3, 3), (1, 1), pads))


@pytest.mark.parametrize("shape,kernel_shape,strides,padding", CASES[:3])
def test_xla_kernel_gradient_for_other_backends_equals_the_defining_sum(shape, kernel_shape,
                                                                        strides, padding):
    x, w, g, pads = _case(shape, kernel_shape, strides, padding)
    got = jax.jit(lambda x, w, g: layers.kernel_grad_xla(x, w, g, strides, pads))(x, w, g)
    _assert_close_to_hand(got, _kernel_grad_by_hand(x, g, kernel_shape[:2], strides, pads))


@pytest.mark.parametrize("shape,kernel_shape,strides,padding", CASES)
def test_conv_general_dilated_value_and_gradients(shape, kernel_shape, strides, padding):
    x, w, g, pads = _case(shape, kernel_shape, strides, padding)

    def run(conv):
        y, vjp = jax.vjp(lambda x, w: conv(x, w, strides, padding, dimension_numbers=_NHWC),
                         x, w)
        return (y, *vjp(g))

    y, dx, dw = jax.jit(lambda: run(layers.conv_general_dilated))()
    y_ref, dx_ref, _ = jax.jit(lambda: run(lax.conv_general_dilated))()
    # The value and the input gradient are XLA's own ops, in another compiled program.
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-6, atol=1e-6)
    _assert_close_to_hand(dw, _kernel_grad_by_hand(x, g, kernel_shape[:2], strides, pads))


def test_on_cpu_the_kernel_gradient_is_not_a_convolution():
    # What makes it fast: the compiled CPU program of value and kernel gradient holds one
    # convolution (the forward pass); with XLA's transpose it holds two.
    x, w, g, _ = _case((4, 12, 12, 3), (3, 3, 3, 4), (1, 1), "SAME")

    def count(conv):
        fn = jax.jit(jax.value_and_grad(
            lambda w, x, g: jnp.sum(conv(x, w, (1, 1), "SAME", dimension_numbers=_NHWC) * g)))
        return fn.lower(w, x, g).compile().as_text().count(" convolution(")

    assert jax.default_backend() == "cpu"
    assert count(lax.conv_general_dilated) == 2
    assert count(layers.conv_general_dilated) == 1


def test_dilated_and_grouped_convolutions_are_passed_to_lax_unchanged():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(2, 9, 9, 4)).astype(np.float32))
    w = jnp.asarray(rng.normal(size=(3, 3, 2, 6)).astype(np.float32))  # 2 groups of 2 inputs
    for kwargs in ({"feature_group_count": 2}, {"rhs_dilation": (2, 2),
                                                "feature_group_count": 2}):
        def loss(conv, w, kwargs=kwargs):
            return jnp.sum(conv(x, w, (1, 1), "SAME", dimension_numbers=_NHWC, **kwargs) ** 2)
        got = jax.jit(jax.grad(lambda w: loss(layers.conv_general_dilated, w)))(w)
        expected = jax.jit(jax.grad(lambda w: loss(lax.conv_general_dilated, w)))(w)
        np.testing.assert_array_equal(got, expected)


def test_conv_module_is_flax_conv_with_the_same_parameters_and_values():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 10, 10, 3)).astype(np.float32))
    ours, theirs = layers.Conv(5, (3, 3), strides=(2, 2)), nn.Conv(5, (3, 3), strides=(2, 2))
    params = ours.init(jax.random.PRNGKey(3), x)
    reference = theirs.init(jax.random.PRNGKey(3), x)
    assert isinstance(ours, nn.Conv)
    jax.tree.map(np.testing.assert_array_equal, params, reference)
    np.testing.assert_allclose(ours.apply(params, x), theirs.apply(params, x), rtol=1e-6,
                               atol=1e-6)

    # The dimension numbers flax passes take the im2col path, not the fallback to lax.
    def convolutions(module):
        fn = jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(module.apply(p, x) ** 2)))
        return fn.lower(params, x).compile().as_text().count(" convolution(")

    assert convolutions(theirs) == 2 and convolutions(ours) == 1


def test_kernel_gradient_under_vmap_equals_each_run_alone():
    # Anakin's sweeps vmap whole learner steps over runs.
    rng = np.random.default_rng(4)
    xs = jnp.asarray(rng.normal(size=(3, 4, 8, 8, 2)).astype(np.float32))
    ws = jnp.asarray(rng.normal(size=(3, 3, 3, 2, 3)).astype(np.float32))

    def grad(x, w):
        return jax.grad(lambda w: jnp.sum(jnp.sin(layers.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=_NHWC))))(w)

    batched = jax.jit(jax.vmap(grad))(xs, ws)
    for i in range(3):
        np.testing.assert_allclose(batched[i], jax.jit(grad)(xs[i], ws[i]), rtol=1e-5,
                                   atol=1e-5 * float(jnp.abs(batched[i]).max()))


# ---------------------------------------------------------------------------------------------
# MAX-POOLING: the same value and gradient as flax's `nn.max_pool`, bit for bit, including where
# a window holds several equal maxima (small integer inputs make those common, as flat regions
# of Atari frames do).


def _reference_pool(x):
    return nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")


@pytest.mark.parametrize("shape", [(2, 84, 84, 3), (2, 21, 21, 2), (1, 7, 8, 1), (1, 2, 5, 1),
                                   (1, 1, 1, 1)])
@pytest.mark.parametrize("levels", [3, 100_000])
def test_max_pool_value_and_gradient_equal_flax_bit_for_bit(shape, levels):
    rng = np.random.default_rng(sum(shape) + levels)
    x = jnp.asarray(rng.integers(0, levels, shape).astype(np.float32))
    cotangent = jnp.asarray(rng.normal(size=_reference_pool(x).shape).astype(np.float32))

    expected, expected_vjp = jax.vjp(_reference_pool, x)
    got, got_vjp = jax.vjp(layers.max_pool_3x3_stride_2, x)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(jax.jit(got_vjp)(cotangent)[0],
                                  jax.jit(expected_vjp)(cotangent)[0])


def test_batch_stat_norm_is_flax_batch_norm_in_training_mode():
    # flax's BatchNorm with batch statistics (use_running_average=False) is the reference; ours
    # keeps no running averages. Also by hand: zero mean, unit (biased) variance per feature.
    from agents.layers import BatchStatNorm

    x = jax.random.normal(jax.random.PRNGKey(0), (16, 5)) * 3.0 + 2.0
    ours = BatchStatNorm()
    params = ours.init(jax.random.PRNGKey(1), x)
    assert "batch_stats" not in params
    y = np.asarray(ours.apply(params, x))
    reference = nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5)
    variables = reference.init(jax.random.PRNGKey(1), x)
    expected, _ = reference.apply(variables, x, mutable=["batch_stats"])
    np.testing.assert_allclose(y, np.asarray(expected), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.var(0), 1.0, rtol=1e-3)
