"""EfficientZero (Ye et al., 2021) on MuZero's package, with SpeedyZero's Priority Refresh and
Clipped LARS: value prefix, self-supervised consistency, off-policy correction, Reanalyse,
augmentation. New modules only; MuZero's networks, search, targets and learner are reused."""

from agents.efficientzero.agent import (
    LOSS_HPARAMS,
    METRIC_NAMES,
    OPTIMIZER_HPARAMS,
    SWEEPABLE,
    default_config,
    from_muzero,
    make_agent,
    make_optimizer,
    set_hparams,
    validate,
)
from agents.efficientzero.learning import (
    augment,
    consistency_loss,
    learner_update,
    refresh_priorities,
    same_episode,
    scale_gradient,
    td_horizon,
    unroll_model,
    value_prefix_targets,
    window_priorities,
)
from agents.efficientzero.networks import (
    EfficientZeroNetwork,
    initial_carry,
    make_ez_network,
    reset_carry,
)
from agents.efficientzero.search import make_recurrent_fn, root_output, run_search

__all__ = [
    "LOSS_HPARAMS",
    "METRIC_NAMES",
    "OPTIMIZER_HPARAMS",
    "SWEEPABLE",
    "EfficientZeroNetwork",
    "augment",
    "consistency_loss",
    "default_config",
    "from_muzero",
    "initial_carry",
    "learner_update",
    "make_agent",
    "make_ez_network",
    "make_optimizer",
    "make_recurrent_fn",
    "refresh_priorities",
    "reset_carry",
    "root_output",
    "run_search",
    "same_episode",
    "scale_gradient",
    "set_hparams",
    "td_horizon",
    "unroll_model",
    "validate",
    "value_prefix_targets",
    "window_priorities",
]
