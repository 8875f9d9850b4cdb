"""PQN (Gallici et al., 2024): Q-learning without replay or target network, on Q(lambda)
targets of the runners' parallel trajectories, with a LayerNorm Q-network (docs/dqn.md).
Built from the DQN family's pieces (`agents.dqn`)."""

from agents.pqn.agent import (
    INTRODUCED,
    SWEEPABLE,
    choices,
    default_config,
    make_agent,
    make_optimizer,
    set_hparams,
)
from agents.pqn.learning import LearnConfig, LearnerState, learner_step, minibatch_loss, targets

__all__ = ["INTRODUCED", "SWEEPABLE", "LearnConfig", "LearnerState", "choices",
           "default_config", "learner_step", "make_agent", "make_optimizer", "minibatch_loss",
           "set_hparams", "targets"]
