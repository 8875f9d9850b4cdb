"""PPO (Schulman et al., 2017): clipped surrogate, GAE(lambda), epochs of minibatches; discrete
and Gaussian policies; plain or importance-corrected on stale Sebulba data (docs/ppo.md).

Split by role into top-level pure functions: networks and distributions (`networks.py`),
losses (`losses.py`), acting and the learner step (`learning.py`); `make_agent` assembles
them.
"""

from agents.ppo.agent import (
    INTRODUCED,
    OFF_POLICY,
    SWEEPABLE,
    LearnerState,
    choices,
    default_config,
    learn_config,
    make_agent,
    make_optimizer,
    set_hparams,
)
from agents.ppo.learning import (
    LearnConfig,
    actor_step,
    learner_step,
    minibatch_loss,
    optimise,
    targets,
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
    "INTRODUCED",
    "OFF_POLICY",
    "PPOMLP",
    "SWEEPABLE",
    "LearnConfig",
    "LearnerState",
    "PPONetwork",
    "SurrogateOutput",
    "actor_step",
    "choices",
    "clipped_surrogate_loss",
    "default_config",
    "gae_advantages",
    "learn_config",
    "learner_step",
    "make_agent",
    "make_network",
    "make_optimizer",
    "minibatch_loss",
    "normalize_advantages",
    "optimise",
    "set_hparams",
    "targets",
    "value_loss",
    "vtrace_value_targets",
]
