"""Hyperparameters held in an agent's learner state, so that one compiled program serves every
value of them (a sweep's runs, a resumed run with a changed value): the optimiser's in its
`optax.inject_hyperparams` state, the loss's in `learner_state.hparams`. Shared by the agents
that keep them this way (V-trace, PPO, MuZero, EfficientZero); the actor-critic agents' learner
state is in `agents.actor_critic`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from podracer.types import Array


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
