"""Hyperparameters held in an agent's learner state, so that one compiled program serves every
value of them (a sweep's runs, a resumed run with a changed value): the optimiser's in its
`optax.inject_hyperparams` state, the loss's in `learner_state.hparams`. Shared by the agents
that keep them this way (V-trace, PPO, MuZero, EfficientZero), with the learner state of the
agents whose learner owns nothing else (V-trace, PPO)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import chex
import flax.linen as nn
import jax.numpy as jnp
import ml_collections
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
                       config: ml_collections.ConfigDict, loss_hparams: Sequence[str],
                       key: PRNGKey, spec: EnvSpec) -> LearnerState:
    """`network`'s parameters initialised from `key` on one observation of `spec`, the
    optimiser's state for them, no updates yet, and `config`'s values of `loss_hparams`."""
    dummy = jnp.zeros((1,) + tuple(spec.observation.shape), spec.observation.dtype)
    params = network.init(key, dummy)
    return LearnerState(
        params=params,
        opt_state=optimizer.init(params),
        updates=jnp.zeros((), jnp.int32),
        hparams={k: jnp.asarray(config[k], jnp.float32) for k in loss_hparams},
    )


def replace_hparams(learner_state: Any, hparams: dict[str, Array], *,
                    optimizer_hparams: Sequence[str], loss_hparams: Sequence[str],
                    agent_name: str) -> Any:
    """`learner_state` with the named hyperparameters replaced by `hparams`' values (which may
    be traced scalars); a name in neither list raises `KeyError`."""
    settable = list(optimizer_hparams) + list(loss_hparams)
    unknown = sorted(set(hparams) - set(settable))
    if unknown:
        raise KeyError(f"{agent_name} cannot set {unknown}; settable: {settable}.")
    as_scalar = {k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()}
    opt_state = learner_state.opt_state
    injected = {k: v for k, v in as_scalar.items() if k in optimizer_hparams}
    if injected:
        opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams, **injected})
    loss = {k: v for k, v in as_scalar.items() if k in loss_hparams}
    return learner_state.replace(opt_state=opt_state,
                                 hparams={**learner_state.hparams, **loss})
