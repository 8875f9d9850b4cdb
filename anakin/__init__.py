"""Anakin: whole agent-environment-update programs compiled and replicated over devices."""

from anakin.config import validate
from anakin.runner import RunnerState, TrainResult, episode_statistics, make_programs, train

__all__ = ["RunnerState", "TrainResult", "episode_statistics", "make_programs", "train",
           "validate"]
