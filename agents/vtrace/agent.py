"""The V-trace (IMPALA) agent as the three pure functions of `podracer.agent.Agent`: the config,
the optimiser, and `make_agent`, which assembles the network (`networks.py`) and the acting and
learning functions (`learning.py`)."""

from __future__ import annotations

import functools
from types import MappingProxyType

import jax.numpy as jnp
import ml_collections
import optax
from ml_collections import config_dict

from agents import popart
from agents.actor_critic import (
    ADVANTAGE_NORMALIZATIONS,
    LearnerState,
    chosen_fields,
    init_learner_state,
    mlp_hidden_sizes,
    validate_hidden_sizes,
)
from agents.hparams import replace_hparams
from agents.vtrace import learning
from agents.vtrace.networks import TORSOS, logit_scale, make_network, resolve_torso
from podracer.agent import Agent
from podracer.config import (check_numbers, require_discount, require_fraction, require_one_of,
                              require_positive_number)
from podracer.types import Array, EnvSpec

# Scalar hyperparameters that live in the learner state as arrays, so that one compiled program
# can run several values side by side (`jax.vmap` over runs; see `set_hparams`). The
# optimiser's are injected into its state by `optax.inject_hyperparams`; the loss's are in
# `LearnerState.hparams`.
OPTIMIZER_HPARAMS = ("learning_rate", "adam_eps", "max_grad_norm")
LOSS_HPARAMS = ("discount", "lambda_", "clip_rho_threshold", "clip_pg_rho_threshold",
                "baseline_cost", "entropy_cost", "reward_scale")
SWEEPABLE = OPTIMIZER_HPARAMS + LOSS_HPARAMS


def default_config() -> ml_collections.ConfigDict:
    """V-trace's hyperparameters, one comment per field. Why each default is what it is:
    docs/results.md#v-trace-defaults."""
    c = ml_collections.ConfigDict()
    c.name = "vtrace"  # the registered agent name
    c.torso = "auto"  # "auto" | "mlp" | "conv" | "resnet"; "auto": conv on images >= 36 x 36
    # MLP torso layer sizes. None: 2 x 64 for vectors, 2 x 256 for images read flattened
    # (MinAtar's boards; `agents.actor_critic.mlp_hidden_sizes`).
    c.hidden_sizes = config_dict.placeholder(tuple)
    # Factor (> 0) on the policy head's logits (`networks.ActorCritic`). None: 64 / the MLP's
    # last width if wider (0.25 at 256: a 64-wide head's pace under Adam), else 1; 1 for the
    # conv torsos.
    c.logit_scale = config_dict.placeholder(float)
    c.learning_rate = 2e-3  # Adam step size at the start
    # Learner updates over which the step size falls linearly to 0; 0 = constant. Configs tie
    # it to the run length with field references (as PPO's `anneal_lr_updates`).
    c.anneal_lr_updates = 0
    c.adam_eps = 1e-5  # Adam's epsilon
    c.max_grad_norm = 1.0  # gradients are clipped to this global norm
    c.discount = 0.99  # gamma per agent step
    c.lambda_ = 1.0  # V-trace's trace-cutting lambda, in [0, 1]
    c.clip_rho_threshold = 1.0  # rho-bar in the paper: the cap on the value targets' weights
    c.clip_pg_rho_threshold = 1.0  # the cap on the policy gradient's importance weights
    c.baseline_cost = 0.5  # weight of the value loss
    c.entropy_cost = 0.01  # weight of the entropy bonus
    # Scale remedies (docs/vtrace.md).
    c.advantage_normalization = "none"  # "none" | "batch": pg advantages to mean 0, std 1
    # over the real transitions of the global batch (every device and process), as PPO does
    c.popart = True  # PopArt value normalisation (van Hasselt et al., 2016; Hessel et al.,
    # 2019): the value head predicts (v - mu) / sigma, the statistics live in the learner state
    c.popart_step_size = 1e-3  # beta of the statistics' exponential averages, in (0, 1]
    # True: the statistics' step at update n is max(beta, 1/(n+1)), their plain average until
    # 1/beta updates, then the exponential one (`agents.popart.step_size_at`); False: beta.
    c.popart_average_first = True
    c.reward_scale = 1.0  # rewards are multiplied by it before V-trace
    return c


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Global-norm clipping then Adam, the step size annealed linearly to 0 over
    `anneal_lr_updates` updates (when > 0), with its hyperparameters held in the optimiser
    state."""
    anneal = int(config.anneal_lr_updates)

    def clipped_adam(learning_rate, adam_eps, max_grad_norm):
        if anneal <= 0:  # the optimiser (and its state) of a constant step size
            return optax.chain(optax.clip_by_global_norm(max_grad_norm),
                               optax.adam(learning_rate, eps=adam_eps))
        return optax.chain(
            optax.clip_by_global_norm(max_grad_norm),
            optax.scale_by_adam(eps=adam_eps),
            optax.scale_by_schedule(lambda count: jnp.clip(1.0 - count / anneal, 0.0, 1.0)),
            optax.scale_by_learning_rate(learning_rate),
        )

    return optax.inject_hyperparams(clipped_adam)(
        **{name: float(config[name]) for name in OPTIMIZER_HPARAMS}
    )


def set_hparams(learner_state: LearnerState, hparams: dict[str, Array]) -> LearnerState:
    """`learner_state` with the named hyperparameters (fields of `default_config()` listed in
    `SWEEPABLE`) replaced by `hparams`' values, which may be traced scalars."""
    return replace_hparams(learner_state, hparams, optimizer_hparams=OPTIMIZER_HPARAMS,
                           loss_hparams=LOSS_HPARAMS, agent_name="V-trace")


# The number fields and what each must hold (`podracer.config.check_numbers`), with an example.
NUMBER_FIELDS = {"learning_rate": ("positive", 2e-3), "adam_eps": ("non_negative", 1e-5),
                 "max_grad_norm": ("positive", 1.0), "clip_rho_threshold": ("positive", 1.0),
                 "clip_pg_rho_threshold": ("positive", 1.0), "baseline_cost": ("finite", 0.5),
                 "entropy_cost": ("finite", 0.01), "reward_scale": ("positive", 1.0),
                 "anneal_lr_updates": ("whole", 0)}


def _check_config(config: ml_collections.ConfigDict) -> None:
    require_one_of("agent.torso", config.torso, TORSOS)
    require_one_of("agent.advantage_normalization", config.advantage_normalization,
                   ADVANTAGE_NORMALIZATIONS)
    require_discount(config.discount)
    require_fraction("agent.lambda_", config.lambda_, 1.0)
    check_numbers(config, "agent", NUMBER_FIELDS)
    popart.check_config(config)
    validate_hidden_sizes(config.hidden_sizes)
    if config.logit_scale is not None:
        require_positive_number("agent.logit_scale", config.logit_scale, 1.0,
                                fix="set --config.agent.logit_scale=1.0 (logits as the head "
                                "computes them), or leave it None for 64 / the MLP's width")


def learn_config(config: ml_collections.ConfigDict) -> learning.LearnConfig:
    """The learner's static settings, from `config`'s fields of the same names."""
    return learning.LearnConfig(advantage_normalization=config.advantage_normalization,
                                popart=bool(config.popart),
                                popart_step_size=float(config.popart_step_size),
                                popart_average_first=bool(config.popart_average_first))


def _init(network, optimizer, loss_hparams, learn: learning.LearnConfig, key,
          spec: EnvSpec) -> LearnerState:
    state = init_learner_state(network, optimizer, loss_hparams, key, spec)
    if learn.popart:
        return popart.PopArtLearnerState(**dict(state.items()),
                                         popart=popart.PopArtStats.init())
    return state


# Fields added after runs were made without them, each with the value under which the agent
# behaves as before (registered as `introduced`): those runs stepped PopArt's statistics by beta
# throughout.
INTRODUCED = MappingProxyType({"popart_average_first": False})


def choices(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> dict:
    """What the agent chose for its fields left to it (registered as `choices`): the torso,
    the MLP's sizes and the logit scale."""
    torso = resolve_torso(config.torso, env_spec)
    fields = chosen_fields(torso, config.hidden_sizes, env_spec)
    if config.logit_scale is None:
        sizes = mlp_hidden_sizes(config.hidden_sizes, env_spec)
        fields["logit_scale"] = logit_scale(config, torso, sizes)
    return fields


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the V-trace agent for environments with a discrete action spec: `learning.py`'s
    functions bound to the network, optimiser and settings of `config`."""
    _check_config(config)
    network = make_network(config, env_spec)
    optimizer = make_optimizer(config)
    learn = learn_config(config)
    loss_hparams = {k: config[k] for k in LOSS_HPARAMS}
    return Agent(
        init=lambda key, spec=env_spec: _init(network, optimizer, loss_hparams, learn, key,
                                              spec),
        actor_step=functools.partial(learning.actor_step, network),
        learner_step=functools.partial(learning.learner_step, network, optimizer,
                                       learn=learn),
        init_actor_state=lambda batch_size: (),
        actor_params=lambda learner_state: learner_state.params,
        set_hparams=set_hparams,
        sweepable=SWEEPABLE,
    )
