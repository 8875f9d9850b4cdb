"""PPO's actor-critic (flax linen) and its two action distributions.

Torsos: `"mlp"` gives the policy and the value separate MLPs (tanh or ReLU, orthogonal
initialisation, as is usual for PPO on vector observations; left to the observations, 2 x 64
tanh for vectors and 2 x 256 ReLU for boards read flattened, `mlp_activation`); `"conv"` and
`"resnet"` share one of V-trace's image torsos (`agents.vtrace.networks`) between both heads;
`"auto"` is V-trace's rule: `"conv"` for images at least as large as its receptive field,
`"mlp"` otherwise.

Heads: a discrete action space gets logits; a continuous one (`ArraySpec` actions of shape
[D]) a diagonal Gaussian with a state-independent, learnt log standard deviation. The
environment clips the sampled actions to its bounds where it has them. The policy head is
initialised small (orthogonal, gain 0.01), so the first policy is near uniform or near N(0, 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from agents.actor_critic import is_board, mlp_hidden_sizes
from agents.vtrace.networks import ConvTorso, ResNetTorso, resolve_torso
from podracer.types import Array, DiscreteSpec, EnvSpec

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}
TORSOS = ("auto", "mlp", "conv", "resnet")

# The MLP's activation when `agent.activation` is None (the default), by observation kind: tanh
# for vectors and 2-D arrays (PPO's usual classic-control network), ReLU for boards read
# flattened (gymnax's MinAtar PPO baselines). On MinAtar's boards ReLU 2 x 256 learns more
# than tanh at either width; on CartPole it misses the goal that tanh 2 x 64 meets
# (docs/ppo.md).
VECTOR_ACTIVATION = "tanh"
IMAGE_ACTIVATION = "relu"


def mlp_activation(activation: str | None, spec: EnvSpec) -> str:
    """`agent.activation` when set; else the default for `spec`'s observations (above)."""
    if activation is not None:
        return activation
    return IMAGE_ACTIVATION if is_board(spec) else VECTOR_ACTIVATION


class PPOMLP(nn.Module):
    """Flattens all but the leading batch axis, then dense layers with orthogonal(sqrt 2)
    initialisation and the named activation."""

    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = x.astype(jnp.float32).reshape(x.shape[0], -1)
        for size in self.hidden_sizes:
            x = nn.Dense(size, kernel_init=nn.initializers.orthogonal(math.sqrt(2.0)),
                         bias_init=nn.initializers.zeros)(x)
            x = ACTIVATIONS[self.activation](x)
        return x


class PPONetwork(nn.Module):
    """`observation [B, ...] -> (policy, value [B])`: `policy` is logits [B, A] (discrete) or
    (mean [B, D], log_std [B, D]) (continuous)."""

    torso: str  # "mlp" | "conv" | "resnet" (resolved, not "auto")
    action_size: int  # A actions, or D action dimensions
    continuous: bool
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, observation: Array) -> tuple[Any, Array]:
        if self.torso == "mlp":
            actor = PPOMLP(self.hidden_sizes, self.activation, name="actor_torso")(observation)
            critic = PPOMLP(self.hidden_sizes, self.activation,
                            name="critic_torso")(observation)
        else:
            torso = ConvTorso() if self.torso == "conv" else ResNetTorso()
            actor = critic = torso(observation)
        head = nn.Dense(self.action_size, kernel_init=nn.initializers.orthogonal(0.01),
                        bias_init=nn.initializers.zeros, name="policy")(actor)
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0),
                         bias_init=nn.initializers.zeros, name="value")(critic)[..., 0]
        if not self.continuous:
            return head, value
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_size,))
        return (head, jnp.broadcast_to(log_std, head.shape)), value


def is_continuous(env_spec: EnvSpec) -> bool:
    return not isinstance(env_spec.action, DiscreteSpec)


def make_network(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> PPONetwork:
    torso = resolve_torso(config.torso, env_spec)
    if torso not in TORSOS[1:]:
        raise ValueError(f"agent.torso={config.torso!r}: use one of {TORSOS}.")
    continuous = is_continuous(env_spec)
    if continuous:
        if len(env_spec.action.shape) != 1:
            raise ValueError(f"PPO's Gaussian policy needs actions of shape [D], got "
                             f"{tuple(env_spec.action.shape)}.")
        action_size = int(env_spec.action.shape[0])
    else:
        action_size = int(env_spec.action.num_values)
    return PPONetwork(torso=torso, action_size=action_size, continuous=continuous,
                      hidden_sizes=mlp_hidden_sizes(config.hidden_sizes, env_spec),
                      activation=mlp_activation(config.activation, env_spec))


# ---------------------------------------------------------------------------------------------
# DISTRIBUTIONS: the policy head's output -> sample, mode, log-probability, entropy.

_LOG_2PI = float(np.log(2.0 * np.pi))


def sample(policy: Any, key: jax.Array, *, continuous: bool) -> Array:
    if continuous:
        mean, log_std = policy
        return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)
    return jax.random.categorical(key, policy).astype(jnp.int32)


def mode(policy: Any, *, continuous: bool) -> Array:
    if continuous:
        return policy[0]
    return jnp.argmax(policy, axis=-1).astype(jnp.int32)


def log_prob(policy: Any, action: Array, *, continuous: bool) -> Array:
    """[B] log pi(a|x)."""
    if continuous:
        mean, log_std = policy
        z = (action - mean) * jnp.exp(-log_std)
        return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * _LOG_2PI, axis=-1)
    log_pi = jax.nn.log_softmax(policy)
    return jnp.take_along_axis(log_pi, action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy(policy: Any, *, continuous: bool) -> Array:
    """[B] the policy's entropy at each x."""
    if continuous:
        _, log_std = policy
        return jnp.sum(log_std + 0.5 * (_LOG_2PI + 1.0), axis=-1)
    log_pi = jax.nn.log_softmax(policy)
    return -jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1)
