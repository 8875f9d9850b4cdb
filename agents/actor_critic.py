"""The learner state of the actor-critic agents (V-trace, PPO), whose learner owns parameters,
an optimiser and nothing else, and its initialisation. (MuZero's, which also holds target
parameters and a replay, is `agents.muzero.learning.LearnerState`.)"""

from __future__ import annotations

import chex
import flax.linen as nn
import jax.numpy as jnp
import optax

from podracer.types import Array, EnvSpec, Params, PRNGKey


@chex.dataclass(frozen=True)
class LearnerState:
    """The learner state of an agent whose learner owns parameters, an optimiser and nothing
    else (V-trace, PPO)."""

    params: Params
    opt_state: optax.OptState  # an `optax.InjectHyperparamsState`: the optimiser's hparams
    updates: Array  # [] int32, learner steps applied so far
    hparams: dict[str, Array]  # {name: [] float32} the loss's hyperparameters


def init_learner_state(network: nn.Module, optimizer: optax.GradientTransformation,
                       loss_hparams: dict[str, float], key: PRNGKey,
                       spec: EnvSpec) -> LearnerState:
    """`network`'s parameters initialised from `key` on one observation of `spec`, the
    optimiser's state for them, no updates yet, and the loss's hyperparameters
    `loss_hparams` ({name: value}) as [] float32 arrays."""
    dummy = jnp.zeros((1,) + tuple(spec.observation.shape), spec.observation.dtype)
    params = network.init(key, dummy)
    return LearnerState(
        params=params,
        opt_state=optimizer.init(params),
        updates=jnp.zeros((), jnp.int32),
        hparams={k: jnp.asarray(v, jnp.float32) for k, v in loss_hparams.items()},
    )
