"""Anakin: whole agent-environment-update programs compiled and replicated over devices."""

from anakin.config import sweep_runs, validate
from anakin.runner import (
    RunnerState,
    TrainResult,
    episode_statistics,
    make_evaluator,
    make_programs,
    train,
)

__all__ = ["RunnerState", "TrainResult", "episode_statistics", "make_evaluator",
           "make_programs", "sweep_runs", "train", "validate"]
