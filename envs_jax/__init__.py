"""JAX-native environments for Anakin: the API, wrappers, native games and a registry."""

from envs_jax.base import Environment, Wrapper
from envs_jax.catch import Catch, CatchState
from envs_jax.registry import make, register, registered
from envs_jax.wrappers import AutoReset, EpisodeStatistics, TimeLimit, wrap_for_training

register("catch", Catch)

__all__ = [
    "AutoReset",
    "Catch",
    "CatchState",
    "Environment",
    "EpisodeStatistics",
    "TimeLimit",
    "Wrapper",
    "make",
    "register",
    "registered",
    "wrap_for_training",
]
