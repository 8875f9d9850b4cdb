"""MuZero (Schrittwieser et al., 2020) with mctx search and an on-device replay of positions.

The pieces are top-level pure functions that another agent (EfficientZero) imports:
networks, search (`make_recurrent_fn`, `run_search`), targets, losses and the learner update;
`make_agent` assembles them.
"""

from agents.muzero.agent import (
    LOSS_HPARAMS,
    METRIC_NAMES,
    OPTIMIZER_HPARAMS,
    SWEEPABLE,
    check_trajectory,
    default_config,
    init_learner_state,
    make_actor_step,
    make_agent,
    make_optimizer,
    make_replay,
    set_hparams,
    stores_frames_once,
)
from agents.muzero.learning import (
    LearnerState,
    apply_gradients,
    batch_targets,
    importance_exponent,
    learner_step,
    learner_update,
    observations_at,
    sample_beta,
    sample_positions,
    to_replay_steps,
)
from agents.muzero.losses import LossOutput, UnrollOutput, unroll_loss, unroll_model
from agents.muzero.networks import MuZeroNetwork, make_network, normalise_latent
from agents.muzero.search import (
    make_recurrent_fn,
    root_output,
    run_search,
    search_with,
    value_to_scalar,
)
from agents.muzero.targets import (
    UnrollTargets,
    bootstrap_indices,
    frame_stack,
    n_step_values,
    probs_to_scalar,
    scalar_to_probs,
    stack_restarts,
    unroll_targets,
)

__all__ = [
    "LOSS_HPARAMS",
    "METRIC_NAMES",
    "OPTIMIZER_HPARAMS",
    "SWEEPABLE",
    "LearnerState",
    "LossOutput",
    "MuZeroNetwork",
    "UnrollOutput",
    "UnrollTargets",
    "apply_gradients",
    "batch_targets",
    "bootstrap_indices",
    "check_trajectory",
    "default_config",
    "frame_stack",
    "importance_exponent",
    "init_learner_state",
    "learner_step",
    "learner_update",
    "make_actor_step",
    "make_agent",
    "make_network",
    "make_optimizer",
    "make_recurrent_fn",
    "make_replay",
    "n_step_values",
    "normalise_latent",
    "observations_at",
    "probs_to_scalar",
    "root_output",
    "run_search",
    "sample_beta",
    "sample_positions",
    "scalar_to_probs",
    "search_with",
    "set_hparams",
    "stack_restarts",
    "stores_frames_once",
    "to_replay_steps",
    "unroll_loss",
    "unroll_model",
    "unroll_targets",
    "value_to_scalar",
]
