"""Stochastic MuZero (Antonoglou et al., 2022) on MuZero's package: afterstates, a chance
encoder with a codebook of one-hot codes, and mctx's `stochastic_muzero_policy`. New modules
only; MuZero's replay, targets, value and reward heads, learner loop and acting are reused.
Static settings are explicit arguments or the frozen `LearnConfig`, which `learn_config`
builds from the agent's config."""

from agents.stochastic_muzero.agent import (
    INTRODUCED,
    LOSS_HPARAMS,
    METRIC_NAMES,
    OPTIMIZER_HPARAMS,
    SWEEPABLE,
    choices,
    default_config,
    learn_config,
    make_agent,
    set_hparams,
    validate,
)
from agents.stochastic_muzero.learning import LearnConfig, learner_step, learner_update
from agents.stochastic_muzero.losses import (
    ChanceLossOutput,
    StochasticUnrollOutput,
    chance_loss,
    code_entropy,
    transition_mask,
    unroll_model,
)
from agents.stochastic_muzero.networks import (
    StochasticMuZeroNetwork,
    make_stochastic_network,
    quantise,
)
from agents.stochastic_muzero.search import (
    make_chance_recurrent_fn,
    make_decision_recurrent_fn,
    run_search,
    search_with,
)

__all__ = [
    "INTRODUCED",
    "LOSS_HPARAMS",
    "METRIC_NAMES",
    "OPTIMIZER_HPARAMS",
    "SWEEPABLE",
    "ChanceLossOutput",
    "LearnConfig",
    "StochasticMuZeroNetwork",
    "StochasticUnrollOutput",
    "chance_loss",
    "choices",
    "code_entropy",
    "default_config",
    "learn_config",
    "learner_step",
    "learner_update",
    "make_agent",
    "make_chance_recurrent_fn",
    "make_decision_recurrent_fn",
    "make_stochastic_network",
    "quantise",
    "run_search",
    "search_with",
    "set_hparams",
    "transition_mask",
    "unroll_model",
    "validate",
]
