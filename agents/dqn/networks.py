"""The DQN family's Q-networks: a torso (an MLP, optionally with LayerNorm before each ReLU as
in PQN; the DQN conv torso for images; or `"board_conv"`, one small convolution for boards such
as MinAtar's) and a head of one value per action ("q") or a categorical distribution over
`num_atoms` fixed returns per action ("c51", Bellemare et al., 2017)."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from agents.actor_critic import mlp_hidden_sizes
from agents.layers import Conv
from agents.vtrace.networks import ConvTorso, _as_float, resolve_torso
from podracer.config import ConfigError
from podracer.types import Array, EnvSpec

HEADS = ("q", "c51")
TORSOS = ("auto", "mlp", "conv", "board_conv")
BOARD_CONV_HIDDEN_SIZES = (128,)  # "board_conv"'s dense layers when `hidden_sizes` is None


class LayerNormMLP(nn.Module):
    """Flattens all but the leading batch axis, then Dense (-> LayerNorm) -> ReLU layers."""

    hidden_sizes: Sequence[int] = (128, 128)
    layer_norm: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = _as_float(x).reshape(x.shape[0], -1)
        for size in self.hidden_sizes:
            x = nn.Dense(size)(x)
            if self.layer_norm:
                x = nn.LayerNorm()(x)
            x = nn.relu(x)
        return x


class BoardConvTorso(nn.Module):
    """[B, H, W, C] boards -> one 3 x 3 convolution of `channels` (no padding), then dense
    layers, each followed by LayerNorm (optional) and ReLU, He-initialised: the MinAtar
    paper's network (Young & Tian, 2019), with LayerNorm as PQN uses it there."""

    channels: int = 16
    hidden_sizes: Sequence[int] = BOARD_CONV_HIDDEN_SIZES
    layer_norm: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        init = nn.initializers.he_normal()

        def norm_relu(y):
            return nn.relu(nn.LayerNorm()(y) if self.layer_norm else y)

        x = norm_relu(Conv(self.channels, (3, 3), padding="VALID", kernel_init=init)(
            _as_float(x)))
        x = x.reshape(x.shape[0], -1)
        for size in self.hidden_sizes:
            x = norm_relu(nn.Dense(size, kernel_init=init)(x))
        return x


class QNetwork(nn.Module):
    """observation [B, ...] -> (q [B, A], logits [B, A, num_atoms] or None for the "q" head).
    The "c51" head's q is the expected return under softmax(logits) over `atoms`."""

    torso: nn.Module
    num_actions: int
    head: str = "q"
    num_atoms: int = 51
    v_min: float = -10.0
    v_max: float = 10.0

    def atoms(self) -> Array:
        return jnp.linspace(self.v_min, self.v_max, self.num_atoms, dtype=jnp.float32)

    @nn.compact
    def __call__(self, observation: Array) -> tuple[Array, Array | None]:
        h = self.torso(observation)
        if self.head == "q":
            return nn.Dense(self.num_actions)(h), None
        logits = nn.Dense(self.num_actions * self.num_atoms)(h)
        logits = logits.reshape(h.shape[0], self.num_actions, self.num_atoms)
        q = jnp.sum(jax.nn.softmax(logits) * self.atoms(), axis=-1)
        return q, logits


def make_network(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> QNetwork:
    """The Q-network of `config` (torso, sizes, LayerNorm, head and its atoms) for `env_spec`."""
    torso_name = resolve_torso(config.torso, env_spec)
    if torso_name == "conv":
        torso = ConvTorso()
    elif torso_name == "board_conv":
        shape = tuple(env_spec.observation.shape)
        if len(shape) != 3 or min(shape[:2]) < 3:
            raise ConfigError("agent.torso", f"'board_conv' needs [H, W, C] boards of at least "
                              f"3 x 3, the observations are {shape}", "use 'mlp' or 'auto'")
        sizes = config.hidden_sizes
        torso = BoardConvTorso(
            hidden_sizes=BOARD_CONV_HIDDEN_SIZES if sizes is None else tuple(map(int, sizes)),
            layer_norm=bool(config.layer_norm))
    else:
        torso = LayerNormMLP(mlp_hidden_sizes(config.hidden_sizes, env_spec),
                             layer_norm=bool(config.layer_norm))
    head = config.get("head", "q")
    return QNetwork(torso=torso, num_actions=env_spec.action.num_values, head=head,
                    num_atoms=int(config.get("num_atoms", 51)),
                    v_min=float(config.get("v_min", -10.0)),
                    v_max=float(config.get("v_max", 10.0)))
