"""Actor-critic networks for the V-trace agent: torsos and policy/value heads (flax linen).

`make_network(config, env_spec)` picks the torso: `"mlp"` flattens vector or small board
observations; `"conv"` is the small Atari convolutional torso (DQN-style);
`"resnet"` is the IMPALA deep residual torso; `"auto"` is `"conv"` for images (observations of
rank 3) at least as large as the conv torso's receptive field (36 x 36: Atari's 84 x 84 frames)
and `"mlp"` otherwise, so small boards such as MinAtar's 10 x 10 are read flattened. Image observations stored as uint8 are scaled to [0, 1] here, so
buffers and device transfers keep their native dtype. Convolutions and max-pooling are
`agents.layers`' (flax's, with gradients XLA:CPU computes faster).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from agents.actor_critic import VECTOR_HIDDEN_SIZES, mlp_hidden_sizes
from agents.layers import Conv, max_pool_3x3_stride_2
from podracer.config import ConfigError
from podracer.types import Array, EnvSpec


def _as_float(x: Array) -> Array:
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


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
            x = nn.relu(Conv(c, (k, k), strides=(s, s), padding="VALID")(x))
        x = x.reshape(x.shape[0], -1)
        return nn.relu(nn.Dense(self.hidden_size)(x))


class _ResidualBlock(nn.Module):
    channels: int

    @nn.compact
    def __call__(self, x: Array) -> Array:
        y = Conv(self.channels, (3, 3))(nn.relu(x))
        y = Conv(self.channels, (3, 3))(nn.relu(y))
        return x + y


class ResNetTorso(nn.Module):
    """The IMPALA deep torso (Espeholt et al., 2018): 3 stages of conv, max-pool, 2 res blocks."""

    channels: Sequence[int] = (16, 32, 32)
    hidden_size: int = 256

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = _as_float(x)
        for c in self.channels:
            x = Conv(c, (3, 3))(x)
            x = max_pool_3x3_stride_2(x)
            x = _ResidualBlock(c)(x)
            x = _ResidualBlock(c)(x)
        x = nn.relu(x).reshape(x.shape[0], -1)
        return nn.relu(nn.Dense(self.hidden_size)(x))


class ActorCritic(nn.Module):
    """Torso, then a linear policy head (logits, times `logit_scale`) and a linear value head.

    Under Adam every weight moves by about the step size whatever its gradient's size, so a
    policy head over n features moves its logits about n times the step size per update: a
    wide torso turns the policy greedy faster. `logit_scale` < 1 slows the logits alone."""

    torso: nn.Module
    num_actions: int
    logit_scale: float = 1.0

    @nn.compact
    def __call__(self, observation: Array) -> tuple[Array, Array]:
        h = self.torso(observation)
        logits = nn.Dense(self.num_actions, name="policy")(h)
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        value = nn.Dense(1, name="value")(h)[..., 0]
        return logits, value


TORSOS = ("auto", "mlp", "conv", "resnet")


def conv_min_size(torso: ConvTorso | None = None) -> int:
    """The smallest image side the conv torso maps to at least one feature (36 by default)."""
    torso = torso or ConvTorso()
    size = 1
    for k, s in reversed(list(zip(torso.kernels, torso.strides))):
        size = (size - 1) * s + k  # the smallest VALID input giving `size` outputs
    return size


def resolve_torso(name: str, env_spec: EnvSpec) -> str:
    """`agent.torso` with "auto" resolved for `env_spec`'s observations (module docstring).
    Raises a `ConfigError` for "conv" on images smaller than its receptive field."""
    shape = tuple(env_spec.observation.shape)
    is_image = len(shape) == 3
    large = is_image and min(shape[:2]) >= conv_min_size()
    if name == "auto":
        return "conv" if large else "mlp"
    if name == "conv" and not large:
        raise ConfigError("agent.torso", f"'conv' needs images of at least {conv_min_size()} x "
                          f"{conv_min_size()} x C, the observations are {shape}",
                          "use 'mlp' or 'resnet', or 'auto' to choose")
    return name


def logit_scale(config: ml_collections.ConfigDict, torso_name: str,
                hidden_sizes: tuple[int, ...]) -> float:
    """`agent.logit_scale` when set; else, for an MLP wider than 64, 64 / its last width (the
    64-wide head's pace under Adam: `ActorCritic`), and 1 for narrower MLPs and for the conv
    and residual torsos (as before the option existed)."""
    if config.logit_scale is not None:
        return float(config.logit_scale)
    if torso_name == "mlp" and hidden_sizes:
        return min(1.0, VECTOR_HIDDEN_SIZES[-1] / hidden_sizes[-1])
    return 1.0


def make_network(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> ActorCritic:
    torso_name = resolve_torso(config.torso, env_spec)
    hidden_sizes = mlp_hidden_sizes(config.hidden_sizes, env_spec)
    if torso_name == "mlp":
        torso = MLPTorso(hidden_sizes)
    elif torso_name == "conv":
        torso = ConvTorso()
    elif torso_name == "resnet":
        torso = ResNetTorso()
    else:
        raise ValueError(f"agent.torso={config.torso!r}: use one of {TORSOS}.")
    return ActorCritic(torso=torso, num_actions=env_spec.action.num_values,
                       logit_scale=logit_scale(config, torso_name, hidden_sizes))
