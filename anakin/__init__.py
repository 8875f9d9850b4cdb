"""Anakin: whole agent-environment-update programs compiled and replicated over devices."""

from anakin.config import default_config, sweep_runs, validate
from anakin.programs import (
    RunnerState,
    episode_statistics,
    make_evaluator,
    make_programs,
    make_rollout,
)
from anakin.runner import TrainResult, train

__all__ = ["RunnerState", "TrainResult", "default_config", "episode_statistics",
           "make_evaluator", "make_programs", "make_rollout", "sweep_runs", "train", "validate"]
