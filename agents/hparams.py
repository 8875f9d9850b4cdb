"""Hyperparameters held in an agent's learner state, so that one compiled program serves every
value of them (a sweep's runs, a resumed run with a changed value): the optimiser's in its
`optax.inject_hyperparams` state, the loss's in `learner_state.hparams`. Shared by the agents
that keep them this way (V-trace, PPO, MuZero, EfficientZero), and PPO's and PQN's optimiser
(`annealed_clipped_adam`); the actor-critic agents' learner
state is in `agents.actor_critic`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import optax

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


def annealed_clipped_adam(*, learning_rate: float, adam_eps: float, max_grad_norm: float,
                          steps_per_update: int, anneal_updates: int,
                          flat: bool = False) -> optax.GradientTransformation:
    """Global-norm clipping then Adam, the step size annealed linearly to 0 over
    `anneal_updates` learner steps of `steps_per_update` optimiser steps each (constant within
    a learner step; 0: never annealed), with `learning_rate`, `adam_eps` and `max_grad_norm`
    held in the optimiser state (`optax.inject_hyperparams`, the names `replace_hparams`
    sets). `flat`: over the parameters raveled into one vector (`optax.flatten`), the same
    update in fewer kernels."""

    def fraction(count: Array) -> Array:
        if anneal_updates <= 0:
            return jnp.ones((), jnp.float32)
        done = (count // steps_per_update).astype(jnp.float32)
        return jnp.clip(1.0 - done / anneal_updates, 0.0, 1.0)

    def clipped_adam(learning_rate, adam_eps, max_grad_norm):
        chain = optax.chain(
            optax.clip_by_global_norm(max_grad_norm),
            optax.scale_by_adam(eps=adam_eps),
            optax.scale_by_schedule(fraction),
            optax.scale_by_learning_rate(learning_rate),
        )
        return optax.flatten(chain) if flat else chain

    return optax.inject_hyperparams(clipped_adam)(
        learning_rate=learning_rate, adam_eps=adam_eps, max_grad_norm=max_grad_norm)
