"""Stochastic MuZero (Antonoglou et al., 2022) as the three pure functions of
`podracer.agent.Agent`, assembled from MuZero's pieces (replay, targets, value and reward
heads, learner loop, acting) and this package's additions: afterstates, chance outcomes and
the stochastic search. Where this agent departs from the paper, a field says so:

    encoder_input            the encoder reads (o_k, o_{k+1}) or o_{k+1} alone
    encoder_output           c^e as the encoder's last layer gives it, or its softmax
    chance_prior_to_encoder  sigma's cross-entropy trains the encoder too, or not
    q_transform, unvisited_q (MuZero's fields) PUCT's value term at decision nodes
    terminal_head            (MuZero's field) a terminal head on g, read by the search
"""

from __future__ import annotations

import functools
from types import MappingProxyType

import ml_collections

from agents import muzero
from agents.hparams import replace_hparams
from agents.muzero.learning import LearnerState
from agents.stochastic_muzero import learning
from agents.stochastic_muzero.networks import (
    ENCODER_INPUTS,
    ENCODER_OUTPUTS,
    StochasticMuZeroNetwork,
    make_stochastic_network,
)
from agents.stochastic_muzero.search import run_search
from podracer.agent import Agent
from podracer.config import ConfigError, check_numbers, require_whole
from podracer.types import Array, EnvSpec

OPTIMIZER_HPARAMS = muzero.OPTIMIZER_HPARAMS
LOSS_HPARAMS = muzero.LOSS_HPARAMS + ("afterstate_value_cost", "chance_cost",
                                      "commitment_cost")
SWEEPABLE = OPTIMIZER_HPARAMS + LOSS_HPARAMS
METRIC_NAMES = muzero.METRIC_NAMES + learning.METRIC_NAMES
# Fields added since the agent's first release, with the value that behaves as before: none.
INTRODUCED = MappingProxyType({})


def default_config() -> ml_collections.ConfigDict:
    """MuZero's fields (`agents.muzero.default_config`) and Stochastic MuZero's, one comment
    each. What differs from MuZero and from the paper: docs/stochastic_muzero.md."""
    c = muzero.default_config()
    c.name = "stochastic_muzero"  # the registered agent name
    c.search = "muzero"  # PUCT at decision nodes: mctx has no Gumbel search with chance nodes
    # Simulations per search. Each expands a state or an afterstate, so twice MuZero's 16
    # expand about as many states as MuZero's search.
    c.num_simulations = 32
    c.num_chance_outcomes = 8  # C: the codebook's one-hot codes (the paper: 32)
    # The chance encoder's input: "pair" (o_k and o_{k+1}; the paper's o_<=k+1 cut to its two
    # newest) or "next" (o_{k+1} alone).
    c.encoder_input = "pair"
    # c^e, the vector quantised to the nearest one-hot code: "linear" (the encoder's last
    # layer) or "softmax" (its softmax, so the commitment loss compares probabilities).
    c.encoder_output = "linear"
    c.encoder_hidden_sizes = None  # the encoder's hidden layers; None: `hidden_sizes`'
    c.afterstate_value_cost = 1.0  # weight of the afterstate value (Q) loss
    c.chance_cost = 1.0  # weight of sigma's cross-entropy against the encoder's code
    c.commitment_cost = 1.0  # beta: weight of ||c - c^e||^2
    # True: sigma's cross-entropy also trains the encoder through the straight-through code;
    # False: the code is its fixed target, and the encoder learns from g's losses and beta.
    c.chance_prior_to_encoder = False
    return c


def set_hparams(learner_state: LearnerState, hparams: dict[str, Array]) -> LearnerState:
    return replace_hparams(learner_state, hparams, optimizer_hparams=OPTIMIZER_HPARAMS,
                           loss_hparams=LOSS_HPARAMS, agent_name="Stochastic MuZero")


def validate(config: ml_collections.ConfigDict) -> None:
    """Raises `ConfigError` naming the first Stochastic MuZero field that cannot work."""
    muzero.validate(config)
    if config.search != "muzero":
        raise ConfigError("agent.search", f"is {config.search!r}",
                          "use 'muzero' (PUCT): mctx's stochastic search has no Gumbel variant")
    muzero.check_choices(config, {"encoder_input": ENCODER_INPUTS,
                                  "encoder_output": ENCODER_OUTPUTS})
    require_whole("agent.num_chance_outcomes", config.num_chance_outcomes, 1, 8,
                  fix="set e.g. --config.agent.num_chance_outcomes=8 (the paper: 32)")
    check_numbers(config, "agent", {"afterstate_value_cost": ("non_negative", 1.0),
                                    "chance_cost": ("non_negative", 1.0),
                                    "commitment_cost": ("non_negative", 1.0)})
    sizes = config.encoder_hidden_sizes
    if sizes is not None:
        try:
            widths = list(sizes)
        except TypeError:
            widths = []
        if not widths or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                                 for s in widths):
            raise ConfigError("agent.encoder_hidden_sizes", f"is {sizes!r}",
                              "use widths >= 1, e.g. (64,), or None for `hidden_sizes`'")


def learn_config(config: ml_collections.ConfigDict) -> learning.LearnConfig:
    """The learner's static settings: MuZero's (`agents.muzero.learn_config`) and `config`'s
    Stochastic MuZero fields of the same names."""
    return learning.LearnConfig(muzero=muzero.learn_config(config),
                                prior_to_encoder=bool(config.chance_prior_to_encoder),
                                rollout_length=config.rollout_length)


# What the agent chose for its fields left to it (registered as `choices`): MuZero's network,
# widths and whether frames are stored once.
choices = muzero.choices


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the Stochastic MuZero agent for environments with one discrete action per step:
    its search and `learning.py`'s functions bound to the network, optimiser, replay and
    settings of `config`."""
    validate(config)
    network: StochasticMuZeroNetwork = make_stochastic_network(config, env_spec)
    optimizer = muzero.make_optimizer(config)
    replay, example_step, history = muzero.make_replay(config, env_spec)
    search_settings, learn = muzero.search_config(config), learn_config(config)
    loss_hparams = {k: config[k] for k in LOSS_HPARAMS}

    search = lambda params, observation, key, evaluation: run_search(
        network, params["network"], observation, key, search_settings, evaluation=evaluation,
        temperature=params["temperature"])
    init = lambda key, spec=env_spec: muzero.init_learner_state(
        network, optimizer, replay, example_step, loss_hparams, key, spec)
    learner_step = functools.partial(
        learning.learner_step, network, optimizer, replay, learn, history=history,
        frames_once=muzero.stores_frames_once(config, env_spec),
        metric_names=METRIC_NAMES + (("terminal_loss",) if config.terminal_head else ()))

    return Agent(
        init=init,
        actor_step=muzero.make_actor_step(search, kind="muzero"),
        learner_step=learner_step,
        init_actor_state=lambda batch_size: (),
        actor_params=muzero.make_actor_params(config),
        set_hparams=set_hparams,
        sweepable=SWEEPABLE,
    )
