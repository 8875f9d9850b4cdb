"""JAX-native environments for Anakin: the API, wrappers, native games, adapters and a registry.

Native environments: `catch`, `stochastic_catch` (its ball drifts at random); bsuite-style
diagnostics `deep_sea`, `memory_chain`, `umbrella_chain`, `bandit`; classic control
`CartPole-v1`, `Acrobot-v1`, `MountainCar-v0`, `Pendulum-v1` (with gymnasium's time limits).
Adapted libraries, each behind an optional extra of the same name: `gymnax:<name>`,
`pgx:<name>`, `jumanji:<name>`, `brax:<name>`. See `envs_jax.registry`.
"""

from envs_jax.base import Environment, Wrapper
from envs_jax.catch import Catch, CatchState, stochastic_catch
from envs_jax.classic_control import MAX_EPISODE_STEPS, Acrobot, CartPole, MountainCar, Pendulum
from envs_jax.diagnostics import Bandit, DeepSea, MemoryChain, UmbrellaChain
from envs_jax.registry import (
    default_max_episode_steps,
    describe,
    make,
    missing_extra,
    namespaces,
    register,
    register_namespace,
    registered,
    registration_id,
)
from envs_jax.wrappers import (
    AutoReset,
    EpisodeStatistics,
    FlattenObservation,
    FrameStack,
    NormalizeObservation,
    TimeLimit,
    wrap_for_training,
)

register("catch", Catch)
register("stochastic_catch", stochastic_catch)
register("deep_sea", DeepSea)
register("memory_chain", MemoryChain)
register("umbrella_chain", UmbrellaChain)
register("bandit", Bandit)
register("CartPole-v1", CartPole, max_episode_steps=MAX_EPISODE_STEPS["CartPole-v1"])
register("Acrobot-v1", Acrobot, max_episode_steps=MAX_EPISODE_STEPS["Acrobot-v1"])
register("MountainCar-v0", MountainCar, max_episode_steps=MAX_EPISODE_STEPS["MountainCar-v0"])
register("Pendulum-v1", Pendulum, max_episode_steps=MAX_EPISODE_STEPS["Pendulum-v1"])

register_namespace("gymnax", library="gymnax", adapter="envs_jax.adapters.gymnax", extra="gymnax")
register_namespace("pgx", library="pgx", adapter="envs_jax.adapters.pgx", extra="pgx")
register_namespace(
    "jumanji", library="jumanji", adapter="envs_jax.adapters.jumanji", extra="jumanji"
)
register_namespace("brax", library="brax", adapter="envs_jax.adapters.brax", extra="brax")

__all__ = [
    "Acrobot",
    "AutoReset",
    "Bandit",
    "CartPole",
    "Catch",
    "CatchState",
    "DeepSea",
    "Environment",
    "EpisodeStatistics",
    "FlattenObservation",
    "FrameStack",
    "MemoryChain",
    "MountainCar",
    "NormalizeObservation",
    "Pendulum",
    "TimeLimit",
    "UmbrellaChain",
    "Wrapper",
    "default_max_episode_steps",
    "describe",
    "make",
    "missing_extra",
    "namespaces",
    "register",
    "register_namespace",
    "registered",
    "registration_id",
    "wrap_for_training",
]
