"""PopArt value normalisation (van Hasselt et al., 2016; Hessel et al., 2019), shared by the
actor-critic agents (V-trace, PPO).

The value head predicts a normalised value n(x); the agent's value is sigma n(x) + mu, with mu
and sigma running estimates of the value targets' mean and standard deviation:

    ART  after each learner step the moments move towards the global batch's by beta:
             mu <- (1 - beta) mu + beta mean(targets),  nu <- (1 - beta) nu + beta mean(targets^2)
         sigma = sqrt(nu - mu^2), clipped to [min_scale, max_scale]
    POP  the head's last layer (w, b) is rescaled so that sigma n(x) + mu is unchanged:
             w' = w sigma / sigma',  b' = (sigma b + mu - mu') / sigma'

The statistics live in the learner state (`PopArtLearnerState`), are checkpointed with it, and
are the same on every device because the batch moments they move towards are pmean'd.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

from agents.actor_critic import LearnerState
from podracer.config import ConfigError
from podracer.types import Array, Params

MIN_SCALE = 1e-4  # sigma's clip (Hessel et al., 2019)
MAX_SCALE = 1e6


@chex.dataclass(frozen=True)
class PopArtStats:
    """PopArt's statistics of the value targets: the running first and second moments;
    sigma = sqrt(second - mean^2), clipped."""

    mean: Array  # [] mu
    second_moment: Array  # [] nu

    @staticmethod
    def init() -> PopArtStats:
        return PopArtStats(mean=jnp.zeros((), jnp.float32),
                           second_moment=jnp.ones((), jnp.float32))


@chex.dataclass(frozen=True)
class PopArtLearnerState(LearnerState):
    """An actor-critic learner state with PopArt's statistics (checkpointed with it, identical
    on every device since they are updated from pmean'd moments)."""

    popart: PopArtStats


def scale(stats: PopArtStats, *, min_scale: float = MIN_SCALE,
          max_scale: float = MAX_SCALE) -> Array:
    """sigma = sqrt(nu - mu^2), clipped to [min_scale, max_scale]."""
    variance = jnp.maximum(stats.second_moment - jnp.square(stats.mean), 0.0)
    return jnp.clip(jnp.sqrt(variance), min_scale, max_scale)


def update(stats: PopArtStats, target_mean: Array, target_sq_mean: Array,
           step_size: float) -> PopArtStats:
    """ART: the moments move towards the batch's (`target_*`, already global) by `step_size`."""
    return PopArtStats(
        mean=(1.0 - step_size) * stats.mean + step_size * target_mean,
        second_moment=(1.0 - step_size) * stats.second_moment + step_size * target_sq_mean)


def preserve(params: Params, old: PopArtStats, new: PopArtStats, *, head: str = "value",
             min_scale: float = MIN_SCALE, max_scale: float = MAX_SCALE) -> Params:
    """POP: the value head's last layer (`params["params"][head]`, the normalised output
    n(x) = w h + b) rescaled so that sigma n(x) + mu is unchanged by the new statistics."""
    sigma = scale(old, min_scale=min_scale, max_scale=max_scale)
    new_sigma = scale(new, min_scale=min_scale, max_scale=max_scale)
    layer = params["params"][head]
    layer = {**layer, "kernel": layer["kernel"] * sigma / new_sigma,
             "bias": (sigma * layer["bias"] + old.mean - new.mean) / new_sigma}
    return {**params, "params": {**params["params"], head: layer}}


def step_size_at(step_size: float, updates: Array, *, average_first: bool) -> Array | float:
    """The statistics' step size at the update that follows `updates` earlier ones: `step_size`
    (beta), or with `average_first` max(beta, 1 / (updates + 1)). The latter makes the
    statistics the plain average of the batches' moments over the first 1 / beta updates and
    the exponential average after, so that the initial mu = 0, nu = 1 carry no weight once one
    update is made. With a constant beta they weigh (1 - beta)^n after n updates: at beta =
    1e-3, 14% after 2,000 updates (a 1M-step run at Anakin's default batch), and sigma is
    then inflated by the distance of the targets from 0 (about |mean| sqrt(f (1 - f)), f =
    1 - (1 - beta)^n), not set by their spread."""
    if not average_first:
        return step_size
    return jnp.maximum(step_size, 1.0 / (updates.astype(jnp.float32) + 1.0))


def check_config(config) -> None:
    """Raises `ConfigError` naming the field unless `config.popart` is a bool and
    `config.popart_step_size` lies in (0, 1] (the agent config's fields of those names)."""
    if not isinstance(config.popart, bool):
        raise ConfigError("agent.popart", f"must be True or False, got {config.popart!r}",
                          "set --config.agent.popart=True")
    step_size = config.popart_step_size
    if (not isinstance(step_size, (int, float)) or isinstance(step_size, bool)
            or not 0.0 < step_size <= 1.0):
        raise ConfigError("agent.popart_step_size",
                          f"must be a number in (0, 1], got {step_size!r}",
                          "set --config.agent.popart_step_size=1e-3")
    if "popart_average_first" in config and not isinstance(config.popart_average_first, bool):
        raise ConfigError("agent.popart_average_first",
                          f"must be True or False, got {config.popart_average_first!r}",
                          "set --config.agent.popart_average_first=True")
