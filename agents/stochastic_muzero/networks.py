"""Stochastic MuZero's networks (Antonoglou et al., 2022): MuZero's h, f and g, with g fed a
chance code instead of the action, plus the afterstate functions and the chance encoder.

    represent(o) -> s                             MuZero's h
    predict(s) -> (policy logits, value logits)   MuZero's f
    afterstate(s, a) -> as                        phi: the afterstate dynamics (no reward)
    afterstate_predict(as) -> (sigma logits [C], Q logits)   psi: the prior over the C chance
                                                  outcomes and the afterstate's value
    dynamics(as, c) -> (reward logits, s')        MuZero's g on the one-hot code c [B, C]
    terminal_logit(s') -> logit                   MuZero's terminal head, when `terminal_head`
    encode(o_k, o_{k+1}) -> c^e [B, C]            the chance encoder e (`encoder_input`: the
                                                  pair, or o_{k+1} alone)

`quantise(c^e)` is the code: the one-hot of argmax c^e (the nearest vector of the fixed
codebook of one-hot vectors), passed straight through to c^e's gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from agents.layers import Conv
from agents.muzero.networks import (
    MLP,
    VECTOR_LATENT,
    Head,
    MuZeroNetwork,
    _as_float,
    _ResBlock,
    make_network,
    normalise_latent,
)
from podracer.types import Array, EnvSpec

ENCODER_INPUTS = ("pair", "next")
ENCODER_OUTPUTS = ("linear", "softmax")


def quantise(encoding: Array) -> Array:
    """[B, C] the one-hot code nearest `encoding` (argmax: every one-hot vector is at the same
    distance from the origin), with the straight-through gradient: forwards the code,
    backwards the identity onto `encoding`."""
    code = jax.nn.one_hot(jnp.argmax(encoding, axis=-1), encoding.shape[-1],
                          dtype=encoding.dtype)
    return encoding + jax.lax.stop_gradient(code - encoding)


class StochasticMuZeroNetwork(nn.Module):
    muzero: MuZeroNetwork  # h, f, g (g's input is the chance code), the terminal head
    num_chance_outcomes: int  # C, the codebook's size
    encoder_sizes: Sequence[int] = (64,)  # the chance encoder's hidden layers
    encoder_input: str = "pair"  # "pair": (o_k, o_{k+1}); "next": o_{k+1}
    encoder_output: str = "linear"  # c^e as the encoder's last layer gives it, or its softmax

    def setup(self):
        mz = self.muzero
        self.model = mz
        hidden = tuple(mz.hidden_sizes)
        if mz.kind in VECTOR_LATENT:
            self.after_net = MLP((*hidden, mz.latent_size))
        else:
            self.after_in = Conv(mz.channels, (3, 3))
            self.after_blocks = [_ResBlock(mz.channels) for _ in range(mz.num_blocks)]
            self.after_pred_blocks = [_ResBlock(mz.channels) for _ in range(mz.num_blocks)]
        self.chance_head = Head(self.num_chance_outcomes, hidden)
        self.afterstate_value_head = Head(mz.num_bins, hidden)
        if mz.kind != "mlp":  # image observations: a convolution first
            self.encoder_conv = Conv(mz.channels, (3, 3),
                                     strides=(2, 2) if mz.kind in ("resnet", "ez_resnet")
                                     else (1, 1))
        self.encoder_net = MLP(tuple(self.encoder_sizes))
        self.encoder_out = nn.Dense(self.num_chance_outcomes)

    @property
    def terminal_head(self) -> bool:
        return self.muzero.terminal_head

    def represent(self, observation: Array) -> Array:
        return self.model.represent(observation)

    def predict(self, latent: Array) -> tuple[Array, Array]:
        return self.model.predict(latent)

    def afterstate(self, latent: Array, action: Array) -> Array:
        one_hot = jax.nn.one_hot(action, self.muzero.num_actions)
        if self.muzero.kind in VECTOR_LATENT:
            x = self.after_net(jnp.concatenate([latent, one_hot], axis=-1))
        else:
            planes = jnp.broadcast_to(one_hot[:, None, None, :],
                                      latent.shape[:3] + one_hot.shape[-1:])
            x = nn.relu(self.after_in(jnp.concatenate([latent, planes], axis=-1)))
            for block in self.after_blocks:
                x = block(x)
        return normalise_latent(x)

    def afterstate_predict(self, afterstate: Array) -> tuple[Array, Array]:
        x = afterstate
        if self.muzero.kind not in VECTOR_LATENT:
            for block in self.after_pred_blocks:
                x = block(x)
        x = x.reshape(x.shape[0], -1)
        return self.chance_head(x), self.afterstate_value_head(x)

    def dynamics(self, afterstate: Array, code: Array) -> tuple[Array, Array]:
        return self.model.dynamics_from(afterstate, code)

    def terminal_logit(self, latent: Array) -> Array:
        return self.model.terminal_logit(latent)

    def encode(self, observation: Array, next_observation: Array) -> Array:
        """[B, C] c^e of the transition o_k -> o_{k+1} (`[B, ...]` each)."""
        x = _as_float(next_observation)
        if self.encoder_input == "pair":
            x = jnp.concatenate([_as_float(observation), x], axis=-1)
        if self.muzero.kind != "mlp":
            x = nn.relu(self.encoder_conv(x))
        x = self.encoder_out(self.encoder_net(x.reshape(x.shape[0], -1)))
        return jax.nn.softmax(x) if self.encoder_output == "softmax" else x

    def __call__(self, observation: Array, action: Array):
        latent = self.represent(observation)
        policy = self.predict(latent)
        afterstate = self.afterstate(latent, action)
        chance_logits, q_logits = self.afterstate_predict(afterstate)
        code = quantise(self.encode(observation, observation))
        reward_logits, next_latent = self.dynamics(afterstate, code)
        if self.muzero.terminal_head:
            self.terminal_logit(next_latent)
        return policy, chance_logits, q_logits, reward_logits


def encoder_sizes(config: ml_collections.ConfigDict, network: MuZeroNetwork) -> tuple[int, ...]:
    """The encoder's hidden layers: `config.encoder_hidden_sizes`, or the MuZero network's
    `hidden_sizes` when None."""
    sizes = config.encoder_hidden_sizes
    return tuple(network.hidden_sizes) if sizes is None else tuple(int(s) for s in sizes)


def make_stochastic_network(config: ml_collections.ConfigDict, env_spec: EnvSpec
                            ) -> StochasticMuZeroNetwork:
    muzero = make_network(config, env_spec)
    return StochasticMuZeroNetwork(
        muzero=muzero, num_chance_outcomes=int(config.num_chance_outcomes),
        encoder_sizes=encoder_sizes(config, muzero), encoder_input=config.encoder_input,
        encoder_output=config.encoder_output)
