"""Sampled MuZero's networks: MuZero's h, g and f (`agents.muzero.networks`) with a Gaussian
policy head and dynamics that read a continuous action vector.

The policy is a diagonal Gaussian over pre-squash actions u in R^D; the action is tanh(u) in
(-1, 1)^D, scaled to the environment's bounds when acting. Log-probabilities are taken in
u-space: the tanh's Jacobian does not depend on the parameters (the policy loss's gradient is
the same in either space) and cancels in the search's ratio pi / beta.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from agents.muzero.networks import (
    KINDS,
    VECTOR_LATENT,
    MuZeroNetwork,
    mlp_widths,
    normalise_latent,
    resolve_network,
    support_bins,
)
from podracer.config import ConfigError
from podracer.types import Array, EnvSpec

LOG_2PI = math.log(2.0 * math.pi)


class SampledMuZeroNetwork(MuZeroNetwork):
    """MuZero's network whose f returns [B, 2D] Gaussian parameters (mean, raw log standard
    deviation; `gaussian`) as its "policy logits" and whose g(latent, action) takes actions
    [B, D] in [-1, 1]. `num_actions` is 2D, the policy head's width."""

    action_size: int = 1  # D

    def dynamics(self, latent: Array, action: Array) -> tuple[Array, Array]:
        action = action.astype(jnp.float32).reshape(latent.shape[0], self.action_size)
        if self.kind in VECTOR_LATENT:
            x = self.dyn_net(jnp.concatenate([latent, action], axis=-1))
        else:
            planes = jnp.broadcast_to(action[:, None, None, :],
                                      latent.shape[:3] + (self.action_size,))
            x = nn.relu(self.dyn_in(jnp.concatenate([latent, planes], axis=-1)))
            for block in self.dyn_blocks:
                x = block(x)
        reward_logits = self.reward_head(x.reshape(x.shape[0], -1))
        return reward_logits, normalise_latent(x)


def gaussian(policy_params: Array, *, log_std_min: float, log_std_max: float
             ) -> tuple[Array, Array]:
    """[..., 2D] f's policy output -> (mean [..., D], log_std [..., D]), the log standard
    deviation clipped to [log_std_min, log_std_max]."""
    d = policy_params.shape[-1] // 2
    return policy_params[..., :d], jnp.clip(policy_params[..., d:], log_std_min, log_std_max)


def log_prob(mean: Array, log_std: Array, u: Array) -> Array:
    """[...] log N(u; mean, exp(log_std)^2 I), summed over the last axis (D)."""
    z = (u - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * LOG_2PI, axis=-1)


def entropy(log_std: Array) -> Array:
    """[...] the Gaussian's differential entropy in u-space (nats), summed over D."""
    return jnp.sum(log_std + 0.5 * (LOG_2PI + 1.0), axis=-1)


def squash(u: Array) -> Array:
    """Pre-squash actions -> actions in (-1, 1): the input of g."""
    return jnp.tanh(u)


def to_env(unit: Array, low: Array, high: Array) -> Array:
    """Actions in [-1, 1] -> the environment's [low, high]."""
    return low + 0.5 * (unit + 1.0) * (high - low)


def from_env(action: Array, low: Array, high: Array) -> Array:
    """The environment's actions in [low, high] -> [-1, 1] (the inverse of `to_env`)."""
    return jnp.clip(2.0 * (action - low) / (high - low) - 1.0, -1.0, 1.0)


def action_bounds(env_spec: EnvSpec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(low, high) of the environment's continuous actions [D], each a tuple of D floats;
    `ConfigError` when they are not finite."""
    spec = env_spec.action
    d = int(spec.shape[0])
    try:
        low = tuple(float(x) for x in jnp.broadcast_to(jnp.asarray(spec.minimum, jnp.float32), (d,)))
        high = tuple(float(x) for x in jnp.broadcast_to(jnp.asarray(spec.maximum, jnp.float32), (d,)))
    except (TypeError, ValueError):
        low = high = ()
    if not low or not all(math.isfinite(a) and math.isfinite(b) and a < b
                          for a, b in zip(low, high, strict=True)):
        raise ConfigError("agent.name", f"needs finite action bounds, got minimum "
                          f"{spec.minimum!r} and maximum {spec.maximum!r}",
                          "wrap the environment so its action spec is bounded (its tanh-squashed "
                          "Gaussian is scaled to the bounds)")
    return low, high


def make_network(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> SampledMuZeroNetwork:
    """MuZero's `make_network` for actions [D]: the same kinds and widths."""
    kind = resolve_network(config.network, env_spec)
    if kind not in KINDS:
        raise ConfigError("agent.network", f"is {config.network!r}",
                          f"use 'auto' or one of {', '.join(KINDS)}")
    shape = tuple(env_spec.observation.shape)
    if kind != "mlp" and len(shape) != 3:
        raise ConfigError("agent.network", f"is {kind!r}, whose convolutions read images "
                          f"[H, W, C], but the observations are {shape}",
                          "use 'mlp' (or 'auto') for these observations")
    hidden_sizes, latent_size = mlp_widths(config, env_spec)
    d = int(env_spec.action.shape[0])
    return SampledMuZeroNetwork(
        num_actions=2 * d, action_size=d, num_bins=support_bins(config), kind=kind,
        latent_size=latent_size, hidden_sizes=hidden_sizes, channels=config.channels,
        num_blocks=config.num_blocks, terminal_head=bool(config.terminal_head),
        terminal_head_gradient=float(config.terminal_head_gradient))
