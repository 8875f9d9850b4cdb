"""MuZero's three networks (Schrittwieser et al., 2020): representation h, dynamics g and
prediction f, with categorical reward and value heads.

Three variants: an MLP for vector observations, the same MLP after one 3 x 3 convolution for
small boards, and a residual conv net with downsampling for images; `network="auto"` picks the
residual net for images of at least 36 x 36 pixels, the convolution and MLP for smaller
[H, W, C] boards, and the MLP otherwise (`resolve_network`). Latent states are min-max normalised
to [0, 1] per example, as in MuZero, so the dynamics' inputs keep one scale however deep the
unroll goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from agents.layers import Conv
from podracer.config import ConfigError
from podracer.types import Array, EnvSpec


def _as_float(x: Array) -> Array:
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


def extreme_tangent(x: Array, extreme: Array, dx: Array) -> Array:
    """[B, 1] the tangent of each row's minimum or maximum `extreme` ([B, 1]) of `x` ([B, N])
    along `dx`: the mean of `dx` over the entries equal to it (JAX's own rule), and 0 where
    no entry is equal to it.

    JAX's rule divides by that count unguarded. XLA may compute `x` for the comparison in
    another fusion than the one that took the extreme, with other rounding; then no entry
    matches, and 0 / 0 makes the whole gradient NaN. A MuZero Catch run on CPU at XLA's
    `--xla_backend_optimization_level=0` went NaN at its third learner update that way, and
    JAX users report the same failure of `max`'s gradient on GPU."""
    at = (x == extreme).astype(dx.dtype)
    return jnp.sum(dx * at, axis=1, keepdims=True) / jnp.maximum(
        jnp.sum(at, axis=1, keepdims=True), 1.0)


@jax.custom_jvp
def _row_extremes(x: Array) -> tuple[Array, Array]:
    """([B, 1], [B, 1]) each row's minimum and maximum, with `extreme_tangent`'s gradient."""
    return x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)


@_row_extremes.defjvp
def _row_extremes_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    low, high = _row_extremes(x)
    return (low, high), (extreme_tangent(x, low, dx), extreme_tangent(x, high, dx))


def normalise_latent(x: Array) -> Array:
    """Scales each example's latent to [0, 1] (MuZero appendix G): (x - min) / max(max - min,
    1e-5) per example, with JAX's gradient, except that the gradient of the minimum and
    maximum is guarded against a count of 0 (`extreme_tangent`) and the floor is a `where`
    (the gradient of `jnp.maximum` also tests its operands for equality with the result)."""
    flat = x.reshape(x.shape[0], -1)
    low, high = _row_extremes(flat)
    spread = high - low
    spread = jnp.where(spread > 1e-5, spread, 1e-5)
    per_example = (x.shape[0],) + (1,) * (x.ndim - 1)
    return (x - low.reshape(per_example)) / spread.reshape(per_example)


class MLP(nn.Module):
    sizes: Sequence[int]

    @nn.compact
    def __call__(self, x: Array) -> Array:
        for size in self.sizes:
            x = nn.relu(nn.LayerNorm()(nn.Dense(size)(x)))
        return x


class _ResBlock(nn.Module):
    channels: int

    @nn.compact
    def __call__(self, x: Array) -> Array:
        y = nn.relu(nn.LayerNorm()(Conv(self.channels, (3, 3))(x)))
        y = nn.LayerNorm()(Conv(self.channels, (3, 3))(y))
        return nn.relu(x + y)


# The kinds whose latent is a vector, built by an MLP (the others' are [H, W, C] feature maps).
VECTOR_LATENT = ("mlp", "conv_mlp")
KINDS = ("mlp", "conv_mlp", "resnet", "ez_resnet")


class MuZeroNetwork(nn.Module):
    """`h(obs) -> latent`, `g(latent, action) -> (reward_logits, latent')` and
    `f(latent) -> (policy_logits, value_logits)`; call the methods through `apply(...,
    method=...)`. `__call__` runs all three once, for `init`."""

    num_actions: int
    num_bins: int  # bins of the categorical reward and value supports
    # "mlp" | "conv_mlp" (one 3x3 convolution, then the MLP) | "resnet" | "ez_resnet"
    # (EfficientZero's Atari down-sampling)
    kind: str = "mlp"
    latent_size: int = 64  # MLP latent width
    hidden_sizes: Sequence[int] = (64,)
    channels: int = 32  # conv latent channels
    num_blocks: int = 2  # residual blocks in each of h, g and f
    # A logistic head on g's next latent: the probability that the step ended the episode
    # (`terminal_logit`); False: none (MuZero's model, which does not predict ends).
    terminal_head: bool = False
    # The share of the terminal head's gradient that reaches h and g through the latent it
    # reads: 1 all of it; 0 none (a readout of a stop-gradient latent, leaving h and g to the
    # other losses); between, that fraction (the head itself is trained in full).
    terminal_head_gradient: float = 1.0

    def setup(self):
        if self.kind in VECTOR_LATENT:
            if self.kind == "conv_mlp":
                self.repr_conv = Conv(self.channels, (3, 3))
            self.repr_net = MLP((*self.hidden_sizes, self.latent_size))
            self.dyn_net = MLP((*self.hidden_sizes, self.latent_size))
        else:
            if self.kind == "ez_resnet":
                # EfficientZero's Atari down-sampling (Ye et al., 2021, appendix A.1): a
                # stride-2 conv to C/2 channels and a residual block, a stride-2 conv to C and a
                # residual block, then 3x3 average pooling with stride 2 twice, a residual
                # block between them: 96x96 -> 6x6.
                self.repr_down = [Conv(self.channels // 2, (3, 3), strides=(2, 2)),
                                  Conv(self.channels, (3, 3), strides=(2, 2))]
                self.down_blocks = [_ResBlock(self.channels // 2), _ResBlock(self.channels),
                                    _ResBlock(self.channels)]
            else:
                self.repr_down = [Conv(self.channels, (3, 3), strides=(2, 2)),
                                  Conv(self.channels, (3, 3), strides=(2, 2))]
            self.repr_blocks = [_ResBlock(self.channels) for _ in range(self.num_blocks)]
            self.dyn_in = Conv(self.channels, (3, 3))
            self.dyn_blocks = [_ResBlock(self.channels) for _ in range(self.num_blocks)]
            self.pred_blocks = [_ResBlock(self.channels) for _ in range(self.num_blocks)]
        self.reward_head = Head(self.num_bins, self.hidden_sizes)
        self.policy_head = Head(self.num_actions, self.hidden_sizes)
        self.value_head = Head(self.num_bins, self.hidden_sizes)
        if self.terminal_head:
            # Starts at P(end) = sigmoid(-4.6), about 0.01, so a fresh model plans as before.
            self.end_head = Head(1, self.hidden_sizes, bias=TERMINAL_BIAS)

    def represent(self, observation: Array) -> Array:
        x = _as_float(observation)
        if self.kind == "conv_mlp":
            x = nn.relu(self.repr_conv(x))
        if self.kind in VECTOR_LATENT:
            return normalise_latent(self.repr_net(x.reshape(x.shape[0], -1)))
        if self.kind == "ez_resnet":
            x = self.down_blocks[0](nn.relu(self.repr_down[0](x)))
            x = self.down_blocks[1](nn.relu(self.repr_down[1](x)))
            x = nn.avg_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            x = self.down_blocks[2](x)
            x = nn.avg_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        else:
            for conv in self.repr_down:
                x = nn.relu(conv(x))
        for block in self.repr_blocks:
            x = block(x)
        return normalise_latent(x)

    def dynamics(self, latent: Array, action: Array) -> tuple[Array, Array]:
        return self.dynamics_from(latent, jax.nn.one_hot(action, self.num_actions))

    def dynamics_from(self, latent: Array, inputs: Array) -> tuple[Array, Array]:
        """g on `inputs` ([B, N] floats) in place of the one-hot action: `dynamics(latent,
        a)` is `dynamics_from(latent, one_hot(a))` (Stochastic MuZero feeds a chance code)."""
        if self.kind in VECTOR_LATENT:
            x = self.dyn_net(jnp.concatenate([latent, inputs], axis=-1))
        else:
            planes = jnp.broadcast_to(inputs[:, None, None, :],
                                      latent.shape[:3] + inputs.shape[-1:])
            x = nn.relu(self.dyn_in(jnp.concatenate([latent, planes], axis=-1)))
            for block in self.dyn_blocks:
                x = block(x)
        reward_logits = self.reward_head(x.reshape(x.shape[0], -1))
        return reward_logits, normalise_latent(x)

    def terminal_logit(self, latent: Array) -> Array:
        """[B] the logit of P(the step into `latent`, a dynamics output, ended the episode)."""
        latent = scale_gradient(latent, self.terminal_head_gradient)
        return self.end_head(latent.reshape(latent.shape[0], -1))[:, 0]

    def predict(self, latent: Array) -> tuple[Array, Array]:
        x = latent
        if self.kind not in VECTOR_LATENT:
            for block in self.pred_blocks:
                x = block(x)
        x = x.reshape(x.shape[0], -1)
        return self.policy_head(x), self.value_head(x)

    def __call__(self, observation: Array, action: Array):
        latent = self.represent(observation)
        reward_logits, next_latent = self.dynamics(latent, action)
        if self.terminal_head:
            self.terminal_logit(next_latent)
        return self.predict(next_latent), reward_logits


class Head(nn.Module):
    outputs: int
    hidden_sizes: Sequence[int]
    bias: float = 0.0  # the output's initial bias

    @nn.compact
    def __call__(self, x: Array) -> Array:
        for size in self.hidden_sizes:
            x = nn.relu(nn.Dense(size)(x))
        # Zero-initialised output: uniform priors and a value/reward distribution centred on
        # bin 0 at the start, as in the MuZero pseudocode's zero-initialised heads.
        return nn.Dense(self.outputs, kernel_init=nn.initializers.zeros,
                        bias_init=nn.initializers.constant(self.bias))(x)


TERMINAL_BIAS = -4.6  # the terminal head's initial logit


def scale_gradient(x: Array, scale: float) -> Array:
    """`x` unchanged forwards; its gradient multiplied by `scale` backwards (the MuZero
    pseudocode's scale_gradient, written so that the forward value is exactly `x`)."""
    if scale == 1:
        return x
    if scale == 0:
        return jax.lax.stop_gradient(x)
    return jax.lax.stop_gradient(x) + scale * (x - jax.lax.stop_gradient(x))


# "auto" picks the residual network for images with sides of at least this many pixels (Atari's
# 84 x 84 and 96 x 96 frames); "conv_mlp" for smaller [H, W, C] boards (MinAtar's 10 x 10,
# which the two stride-2 convolutions would leave at 3 x 3), whose one 3 x 3 convolution lets
# the model learn local events such as Asterix's rewards (docs/results.md#muzero-defaults); the
# MLP for vectors and boards without channels (Catch's 10 x 5). The same threshold as the
# actor-critic agents' "auto" torso (`agents.vtrace.networks.conv_min_size()`).
MIN_RESNET_SIDE = 36


def resolve_network(name: str, env_spec: EnvSpec) -> str:
    """`agent.network` with "auto" resolved for `env_spec`'s observations."""
    if name != "auto":
        return name
    shape = tuple(env_spec.observation.shape)
    if len(shape) != 3:
        return "mlp"
    return "resnet" if min(shape[:2]) >= MIN_RESNET_SIDE else "conv_mlp"


# The MLP widths when `agent.hidden_sizes` and `agent.latent_size` are None: 128 for boards the
# MLP reads flattened (MinAtar's 10 x 10 x C; with "conv_mlp", after its convolution), 64 for
# everything else (vectors, and the heads of the resnet). On MinAtar 128 learns more than 64 in
# the same wall time, and 256 runs much slower (docs/results.md#muzero-defaults).
BOARD_WIDTH = 128
DEFAULT_WIDTH = 64


def support_bins(config: ml_collections.ConfigDict) -> int:
    """Bins of the value and reward supports: `config.support_bins`, or 2S + 1 when None."""
    bins = config.get("support_bins")
    return 2 * config.support_size + 1 if bins is None else int(bins)


def mlp_widths(config: ml_collections.ConfigDict, env_spec: EnvSpec
               ) -> tuple[tuple[int, ...], int]:
    """(hidden_sizes, latent_size): the config's where set, else the default for `env_spec`'s
    observations (above)."""
    board = (resolve_network(config.network, env_spec) in VECTOR_LATENT
             and len(env_spec.observation.shape) == 3)
    width = BOARD_WIDTH if board else DEFAULT_WIDTH
    hidden = ((width,) if config.hidden_sizes is None
              else tuple(int(size) for size in config.hidden_sizes))
    return hidden, width if config.latent_size is None else int(config.latent_size)


def chosen_fields(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> dict[str, Any]:
    """What `network="auto"` and widths left None became for `env_spec`. The latent width is
    reported only for the networks with a vector latent (the residual networks' latent is
    `channels` planes)."""
    kind = resolve_network(config.network, env_spec)
    hidden_sizes, latent_size = mlp_widths(config, env_spec)
    chosen: dict[str, Any] = {"network": kind}
    if config.hidden_sizes is None:
        chosen["hidden_sizes"] = list(hidden_sizes)
    if config.latent_size is None and kind in VECTOR_LATENT:
        chosen["latent_size"] = latent_size
    return chosen


def make_network(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> MuZeroNetwork:
    kind = resolve_network(config.network, env_spec)
    if kind not in KINDS:
        raise ValueError(f"agent.network={config.network!r}: use 'auto', 'mlp', 'conv_mlp', "
                         "'resnet' or 'ez_resnet'.")
    shape = tuple(env_spec.observation.shape)
    if kind != "mlp" and len(shape) != 3:
        raise ConfigError("agent.network", f"is {kind!r}, whose convolutions read images "
                          f"[H, W, C], but the observations are {shape}",
                          "use 'mlp' (or 'auto') for these observations")
    hidden_sizes, latent_size = mlp_widths(config, env_spec)
    return MuZeroNetwork(
        num_actions=env_spec.action.num_values,
        num_bins=support_bins(config),
        kind=kind,
        latent_size=latent_size,
        hidden_sizes=hidden_sizes,
        channels=config.channels,
        num_blocks=config.num_blocks,
        terminal_head=bool(config.get("terminal_head", False)),
        terminal_head_gradient=float(config.get("terminal_head_gradient", 1.0)),
    )
