"""MuZero (Schrittwieser et al., 2020) with mctx search and on-device replay."""

from agents.muzero.agent import LearnerState, default_config, make_agent, make_recurrent_fn
from agents.muzero.networks import MuZeroNetwork, make_network, normalise_latent
from agents.muzero.targets import (
    n_step_values,
    probs_to_scalar,
    rebuild_frame_stacks,
    scalar_to_probs,
)

__all__ = [
    "LearnerState",
    "MuZeroNetwork",
    "default_config",
    "make_agent",
    "make_network",
    "make_recurrent_fn",
    "n_step_values",
    "normalise_latent",
    "probs_to_scalar",
    "rebuild_frame_stacks",
    "scalar_to_probs",
]
