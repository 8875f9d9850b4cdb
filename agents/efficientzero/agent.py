"""EfficientZero (Ye et al., 2021) as the three pure functions of `podracer.agent.Agent`,
assembled from MuZero's pieces and this package's additions, each behind a switch:

    value_prefix       LSTM value prefix instead of per-step rewards (search and learning)
    consistency        SimSiam consistency between g's latents and h of the real observations
    td_age_interval    off-policy correction: n shortened with the data's age (0: off)
    reanalyse_fraction share of each batch whose policy targets are recomputed by a search
                       with the target network (paper: all); bootstrap values come from the
                       target network either way (MuZero's `reanalyse_value`)
    augment            random shift and intensity of image observations
    refresh_interval   SpeedyZero's Priority Refresh every N updates (0: off)
    optimizer          "adamw" or SpeedyZero's "clipped_lars" (`podracer.optim`)
    terminal_head      (MuZero's field) its terminal head, trained in the unroll, read by search
"""

from __future__ import annotations

import functools
from types import MappingProxyType

import jax
import jax.numpy as jnp
import ml_collections
import optax

from agents import muzero
from agents.efficientzero import learning
from agents.efficientzero.networks import (
    CONSISTENCY_NORMS,
    EfficientZeroNetwork,
    make_ez_network,
)
from agents.efficientzero.search import run_search
from agents.hparams import replace_hparams
from agents.muzero.agent import INTRODUCED as MUZERO_INTRODUCED
from agents.muzero.learning import LearnerState
from podracer import optim
from podracer.agent import Agent
from podracer.config import ConfigError, check_numbers, require_one_of
from podracer.types import Array, EnvSpec

OPTIMIZER_HPARAMS = muzero.OPTIMIZER_HPARAMS
LOSS_HPARAMS = muzero.LOSS_HPARAMS + ("consistency_cost",)
SWEEPABLE = OPTIMIZER_HPARAMS + LOSS_HPARAMS
OPTIMIZERS = ("adamw", "clipped_lars")
METRIC_NAMES = muzero.METRIC_NAMES + ("consistency_loss", "td_steps")
# Fields added since the first release, with the value that behaves as the code did before
# (registered as `introduced`): MuZero's (inherited), and without the warm-up the full cost
# from the first update; with the loss reaching h, the reference's single unroll.
INTRODUCED = MappingProxyType({**MUZERO_INTRODUCED, "consistency_to_representation": True,
                               "consistency_warmup_updates": 0})


def default_config() -> ml_collections.ConfigDict:
    """MuZero's fields (`agents.muzero.default_config`) and EfficientZero's, one comment
    each; defaults follow the paper where it is specific. Why each default is what it is, and
    where it departs from the reference: docs/results.md#efficientzero-defaults."""
    c = muzero.default_config()
    c.name = "efficientzero"  # the registered agent name
    # MuZero's terminal head (and its absorbing targets past a terminal, below); the reference
    # has neither (efficientzero_atari100k.py turns them off).
    c.terminal_head = True
    # Value prefix.
    c.value_prefix = True  # an LSTM predicts the sum of rewards since its last reset
    c.value_prefix_horizon = 5  # H: the LSTM restarts every H unroll (and search) steps
    c.lstm_size = 64  # the value-prefix LSTM's hidden units
    # The prefix head reads the LSTM's output through a LayerNorm then ReLU (the paper uses
    # batch norm there); False: ReLU alone.
    c.value_prefix_norm = True
    # Self-supervised consistency.
    c.consistency = True  # SimSiam consistency between g's latents and h of the observations
    c.consistency_cost = 2.0  # weight of the consistency loss
    c.projection_hidden = 128  # hidden width of the projector and predictor
    c.projection_size = 128  # output width of the projector and predictor
    # Normalisation in the projector and predictor: "batch" (the reference's batch norm,
    # batch statistics) or "layer" (per-sample LayerNorm).
    c.consistency_norm = "batch"
    # True (the reference): the loss's gradient reaches h through g's unroll from h(o_0).
    # False: g is unrolled again from a stop-gradient h(o_0) for the loss, which then trains
    # g and the heads but not h.
    c.consistency_to_representation = True
    # Learner updates over which the cost rises linearly from 0 to consistency_cost
    # (0: the full cost from the first update, the reference's: it has no warm-up).
    c.consistency_warmup_updates = 4_000
    # Off-policy correction: n = clip(td_steps - floor(age / td_age_interval), td_steps_min,
    # td_steps), age in environment steps since the data was stored (Atari 100k: 5, 1,
    # 30,000). 0 turns it off (n = td_steps always).
    c.td_steps = 5  # n for fresh data, in agent steps
    c.td_steps_min = 1  # the shortest n
    c.td_age_interval = 0  # environment steps of age per step n loses; 0: off
    # Share of each batch whose policy targets a fresh search recomputes, in [0, 1] (the
    # paper: 1.0, as efficientzero_atari100k.py sets).
    c.reanalyse_fraction = 0.0
    # Augmentation of image observations read by a convolutional network (ignored for
    # other observations and for the MLP network, which flattens them).
    c.augment = True
    c.augment_shift = 4  # largest random shift, in pixels
    c.augment_intensity = 0.05  # pixels x (1 + this x clip(N(0, 1), -2, 2))
    # "separate": the online input and the consistency targets get independent draws (the
    # reference); "shared": one draw per sample for both.
    c.augment_draws = "separate"
    # "whole": 1/K on the whole loss, every term keeping its weight (the reference);
    # "per_step": 1/K on the predictions past step 0 only (MuZero appendix G's reading).
    c.unroll_gradient_scale = "whole"
    # MuZero's absorbing state past a terminal (value 0, reward 0, a uniform policy, the head's
    # 1); "masked" is the reference's (nothing after the terminal is trained). `from_muzero`
    # carries the MuZero config's.
    c.past_end_targets = "absorbing"
    # The acting schedule is MuZero's (`temperature_decay_updates`), over MuZero's 8,000
    # learner updates; the reference spreads it over its whole training.
    # Search: the reference's tree-wide min-max of Q and parent-mean Q for unvisited children.
    c.q_transform = "tree_min_max"
    c.unvisited_q = "parent_mean"
    # Priority Refresh (SpeedyZero): every refresh_interval updates (0: never), all stored
    # positions' priorities are recomputed, refresh_batch windows at a time.
    c.refresh_interval = 0
    c.refresh_batch = 256  # windows recomputed at a time
    # Optimiser: "adamw" (with global-norm clipping) or "clipped_lars" (global-norm clipping,
    # then the clipped trust ratio, momentum and the learning rate).
    c.optimizer = "adamw"
    c.lars_eta = 0.001  # LARS trust coefficient
    c.lars_momentum = 0.9  # LARS momentum coefficient
    return c


# MuZero fields whose EfficientZero value is the reference's own choice, kept by
# `from_muzero` instead of the MuZero config's (each documented in docs/efficientzero.md).
OWN_SETTINGS = ("name", "q_transform", "unvisited_q")


def from_muzero(muzero_config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """EfficientZero's config with the value of every field of `muzero_config` (networks,
    search, replay, optimiser, n, Reanalyse share, ...) except `OWN_SETTINGS`, so that an
    EfficientZero experiment and the MuZero one it builds on differ only in what
    EfficientZero adds; its own fields keep their defaults. Set them, and any field to
    differ from MuZero's, afterwards, where a reader sees it."""
    config = default_config()
    for field, value in muzero_config.items():
        if field not in OWN_SETTINGS:
            config[field] = value
    return config


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """The optimiser `config.optimizer`, its hyperparameters held in its state."""
    if config.optimizer == "adamw":
        return muzero.make_optimizer(config)
    require_one_of("agent.optimizer", config.optimizer, OPTIMIZERS)

    def chain(learning_rate, max_grad_norm, weight_decay):
        return optax.chain(optax.clip_by_global_norm(max_grad_norm),
                           optim.clipped_lars(learning_rate, eta=config.lars_eta,
                                              momentum=config.lars_momentum,
                                              weight_decay=weight_decay))

    return optax.inject_hyperparams(chain)(
        **{name: float(config[name]) for name in OPTIMIZER_HPARAMS})


def set_hparams(learner_state: LearnerState, hparams: dict[str, Array]) -> LearnerState:
    return replace_hparams(learner_state, hparams, optimizer_hparams=OPTIMIZER_HPARAMS,
                           loss_hparams=LOSS_HPARAMS, agent_name="EfficientZero")


# EfficientZero's own number fields and what each must hold (MuZero's: `muzero.validate`).
NUMBER_FIELDS = {"lstm_size": ("count", 64), "projection_hidden": ("count", 128),
                 "projection_size": ("count", 128), "augment_shift": ("whole", 4),
                 "augment_intensity": ("non_negative", 0.05), "lars_eta": ("positive", 1e-3),
                 "lars_momentum": ("fraction", 0.9), "consistency_cost": ("finite", 2.0),
                 "refresh_interval": ("whole", 0), "refresh_batch": ("count", 256),
                 "value_prefix_horizon": ("count", 5),
                 "consistency_warmup_updates": ("whole", 4000),
                 "td_age_interval": ("whole", 30000), "td_steps_min": ("count", 1)}


def validate(config: ml_collections.ConfigDict) -> None:
    """Raises `ConfigError` naming the first EfficientZero field that cannot work."""
    muzero.validate(config)
    check_numbers(config, "agent", NUMBER_FIELDS)
    muzero.check_choices(config, {"optimizer": OPTIMIZERS, "consistency_norm": CONSISTENCY_NORMS,
                                  "augment_draws": learning.AUGMENT_DRAWS,
                                  "unroll_gradient_scale": learning.GRADIENT_SCALES})
    if config.td_steps_min > config.td_steps:
        raise ConfigError("agent.td_steps_min", f"is {config.td_steps_min}",
                          f"use 1 .. td_steps ({config.td_steps})")


def learn_config(config: ml_collections.ConfigDict) -> learning.LearnConfig:
    """The learner's static settings: MuZero's (`agents.muzero.learn_config`) and `config`'s
    EfficientZero fields of the same names."""
    return learning.LearnConfig(
        muzero=muzero.learn_config(config), value_prefix=config.value_prefix,
        value_prefix_horizon=config.value_prefix_horizon, lstm_size=config.lstm_size,
        consistency=config.consistency,
        consistency_to_representation=config.consistency_to_representation,
        consistency_warmup_updates=config.consistency_warmup_updates,
        td_steps_min=config.td_steps_min,
        td_age_interval=config.td_age_interval, augment=config.augment,
        augment_shift=config.augment_shift, augment_intensity=config.augment_intensity,
        augment_draws=config.augment_draws, unroll_gradient_scale=config.unroll_gradient_scale,
        refresh_interval=config.refresh_interval, refresh_batch=config.refresh_batch,
        rollout_length=config.rollout_length)


# What the agent chose for its fields left to it (registered as `choices`): MuZero's network,
# widths and whether frames are stored once.
choices = muzero.choices


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the EfficientZero agent for environments with one discrete action per step:
    its search and `learning.py`'s functions bound to the network, optimiser, replay and
    settings of `config`."""
    validate(config)
    network: EfficientZeroNetwork = make_ez_network(config, env_spec)
    optimizer = make_optimizer(config)
    replay, example_step, history = muzero.make_replay(
        config, env_spec, extra_fields={"collected_at": jax.ShapeDtypeStruct((), jnp.int32)})
    search_settings, learn = muzero.search_config(config), learn_config(config)
    loss_hparams = {k: config[k] for k in LOSS_HPARAMS}

    # The actors receive the network's parameters and the acting temperature in force.
    actor_params = muzero.make_actor_params(config)
    search = lambda params, observation, key, evaluation: run_search(
        network, params["network"], observation, key, search_settings,
        value_prefix=learn.value_prefix, value_prefix_horizon=learn.value_prefix_horizon,
        lstm_size=learn.lstm_size, evaluation=evaluation, temperature=params["temperature"])
    init = lambda key, spec=env_spec: muzero.init_learner_state(
        network, optimizer, replay, example_step, loss_hparams, key, spec)
    learner_step = functools.partial(
        learning.learner_step, network, optimizer, replay, learn, history=history,
        frames_once=muzero.stores_frames_once(config, env_spec),
        metric_names=METRIC_NAMES + (("terminal_loss",) if config.terminal_head else ()))

    return Agent(
        init=init,
        actor_step=muzero.make_actor_step(search, kind=config.search),
        learner_step=learner_step,
        init_actor_state=lambda batch_size: (),
        actor_params=actor_params,
        set_hparams=set_hparams,
        sweepable=SWEEPABLE,
    )
