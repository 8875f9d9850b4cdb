"""The DQN family's Q-networks: a torso (an MLP, optionally with LayerNorm before each ReLU as
in PQN; or the DQN conv torso for images) and a head of one value per action ("q") or a
categorical distribution over `num_atoms` fixed returns per action ("c51", Bellemare et al.,
2017)."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from agents.actor_critic import mlp_hidden_sizes
from agents.vtrace.networks import ConvTorso, _as_float, resolve_torso
from podracer.types import Array, EnvSpec

HEADS = ("q", "c51")
TORSOS = ("auto", "mlp", "conv")


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
    else:
        torso = LayerNormMLP(mlp_hidden_sizes(config.hidden_sizes, env_spec),
                             layer_norm=bool(config.layer_norm))
    head = config.get("head", "q")
    return QNetwork(torso=torso, num_actions=env_spec.action.num_values, head=head,
                    num_atoms=int(config.get("num_atoms", 51)),
                    v_min=float(config.get("v_min", -10.0)),
                    v_max=float(config.get("v_max", 10.0)))
