"""The DQN family: Double DQN with n-step returns, a target network and epsilon-greedy acting,
on an on-device transition replay (uniform or prioritised), with an optional C51 head
(docs/dqn.md).

Split by role into top-level pure functions: Q-networks (`networks.py`), losses
(`losses.py`), acting and the learner step (`learning.py`); `make_agent` assembles them.
"""

from agents.dqn.agent import (
    INTRODUCED,
    SWEEPABLE,
    choices,
    default_config,
    learn_config,
    make_agent,
    make_optimizer,
    set_hparams,
)
from agents.dqn.learning import (
    LearnConfig,
    LearnerState,
    actor_step,
    batch_targets,
    epsilon_at,
    learner_step,
    learner_update,
    to_replay_steps,
)
from agents.dqn.losses import categorical_loss, double_q_loss, q_lambda_targets
from agents.dqn.networks import QNetwork, make_network

__all__ = [
    "INTRODUCED",
    "SWEEPABLE",
    "LearnConfig",
    "LearnerState",
    "QNetwork",
    "actor_step",
    "batch_targets",
    "categorical_loss",
    "choices",
    "default_config",
    "double_q_loss",
    "epsilon_at",
    "learn_config",
    "learner_step",
    "learner_update",
    "make_agent",
    "make_network",
    "make_optimizer",
    "q_lambda_targets",
    "set_hparams",
    "to_replay_steps",
]
