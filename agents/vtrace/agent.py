"""The V-trace (IMPALA) agent as the three pure functions of `podracer.agent.Agent`: the config,
the optimiser, and `make_agent`, which assembles the network (`networks.py`) and the acting and
learning functions (`learning.py`)."""

from __future__ import annotations

import functools

import ml_collections
import optax

from agents.actor_critic import LearnerState, init_learner_state
from agents.hparams import replace_hparams
from agents.vtrace import learning
from agents.vtrace.networks import make_network
from podracer.agent import Agent
from podracer.types import Array, EnvSpec

# Scalar hyperparameters that live in the learner state as arrays, so that one compiled program
# can run several values side by side (`jax.vmap` over runs; see `set_hparams`). The
# optimiser's are injected into its state by `optax.inject_hyperparams`; the loss's are in
# `LearnerState.hparams`.
OPTIMIZER_HPARAMS = ("learning_rate", "adam_eps", "max_grad_norm")
LOSS_HPARAMS = ("discount", "lambda_", "clip_rho_threshold", "clip_pg_rho_threshold",
                "baseline_cost", "entropy_cost")
SWEEPABLE = OPTIMIZER_HPARAMS + LOSS_HPARAMS


def default_config() -> ml_collections.ConfigDict:
    """The agent's hyperparameters, one comment per field."""
    c = ml_collections.ConfigDict()
    c.name = "vtrace"
    c.torso = "auto"  # "auto" | "mlp" | "conv" | "resnet"
    c.hidden_sizes = (64, 64)  # MLP torso layer sizes
    c.learning_rate = 1e-3  # Adam step size
    c.adam_eps = 1e-5
    c.max_grad_norm = 1.0  # gradients are clipped to this global norm
    c.discount = 0.99  # gamma
    c.lambda_ = 1.0  # V-trace trace-cutting lambda
    c.clip_rho_threshold = 1.0  # rho-bar in the paper
    c.clip_pg_rho_threshold = 1.0
    c.baseline_cost = 0.5
    c.entropy_cost = 0.01
    return c


def _clipped_adam(learning_rate: float, adam_eps: float,
                  max_grad_norm: float) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adam(learning_rate, eps=adam_eps),
    )


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Global-norm clipping then Adam, with its hyperparameters held in the optimiser state."""
    return optax.inject_hyperparams(_clipped_adam)(
        **{name: float(config[name]) for name in OPTIMIZER_HPARAMS}
    )


def set_hparams(learner_state: LearnerState, hparams: dict[str, Array]) -> LearnerState:
    """`learner_state` with the named hyperparameters (fields of `default_config()` listed in
    `SWEEPABLE`) replaced by `hparams`' values, which may be traced scalars."""
    return replace_hparams(learner_state, hparams, optimizer_hparams=OPTIMIZER_HPARAMS,
                           loss_hparams=LOSS_HPARAMS, agent_name="V-trace")


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the V-trace agent for environments with a discrete action spec: `learning.py`'s
    functions bound to the network and optimiser of `config`."""
    network = make_network(config, env_spec)
    optimizer = make_optimizer(config)
    loss_hparams = {k: config[k] for k in LOSS_HPARAMS}
    return Agent(
        init=lambda key, spec=env_spec: init_learner_state(network, optimizer, loss_hparams,
                                                           key, spec),
        actor_step=functools.partial(learning.actor_step, network),
        learner_step=functools.partial(learning.learner_step, network, optimizer),
        init_actor_state=lambda batch_size: (),
        actor_params=lambda learner_state: learner_state.params,
        set_hparams=set_hparams,
        sweepable=SWEEPABLE,
    )
