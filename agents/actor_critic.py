"""What the actor-critic agents (V-trace, PPO) share: their learner state, whose learner owns
parameters, an optimiser and nothing else, and its initialisation (MuZero's, which also holds
target parameters and a replay, is `agents.muzero.learning.LearnerState`); and the scaling of
their policy-gradient advantages, `agent.advantage_normalization`; and the MLP torso's width
when `agent.hidden_sizes` is left to the observations."""

from __future__ import annotations

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from podracer.config import ConfigError
from podracer.types import Array, EnvSpec, Params, PRNGKey

# How the policy-gradient advantages are scaled (`agent.advantage_normalization`, the same
# field and meaning in V-trace and PPO): "none" leaves them in value units (divided by PopArt's
# sigma when PopArt is on); "batch" brings them to mean 0 and standard deviation 1 over the
# global batch (`normalize_advantages`).
ADVANTAGE_NORMALIZATIONS = ("none", "batch")

# The MLP's layer sizes when `agent.hidden_sizes` is None (V-trace's and PPO's default), by
# observation kind: two layers of 64 for vectors and 2-D arrays (CartPole's 4 numbers, Catch's
# 10 x 5 board), two of 256 for images the MLP reads flattened (MinAtar's 10 x 10 x C boards,
# 400 inputs and more), the width of gymnax's MinAtar PPO baselines. The wider network learns
# MinAtar better and CartPole worse, hence the split (docs/results.md#v-trace-defaults). PPO
# takes 256 on boards with ReLU (`agents.ppo.networks.mlp_activation`): with tanh, 256 learns
# Asterix more slowly.
VECTOR_HIDDEN_SIZES = (64, 64)
IMAGE_HIDDEN_SIZES = (256, 256)


def is_board(spec: EnvSpec) -> bool:
    """Whether `spec`'s observations are images ([H, W, C]), which an MLP torso reads flattened
    (the "auto" torso gives only those smaller than the conv torso's receptive field an MLP)."""
    return len(spec.observation.shape) == 3


def mlp_hidden_sizes(hidden_sizes, spec: EnvSpec) -> tuple[int, ...]:
    """`agent.hidden_sizes` when set; else the default for `spec`'s observations (above)."""
    if hidden_sizes is not None:
        return tuple(int(size) for size in hidden_sizes)
    return IMAGE_HIDDEN_SIZES if is_board(spec) else VECTOR_HIDDEN_SIZES


def chosen_fields(torso: str, hidden_sizes, spec: EnvSpec) -> dict:
    """What V-trace and PPO chose (their `choices`), the parts they share: the torso "auto"
    chose, and the MLP's layer sizes when `agent.hidden_sizes` is left None (they shape only
    the MLP torso)."""
    fields: dict = {"torso": torso}
    if torso == "mlp" and hidden_sizes is None:
        fields["hidden_sizes"] = list(mlp_hidden_sizes(None, spec))
    return fields


def validate_hidden_sizes(hidden_sizes) -> None:
    """Raises a `ConfigError` unless `agent.hidden_sizes` is None or whole numbers >= 1."""
    if hidden_sizes is None:
        return
    sizes = tuple(hidden_sizes)
    if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                            for s in sizes):
        raise ConfigError("agent.hidden_sizes", f"must be layer sizes >= 1, got {sizes!r}",
                          "set e.g. --config.agent.hidden_sizes='(256, 256)', or leave it "
                          "None for the observations' default")


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
