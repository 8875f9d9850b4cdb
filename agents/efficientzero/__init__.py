"""EfficientZero (Ye et al., 2021) on MuZero's package, with SpeedyZero's Priority Refresh and
Clipped LARS: value prefix, self-supervised consistency, off-policy correction, Reanalyse,
augmentation. New modules only; MuZero's networks, search, targets and learner are reused.
Static settings are explicit arguments or the frozen `LearnConfig`, which `learn_config`
builds from the agent's config."""

from agents.efficientzero.agent import (
    LOSS_HPARAMS,
    METRIC_NAMES,
    OPTIMIZER_HPARAMS,
    OWN_SETTINGS,
    SWEEPABLE,
    default_config,
    from_muzero,
    learn_config,
    make_agent,
    make_optimizer,
    set_hparams,
    validate,
)
from agents.efficientzero.learning import (
    LearnConfig,
    augment,
    augment_unroll,
    consistency_loss,
    consistency_weight,
    learner_step,
    learner_update,
    per_step_scale,
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
from agents.muzero.agent import temperature_at  # the schedule EfficientZero's reference uses

__all__ = [
    "LOSS_HPARAMS",
    "METRIC_NAMES",
    "OPTIMIZER_HPARAMS",
    "OWN_SETTINGS",
    "SWEEPABLE",
    "EfficientZeroNetwork",
    "LearnConfig",
    "augment",
    "augment_unroll",
    "consistency_loss",
    "consistency_weight",
    "default_config",
    "from_muzero",
    "initial_carry",
    "learn_config",
    "learner_step",
    "learner_update",
    "make_agent",
    "make_ez_network",
    "make_optimizer",
    "make_recurrent_fn",
    "per_step_scale",
    "refresh_priorities",
    "reset_carry",
    "root_output",
    "run_search",
    "same_episode",
    "scale_gradient",
    "set_hparams",
    "td_horizon",
    "temperature_at",
    "unroll_model",
    "validate",
    "value_prefix_targets",
    "window_priorities",
]
