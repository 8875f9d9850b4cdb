"""Actor-critic networks for the V-trace agent: torsos and policy/value heads (flax linen).

`make_network(config, env_spec)` picks the torso: `"mlp"` flattens vector or small board
observations; `"conv"` is the small Atari convolutional torso (DQN-style);
`"resnet"` is the IMPALA deep residual torso; `"auto"` is `"conv"` for observations of rank 3
and `"mlp"` otherwise. Image observations stored as uint8 are scaled to [0, 1] here, so
buffers and device transfers keep their native dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from podracer.types import Array, EnvSpec


def _as_float(x: Array) -> Array:
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


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
    pass (docs/benchmarks.md, Sebulba). Here the gradient is elementwise work on the four stride-2 phases
    of the padded input. Each window sends its gradient to its first maximal element in
    row-major order (as select-and-scatter with `>=` does, so ties go where XLA sends them),
    and an element in several windows sums their gradients in the windows' row-major order.
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


class MLPTorso(nn.Module):
    """Flattens all but the leading batch axis, then dense layers with ReLU."""

    hidden_sizes: Sequence[int] = (64, 64)

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = _as_float(x).reshape(x.shape[0], -1)
        for size in self.hidden_sizes:
            x = nn.relu(nn.Dense(size)(x))
        return x


class ConvTorso(nn.Module):
    """The DQN/IMPALA-shallow convolutional torso for [B, H, W, C] images."""

    channels: Sequence[int] = (32, 64, 64)
    kernels: Sequence[int] = (8, 4, 3)
    strides: Sequence[int] = (4, 2, 1)
    hidden_size: int = 512

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = _as_float(x)
        for c, k, s in zip(self.channels, self.kernels, self.strides):
            x = nn.relu(nn.Conv(c, (k, k), strides=(s, s), padding="VALID")(x))
        x = x.reshape(x.shape[0], -1)
        return nn.relu(nn.Dense(self.hidden_size)(x))


class _ResidualBlock(nn.Module):
    channels: int

    @nn.compact
    def __call__(self, x: Array) -> Array:
        y = nn.Conv(self.channels, (3, 3))(nn.relu(x))
        y = nn.Conv(self.channels, (3, 3))(nn.relu(y))
        return x + y


class ResNetTorso(nn.Module):
    """The IMPALA deep torso (Espeholt et al., 2018): 3 stages of conv, max-pool, 2 res blocks."""

    channels: Sequence[int] = (16, 32, 32)
    hidden_size: int = 256

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = _as_float(x)
        for c in self.channels:
            x = nn.Conv(c, (3, 3))(x)
            x = max_pool_3x3_stride_2(x)
            x = _ResidualBlock(c)(x)
            x = _ResidualBlock(c)(x)
        x = nn.relu(x).reshape(x.shape[0], -1)
        return nn.relu(nn.Dense(self.hidden_size)(x))


class ActorCritic(nn.Module):
    """Torso, then a linear policy head (logits) and a linear value head."""

    torso: nn.Module
    num_actions: int

    @nn.compact
    def __call__(self, observation: Array) -> tuple[Array, Array]:
        h = self.torso(observation)
        logits = nn.Dense(self.num_actions, name="policy")(h)
        value = nn.Dense(1, name="value")(h)[..., 0]
        return logits, value


TORSOS = ("auto", "mlp", "conv", "resnet")


def make_network(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> ActorCritic:
    torso_name = config.torso
    if torso_name == "auto":
        torso_name = "conv" if len(env_spec.observation.shape) == 3 else "mlp"
    if torso_name == "mlp":
        torso = MLPTorso(tuple(config.hidden_sizes))
    elif torso_name == "conv":
        torso = ConvTorso()
    elif torso_name == "resnet":
        torso = ResNetTorso()
    else:
        raise ValueError(f"agent.torso={config.torso!r}: use one of {TORSOS}.")
    return ActorCritic(torso=torso, num_actions=env_spec.action.num_values)
