"""EfficientZero's networks (Ye et al., 2021): MuZero's h, g and f, plus a value-prefix LSTM
and SimSiam-style projection heads.

    represent(o) -> s                        MuZero's h
    dynamics(s, a) -> (reward logits, s')    MuZero's g (its reward head is used when the
                                             value prefix is switched off)
    predict(s) -> (policy logits, value logits)   MuZero's f
    terminal_logit(s') -> logit               MuZero's terminal head, when `terminal_head`
    prefix(s', carry) -> (prefix logits, carry')  LSTM over the unrolled latents: the sum of
                                             rewards since the last reset of `carry`; the
                                             head reads relu(LayerNorm(h)) (the paper: batch
                                             norm then ReLU) or, without the norm, relu(h)
    project(s) -> z;  project_predict(z) -> p     the consistency loss's projector and predictor

The projector (Linear-norm-ReLU-Linear-norm) and the predictor (Linear-norm-ReLU-Linear)
normalise with batch statistics by default (`consistency_norm="batch"`, as the reference's
BatchNorm1d in training mode): a per-sample LayerNorm ("layer") lets every state map to one
vector, and the consistency loss then sits at its floor while teaching the model nothing
(docs/efficientzero.md). Batch statistics are those of the batch each call is given, with no
running averages: projections are only computed by the learner.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from agents.layers import BatchStatNorm
from agents.muzero.networks import Head, MuZeroNetwork, make_network
from podracer.types import Array, EnvSpec

LSTMCarry = tuple[Array, Array]  # (c, h), each [B, lstm_size]


CONSISTENCY_NORMS = ("batch", "layer")


def _norm(kind: str) -> nn.Module:
    return BatchStatNorm() if kind == "batch" else nn.LayerNorm()


class _Head(nn.Module):
    """Linear-norm-ReLU then a linear output, normalised when `normalise_output` (the
    projector; SimSiam's shape) or not (the predictor)."""

    hidden: int
    output: int
    norm: str = "batch"
    normalise_output: bool = True

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = nn.Dense(self.output)(nn.relu(_norm(self.norm)(nn.Dense(self.hidden)(x))))
        return _norm(self.norm)(x) if self.normalise_output else x


class EfficientZeroNetwork(nn.Module):
    muzero: MuZeroNetwork
    lstm_size: int = 64
    projection_hidden: int = 128
    projection_size: int = 128
    prefix_norm: bool = True
    consistency_norm: str = "batch"  # "batch" | "layer"

    def setup(self):
        self.model = self.muzero  # h, g, f
        self.lstm = nn.OptimizedLSTMCell(self.lstm_size)
        self.prefix_head = Head(self.muzero.num_bins, tuple(self.muzero.hidden_sizes))
        if self.prefix_norm:
            self.prefix_layer_norm = nn.LayerNorm()
        self.projector = _Head(self.projection_hidden, self.projection_size,
                               self.consistency_norm)
        self.predictor = _Head(self.projection_hidden, self.projection_size,
                               self.consistency_norm, normalise_output=False)

    @property
    def terminal_head(self) -> bool:
        """Whether MuZero's terminal head is on (`muzero.terminal_head`)."""
        return self.muzero.terminal_head

    def represent(self, observation: Array) -> Array:
        return self.model.represent(observation)

    def dynamics(self, latent: Array, action: Array) -> tuple[Array, Array]:
        return self.model.dynamics(latent, action)

    def predict(self, latent: Array) -> tuple[Array, Array]:
        return self.model.predict(latent)

    def prefix(self, latent: Array, carry: LSTMCarry) -> tuple[Array, LSTMCarry]:
        carry, h = self.lstm(carry, latent.reshape(latent.shape[0], -1))
        if self.prefix_norm:
            h = self.prefix_layer_norm(h)
        return self.prefix_head(nn.relu(h)), carry

    def terminal_logit(self, latent: Array) -> Array:
        """MuZero's terminal head (`muzero.terminal_head`): the logit of P(the step into
        `latent` ended the episode)."""
        return self.model.terminal_logit(latent)

    def project(self, latent: Array) -> Array:
        return self.projector(latent.reshape(latent.shape[0], -1))

    def project_predict(self, projection: Array) -> Array:
        return self.predictor(projection)

    def __call__(self, observation: Array, action: Array):
        latent = self.represent(observation)
        _, next_latent = self.dynamics(latent, action)
        if self.muzero.terminal_head:
            self.terminal_logit(next_latent)
        prefix_logits, _ = self.prefix(next_latent, initial_carry(latent.shape[0],
                                                                  self.lstm_size))
        return (self.predict(next_latent), prefix_logits,
                self.project_predict(self.project(next_latent)))


def initial_carry(batch_size: int, lstm_size: int) -> LSTMCarry:
    """The LSTM state at a reset: zeros."""
    zeros = jnp.zeros((batch_size, lstm_size), jnp.float32)
    return zeros, zeros


def reset_carry(carry: LSTMCarry, reset: Array) -> LSTMCarry:
    """`carry` with the rows where `reset` ([B] bool) is set back to zeros."""
    return jax.tree.map(lambda x: jnp.where(reset[:, None], 0.0, x), carry)


def make_ez_network(config: ml_collections.ConfigDict, env_spec: EnvSpec
                    ) -> EfficientZeroNetwork:
    return EfficientZeroNetwork(
        muzero=make_network(config, env_spec),
        lstm_size=config.lstm_size,
        projection_hidden=config.projection_hidden,
        projection_size=config.projection_size,
        prefix_norm=config.value_prefix_norm,
        consistency_norm=config.consistency_norm,
    )
