"""IMPALA actor-critic with V-trace off-policy corrections (Espeholt et al., 2018)."""

from agents.vtrace.agent import (
    SWEEPABLE,
    LearnerState,
    default_config,
    make_agent,
    make_optimizer,
    set_hparams,
)
from agents.vtrace.losses import LossOutput, vtrace_loss
from agents.vtrace.networks import (
    ActorCritic,
    ConvTorso,
    MLPTorso,
    ResNetTorso,
    make_network,
)

__all__ = [
    "SWEEPABLE",
    "ActorCritic",
    "ConvTorso",
    "LearnerState",
    "LossOutput",
    "MLPTorso",
    "ResNetTorso",
    "default_config",
    "make_agent",
    "make_network",
    "make_optimizer",
    "set_hparams",
    "vtrace_loss",
]
