"""What the actor-critic agents (V-trace, PPO) share: their learner state, whose learner owns
parameters, an optimiser and nothing else, and its initialisation (MuZero's, which also holds
target parameters and a replay, is `agents.muzero.learning.LearnerState`); and the scaling of
their policy-gradient advantages, `agent.advantage_normalization`."""

from __future__ import annotations

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from podracer.types import Array, EnvSpec, Params, PRNGKey

# How the policy-gradient advantages are scaled (`agent.advantage_normalization`, the same
# field and meaning in V-trace and PPO): "none" leaves them in value units (divided by PopArt's
# sigma when PopArt is on); "batch" brings them to mean 0 and standard deviation 1 over the
# global batch (`normalize_advantages`).
ADVANTAGE_NORMALIZATIONS = ("none", "batch")


@chex.dataclass(frozen=True)
class LearnerState:
    """The learner state of an agent whose learner owns parameters, an optimiser and nothing
    else (V-trace, PPO)."""

    params: Params
    opt_state: optax.OptState  # an `optax.InjectHyperparamsState`: the optimiser's hparams
    updates: Array  # [] int32, learner steps applied so far
    hparams: dict[str, Array]  # {name: [] float32} the loss's hyperparameters


def init_learner_state(network: nn.Module, optimizer: optax.GradientTransformation,
                       loss_hparams: dict[str, float], key: PRNGKey,
                       spec: EnvSpec) -> LearnerState:
    """`network`'s parameters initialised from `key` on one observation of `spec`, the
    optimiser's state for them, no updates yet, and the loss's hyperparameters
    `loss_hparams` ({name: value}) as [] float32 arrays."""
    dummy = jnp.zeros((1,) + tuple(spec.observation.shape), spec.observation.dtype)
    params = network.init(key, dummy)
    return LearnerState(
        params=params,
        opt_state=optimizer.init(params),
        updates=jnp.zeros((), jnp.int32),
        hparams={k: jnp.asarray(v, jnp.float32) for k, v in loss_hparams.items()},
    )


def normalize_advantages(advantages: Array, mask: Array, *, axis_name: str | None,
                         eps: float = 1e-8) -> tuple[Array, Array, Array]:
    """(A - mean) / (std + eps) with the mean and standard deviation of the real transitions
    (`mask == 1`) of the *global* batch: every device's, through `pmean` over `axis_name`
    (`None`: this batch alone). Every device holds the same number of transitions, so the
    `pmean` of per-device sums divided by the `pmean` of per-device counts is the global mean.

    Returns the normalised advantages (masked entries are 0), the mean and the standard
    deviation.
    """
    mask = mask.astype(advantages.dtype)

    def global_mean(total, count):
        if axis_name is not None:
            total, count = jax.lax.pmean((total, count), axis_name)
        return total / jnp.maximum(count, 1.0)

    count = jnp.sum(mask)
    mean = global_mean(jnp.sum(advantages * mask), count)
    variance = global_mean(jnp.sum(jnp.square(advantages - mean) * mask), count)
    std = jnp.sqrt(variance)
    return (advantages - mean) / (std + eps) * mask, mean, std
