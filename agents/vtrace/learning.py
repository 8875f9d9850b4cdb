"""V-trace's acting and learning as top-level pure functions of explicit arguments; `make_agent`
(`agent.py`) binds the network and optimiser to them:

    actor_step       sample (or, evaluating, take the argmax of) the policy's logits
    trajectory_loss  the network over a [T+1, B] trajectory, V-trace's loss averaged over B
    learner_step     gradient of the loss, pmean over devices, one optimiser step, metrics
                     (and, with PopArt, the statistics' update and the value head's rescaling)
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from agents import popart
from agents.actor_critic import LearnerState
from agents.popart import PopArtStats
from agents.popart import step_size_at as popart_step_size_at
from agents.popart import update as popart_update
from agents.vtrace.losses import LossOutput, vtrace_loss
from podracer.types import Array, Extras, Metrics, Params, PRNGKey, TimeStep, Trajectory

SEQUENCE_AXIS = "sequences"  # the vmap over a trajectory's B sequences, for batch statistics


@dataclasses.dataclass(frozen=True)
class LearnConfig:
    """The static settings of V-trace's learner: the agent config's fields of the same names
    (built once by `make_agent`). The defaults are the plain IMPALA update."""

    advantage_normalization: str = "none"  # "none" | "batch": over the global batch
    popart: bool = False  # PopArt value normalisation: statistics in `PopArtLearnerState`
    popart_step_size: float = 3e-4  # beta, the statistics' exponential-averaging step
    popart_average_first: bool = False  # step max(beta, 1/(n+1)) at update n (popart.py)
    popart_min_scale: float = 1e-4  # sigma is clipped to [min, max] (Hessel et al., 2019)
    popart_max_scale: float = 1e6


def popart_scale(stats: PopArtStats, learn: LearnConfig) -> Array:
    """sigma = sqrt(nu - mu^2), clipped to [popart_min_scale, popart_max_scale]."""
    return popart.scale(stats, min_scale=learn.popart_min_scale,
                        max_scale=learn.popart_max_scale)


def popart_preserve(params: Params, old: PopArtStats, new: PopArtStats,
                    learn: LearnConfig) -> Params:
    """POP (`agents.popart.preserve`): the value head's last layer rescaled so that
    sigma n(x) + mu is unchanged by the new statistics."""
    return popart.preserve(params, old, new, min_scale=learn.popart_min_scale,
                           max_scale=learn.popart_max_scale)


def actor_step(network: nn.Module, params: Params, actor_state: tuple[()], timestep: TimeStep,
               key: PRNGKey, *, evaluation: bool = False
               ) -> tuple[Array, tuple[()], Extras]:
    """`Agent.actor_step`: an action sampled from `network`'s logits at each observation
    ([B, ...]), or the most likely one when `evaluating`; the logits go to the learner."""
    logits, _ = network.apply(params, timestep.observation)
    if evaluation:
        action = jnp.argmax(logits, axis=-1)
    else:
        action = jax.random.categorical(key, logits)
    return action.astype(jnp.int32), actor_state, {"logits": logits}


def trajectory_loss(network: nn.Module, params: Params, trajectory: Trajectory,
                    hparams: dict[str, Array], *, learn: LearnConfig = LearnConfig(),
                    popart: PopArtStats | None = None,
                    axis_name: str | None = None) -> tuple[Array, LossOutput]:
    """([] loss, `LossOutput` of [] means): `vtrace_loss` of each of the B sequences of a
    `[T+1, B]` trajectory with the loss's hyperparameters `hparams`, averaged over B. Batch
    statistics (advantage normalisation, the targets' moments) are pooled over the B sequences
    and the devices of `axis_name`. With PopArt statistics `popart`, the network's value is
    the normalised n(x) and the loss sees sigma n(x) + mu."""
    obs = trajectory.timestep.observation  # [T+1, B, ...]
    t, b = trajectory.action.shape
    logits, values = network.apply(params, obs[:-1].reshape((t * b,) + obs.shape[2:]))
    # x_T only bootstraps: its value enters V-trace's targets, through which no gradient
    # flows (rlax stops target gradients), so its forward pass needs no backward pass.
    _, bootstrap = network.apply(jax.lax.stop_gradient(params), obs[-1])
    logits = logits.reshape(t, b, -1)
    values = jnp.concatenate([values.reshape(t, b), bootstrap[None]])
    value_scale = 1.0
    if popart is not None:
        value_scale = popart_scale(popart, learn)
        values = values * value_scale + popart.mean
    stats_axes = SEQUENCE_AXIS if axis_name is None else (SEQUENCE_AXIS, axis_name)
    batched = jax.vmap(
        lambda *xs: vtrace_loss(*xs, **hparams, value_scale=value_scale,
                                normalize=learn.advantage_normalization == "batch",
                                stats_axis_name=stats_axes),
        in_axes=1,
        axis_name=SEQUENCE_AXIS,
    )
    out = batched(
        logits,
        values,
        trajectory.action,
        trajectory.extras["logits"],
        trajectory.timestep.reward[1:],
        trajectory.timestep.discount[1:],
        trajectory.transition_mask(),
    )
    out = jax.tree.map(jnp.mean, out)
    return out.loss, out


def learner_step(network: nn.Module, optimizer: optax.GradientTransformation,
                 learner_state: LearnerState, trajectory: Trajectory, key: PRNGKey, *,
                 axis_name: str | None, learn: LearnConfig = LearnConfig()
                 ) -> tuple[LearnerState, Metrics]:
    """`Agent.learner_step`: one optimiser step on the gradient of `trajectory_loss` with the
    learner state's hyperparameters, gradients and metrics averaged over `axis_name`. With
    PopArt (a `PopArtLearnerState`), the statistics then move towards the global batch's
    target moments and the value head is rescaled to preserve the unnormalised values."""
    del key  # V-trace's update is deterministic.
    popart = learner_state.popart if learn.popart else None
    grads, out = jax.grad(
        functools.partial(trajectory_loss, network, learn=learn, popart=popart,
                          axis_name=axis_name), has_aux=True)(
        learner_state.params, trajectory, learner_state.hparams)
    if axis_name is not None:
        grads = jax.lax.pmean(grads, axis_name)
    updates, opt_state = optimizer.update(grads, learner_state.opt_state,
                                          learner_state.params)
    params = optax.apply_updates(learner_state.params, updates)
    extra = {}
    if popart is not None:
        # out.target_* are pooled over every sequence and device: the same on every device.
        step_size = popart_step_size_at(learn.popart_step_size, learner_state.updates,
                                        average_first=learn.popart_average_first)
        new_popart = popart_update(popart, out.target_mean, out.target_sq_mean, step_size)
        params = popart_preserve(params, popart, new_popart, learn)
        extra = {"popart": new_popart}
    metrics = {
        "loss": out.loss,
        "policy_loss": out.policy_loss,
        "baseline_loss": out.baseline_loss,
        "entropy": out.entropy,
        "mean_rho": out.mean_rho,
        "grad_norm": optax.tree.norm(grads),
        "advantage_mean": out.advantage_mean,
        "advantage_std": out.advantage_std,
        "pg_logit_grad": out.pg_logit_grad,
        "entropy_logit_grad": out.entropy_logit_grad,
    }
    if popart is not None:
        metrics["popart_mean"] = popart.mean
        metrics["popart_scale"] = popart_scale(popart, learn)
    if axis_name is not None:
        metrics = jax.lax.pmean(metrics, axis_name)
    new_state = learner_state.replace(params=params, opt_state=opt_state,
                                      updates=learner_state.updates + 1, **extra)
    return new_state, metrics
