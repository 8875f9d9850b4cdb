"""PPO (Schulman et al., 2017): clipped surrogate, GAE(lambda), epochs of minibatches; discrete
and Gaussian policies; plain or importance-corrected on stale Sebulba data (docs/ppo.md)."""

from agents.ppo.agent import (
    OFF_POLICY,
    SWEEPABLE,
    LearnerState,
    default_config,
    make_agent,
    make_optimizer,
    set_hparams,
)
from agents.ppo.losses import (
    SurrogateOutput,
    clipped_surrogate_loss,
    gae_advantages,
    normalize_advantages,
    value_loss,
    vtrace_value_targets,
)
from agents.ppo.networks import PPOMLP, PPONetwork, make_network

__all__ = [
    "OFF_POLICY",
    "PPOMLP",
    "SWEEPABLE",
    "LearnerState",
    "PPONetwork",
    "SurrogateOutput",
    "clipped_surrogate_loss",
    "default_config",
    "gae_advantages",
    "make_agent",
    "make_network",
    "make_optimizer",
    "normalize_advantages",
    "set_hparams",
    "value_loss",
    "vtrace_value_targets",
]
