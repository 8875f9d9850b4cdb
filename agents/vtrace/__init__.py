"""IMPALA actor-critic with V-trace off-policy corrections (Espeholt et al., 2018).

Split by role into top-level pure functions: networks (`networks.py`), the loss
(`losses.py`), acting and the learner step (`learning.py`); `make_agent` assembles them.
"""

from agents.vtrace.agent import (
    INTRODUCED,
    SWEEPABLE,
    LearnerState,
    choices,
    default_config,
    make_agent,
    make_optimizer,
    set_hparams,
)
from agents.vtrace.learning import actor_step, learner_step, trajectory_loss
from agents.vtrace.losses import LossOutput, vtrace_loss
from agents.vtrace.networks import (
    ActorCritic,
    ConvTorso,
    MLPTorso,
    ResNetTorso,
    make_network,
)

__all__ = [
    "INTRODUCED",
    "SWEEPABLE",
    "ActorCritic",
    "ConvTorso",
    "LearnerState",
    "LossOutput",
    "MLPTorso",
    "ResNetTorso",
    "actor_step",
    "choices",
    "default_config",
    "learner_step",
    "make_agent",
    "make_network",
    "make_optimizer",
    "set_hparams",
    "trajectory_loss",
    "vtrace_loss",
]
