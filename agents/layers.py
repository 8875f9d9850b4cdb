"""Network layers shared by the agents: for the ops whose gradients XLA:CPU computes slowly,
the same maths with the gradient computed another way (`Conv`, `max_pool_3x3_stride_2`), and
`BatchStatNorm`, batch normalisation with the batch's own statistics.

`Conv` is flax's `nn.Conv` (same parameters, same initialisers, same forward pass) whose
kernel gradient on the CPU backend is an im2col matrix product instead of XLA's
convolution transpose. On CPU, XLA lowers the kernel gradient of an NHWC convolution to a
convolution whose contracting dimension is batch x height x width; it runs it on about one
core at a small fraction of the forward pass's FLOP rate: for the IMPALA ResNet on Pong
(640 frames of 84 x 84) the kernel gradients take most of the forward and backward pass
(docs/benchmarks.md, "Convolutions' kernel gradient"). Here the batch is cut into chunks of
at most `CHUNK_BYTES` of im2col patches, and each chunk's patches [n, H', W', kh*kw*C_in]
are contracted with the output gradient [n, H', W', C_out] by one matrix product,
accumulated over the chunks in a `lax.scan`. Other backends (GPU, TPU) keep XLA's own
transpose (the replacement was measured on CPU only), chosen at lowering time by
`lax.platform_dependent`; both branches are tested on CPU.

The input gradient is XLA's own in every case. Sums run in another order than XLA's, so the
kernel gradient agrees with XLA's to float32 rounding (a relative 1e-5 on 10^6 summands),
not bit for bit.

`max_pool_3x3_stride_2` is `nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")` with the
same gradient, bit for bit, computed without XLA's select-and-scatter.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from podracer.types import Array

# Bytes of im2col patches per chunk of the batch in the CPU kernel gradient. The time is about
# flat in the chunk size from 2 to 16 MiB, so a chunk need not fit a core's cache
# (docs/benchmarks.md, "Convolutions' kernel gradient").
CHUNK_BYTES = 4 << 20

_NHWC = ("NHWC", "HWIO", "NHWC")


def _is_nhwc(dimension_numbers) -> bool:
    if dimension_numbers is None:
        return False
    if isinstance(dimension_numbers, lax.ConvDimensionNumbers):
        return dimension_numbers == lax.conv_dimension_numbers(
            (1, 1, 1, 1), (1, 1, 1, 1), _NHWC)
    return tuple(dimension_numbers) == _NHWC


def _patches(x: Array, kernel: tuple[int, int], strides: tuple[int, int],
             out_hw: tuple[int, int]) -> Array:
    """[n, H', W', kh*kw*C]: for each output position, its receptive field in (kh, kw, C)
    order, the order of an HWIO kernel's leading axes. `x` is already padded."""
    (kh, kw), (sh, sw), (oh, ow) = kernel, strides, out_hw
    n, _, _, c = x.shape
    return jnp.concatenate([
        lax.slice(x, (0, i, j, 0), (n, i + sh * (oh - 1) + 1, j + sw * (ow - 1) + 1, c),
                  (1, sh, sw, 1))
        for i in range(kh) for j in range(kw)], axis=-1)


def kernel_grad_im2col(x: Array, g: Array, kernel: tuple[int, int], strides: tuple[int, int],
                       pads: Sequence[tuple[int, int]], *,
                       chunk_bytes: int = CHUNK_BYTES) -> Array:
    """dL/dw [kh, kw, C_in, C_out] of an NHWC convolution y = conv(x, w) from g = dL/dy:
    dw[i, j, c, d] = sum_{n, p, q} xpad[n, s_h p + i, s_w q + j, c] g[n, p, q, d].

    The batch is cut into equal chunks of at most `chunk_bytes` of patches (zero samples pad
    the last, which add exact zeros), summed in a scan."""
    n = x.shape[0]
    oh, ow, cout = g.shape[1:]
    cin = x.shape[-1]
    x = jnp.pad(x, ((0, 0), tuple(pads[0]), tuple(pads[1]), (0, 0)))
    per_sample = oh * ow * kernel[0] * kernel[1] * cin * x.dtype.itemsize
    num = -(-n // max(1, min(n, chunk_bytes // per_sample)))
    chunk = -(-n // num)
    if num * chunk > n:
        x = jnp.pad(x, ((0, num * chunk - n), (0, 0), (0, 0), (0, 0)))
        g = jnp.pad(g, ((0, num * chunk - n), (0, 0), (0, 0), (0, 0)))
    xs = x.reshape((num, chunk) + x.shape[1:])
    gs = g.reshape((num, chunk) + g.shape[1:])

    def add_chunk(acc, xg):
        cols = _patches(xg[0], kernel, strides, (oh, ow))
        # As 2-D operands: [k, rows] x [rows, C_out] (for 4 and 16 input channels 1.3-1.5x
        # faster on CPU than the same contraction written over the 4-D shapes).
        cols, g_rows = cols.reshape(-1, cols.shape[-1]), xg[1].reshape(-1, cout)
        return acc + jnp.dot(cols.T, g_rows, precision=lax.Precision.HIGHEST), None

    acc = jnp.zeros((kernel[0] * kernel[1] * cin, cout), jnp.result_type(x, g))
    acc, _ = lax.scan(add_chunk, acc, (xs, gs))
    return acc.reshape(kernel[0], kernel[1], cin, cout)


def _reference_conv(x: Array, w: Array, strides, pads) -> Array:
    return lax.conv_general_dilated(x, w, strides, pads, dimension_numbers=_NHWC)


def kernel_grad_xla(x: Array, w: Array, g: Array, strides: tuple[int, int],
                    pads: Sequence[tuple[int, int]]) -> Array:
    """XLA's own kernel gradient (the transpose JAX derives for `lax.conv_general_dilated`)."""
    _, vjp = jax.vjp(lambda w_: _reference_conv(x, w_, strides, pads), w)
    return vjp(g)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv2d(x: Array, w: Array, strides: tuple[int, int],
           pads: tuple[tuple[int, int], tuple[int, int]]) -> Array:
    """`lax.conv_general_dilated(x, w, strides, pads)` in NHWC/HWIO layout, whose kernel
    gradient on CPU is `kernel_grad_im2col` (XLA's elsewhere)."""
    return _reference_conv(x, w, strides, pads)


def _conv2d_fwd(x, w, strides, pads):
    return _reference_conv(x, w, strides, pads), (x, w)


def _conv2d_bwd(strides, pads, residuals, g):
    x, w = residuals
    _, vjp_x = jax.vjp(lambda x_: _reference_conv(x_, w, strides, pads), x)
    (dx,) = vjp_x(g)
    dw = lax.platform_dependent(
        x, w, g,
        cpu=lambda x, w, g: kernel_grad_im2col(x, g, w.shape[:2], strides, pads),
        default=lambda x, w, g: kernel_grad_xla(x, w, g, strides, pads))
    return dx, dw.astype(w.dtype)


conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)


def conv_general_dilated(lhs: Array, rhs: Array, window_strides: Sequence[int],
                         padding: str | Sequence[tuple[int, int]], lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
                         precision=None, **kwargs) -> Array:
    """A drop-in for `lax.conv_general_dilated` (as flax's `nn.Conv` calls it): 2-D NHWC
    convolutions without dilation or feature groups go through `conv2d`; anything else is
    passed to `lax.conv_general_dilated` unchanged."""
    plain = (lhs.ndim == 4 and _is_nhwc(dimension_numbers) and feature_group_count == 1
             and not kwargs and precision is None
             and all(d == 1 for d in (lhs_dilation or (1, 1)))
             and all(d == 1 for d in (rhs_dilation or (1, 1))))
    if plain:
        strides = tuple(int(s) for s in window_strides)
        if isinstance(padding, str):
            pads = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], strides, padding)
        else:
            pads = padding
        pads = tuple((int(lo), int(hi)) for lo, hi in pads)
        if all(p >= 0 for pair in pads for p in pair):
            return conv2d(lhs, rhs, strides, pads)
    return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation,
                                    rhs_dilation, dimension_numbers, feature_group_count,
                                    precision=precision, **kwargs)


# flax's `nn.Conv` (its class, fields, parameter names and initialisers) with the kernel
# gradient above: a drop-in, so checkpoints and parameter trees do not change.
Conv = functools.partial(nn.Conv, conv_general_dilated=conv_general_dilated)


# ---------------------------------------------------------------------------------------------
# MAX-POOLING


def _same_padding(size: int) -> tuple[int, int]:
    """(output size, low padding) of a 3-wide, stride-2 window under "SAME" padding."""
    out = -(-size // 2)
    return out, max(2 * (out - 1) + 3 - size, 0) // 2


def _reference_max_pool(x: Array) -> Array:
    return nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")


@jax.custom_vjp
def max_pool_3x3_stride_2(x: Array) -> Array:
    """`nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")` on [B, H, W, C], with the same
    gradient, bit for bit, computed without XLA's select-and-scatter.

    On CPU, XLA runs the select-and-scatter of max-pooling's gradient as a slow loop: for the
    IMPALA ResNet on 84 x 84 Atari frames, about a quarter of the learner's forward and backward
    pass (docs/benchmarks.md, "Convolutions' kernel gradient"). Here the gradient is
    elementwise work on the four stride-2 phases of the padded input. Each window sends its
    gradient to its first maximal element in row-major order (as select-and-scatter with `>=`
    does, so ties go where XLA sends them), and an element in several windows sums their
    gradients in the windows' row-major order.
    """
    return _reference_max_pool(x)


def _max_pool_fwd(x: Array) -> tuple[Array, tuple[Array, Array]]:
    y = _reference_max_pool(x)
    return y, (x, y)


def _max_pool_bwd(residuals: tuple[Array, Array], g: Array) -> tuple[Array]:
    x, y = residuals
    n, h, w, c = x.shape
    oh, lo_h = _same_padding(h)
    ow, lo_w = _same_padding(w)
    # Padded to 2(oh+1) x 2(ow+1), then split into stride-2 phases: [n, oh+1, 2, ow+1, 2, c].
    # Window (i, j) at offset (di, dj) reads phase (di % 2, dj % 2) at (i + di//2, j + dj//2).
    padded = jnp.pad(x, ((0, 0), (lo_h, 2 * (oh + 1) - h - lo_h),
                         (lo_w, 2 * (ow + 1) - w - lo_w), (0, 0)), constant_values=-jnp.inf)
    phased = padded.reshape(n, oh + 1, 2, ow + 1, 2, c)
    offsets = [(di, dj) for di in range(3) for dj in range(3)]  # row-major in the window
    taken = jnp.zeros(y.shape, bool)
    chosen = {}
    for di, dj in offsets:
        candidate = phased[:, di // 2:di // 2 + oh, di % 2, dj // 2:dj // 2 + ow, dj % 2, :]
        chosen[di, dj] = (candidate == y) & ~taken
        taken = taken | chosen[di, dj]
    # An element's windows in row-major order are its offsets in reverse order.
    phases: dict[tuple[int, int], Array] = {}
    for di, dj in reversed(offsets):
        shifted = jnp.pad(jnp.where(chosen[di, dj], g, jnp.zeros((), g.dtype)),
                          ((0, 0), (di // 2, 1 - di // 2), (dj // 2, 1 - dj // 2), (0, 0)))
        key = (di % 2, dj % 2)
        phases[key] = shifted if key not in phases else phases[key] + shifted
    rows = [jnp.stack([phases[a, 0], phases[a, 1]], axis=3) for a in (0, 1)]
    dx = jnp.stack(rows, axis=2).reshape(n, 2 * (oh + 1), 2 * (ow + 1), c)
    return (dx[:, lo_h:lo_h + h, lo_w:lo_w + w, :],)


max_pool_3x3_stride_2.defvjp(_max_pool_fwd, _max_pool_bwd)


class BatchStatNorm(nn.Module):
    """Batch normalisation in training mode, without running averages: each feature is
    normalised by the mean and (biased) variance over the leading batch axis of `x` [B, F],
    then scaled and shifted by learnt parameters (initialised to 1 and 0).

    This is what PyTorch's `BatchNorm1d` computes in `train()` mode, the mode in which
    EfficientZero's reference computes its consistency projections. Nothing is kept between
    calls: a layer whose outputs are only ever read during learning never needs the running
    averages an evaluation-mode network would use. Statistics are those of the batch the
    layer is given; a caller that wants statistics over a set of samples (per unroll step,
    per device) gives it exactly that set.
    """

    epsilon: float = 1e-5  # PyTorch's and flax's default

    @nn.compact
    def __call__(self, x: Array) -> Array:
        mean = jnp.mean(x, axis=0)
        variance = jnp.mean(jnp.square(x - mean), axis=0)
        y = (x - mean) * lax.rsqrt(variance + self.epsilon)
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (x.shape[-1],), jnp.float32)
        return y * scale + bias
