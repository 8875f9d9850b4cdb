"""V-trace's acting and learning as top-level pure functions of explicit arguments; `make_agent`
(`agent.py`) binds the network and optimiser to them:

    actor_step       sample (or, evaluating, take the argmax of) the policy's logits
    trajectory_loss  the network over a [T+1, B] trajectory, V-trace's loss averaged over B
    learner_step     gradient of the loss, pmean over devices, one optimiser step, metrics
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from agents.actor_critic import LearnerState
from agents.vtrace.losses import LossOutput, vtrace_loss
from podracer.types import Array, Extras, Metrics, Params, PRNGKey, TimeStep, Trajectory


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
                    hparams: dict[str, Array]) -> tuple[Array, LossOutput]:
    """([] loss, `LossOutput` of [] means): `vtrace_loss` of each of the B sequences of a
    `[T+1, B]` trajectory with the loss's hyperparameters `hparams`, averaged over B."""
    obs = trajectory.timestep.observation  # [T+1, B, ...]
    t, b = trajectory.action.shape
    logits, values = network.apply(params, obs[:-1].reshape((t * b,) + obs.shape[2:]))
    # x_T only bootstraps: its value enters V-trace's targets, through which no gradient
    # flows (rlax stops target gradients), so its forward pass needs no backward pass.
    _, bootstrap = network.apply(jax.lax.stop_gradient(params), obs[-1])
    logits = logits.reshape(t, b, -1)
    values = jnp.concatenate([values.reshape(t, b), bootstrap[None]])
    batched = jax.vmap(
        lambda *xs: vtrace_loss(*xs, **hparams),
        in_axes=1,
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
                 axis_name: str | None) -> tuple[LearnerState, Metrics]:
    """`Agent.learner_step`: one optimiser step on the gradient of `trajectory_loss` with the
    learner state's hyperparameters, gradients and metrics averaged over `axis_name`."""
    del key  # V-trace's update is deterministic.
    grads, out = jax.grad(functools.partial(trajectory_loss, network), has_aux=True)(
        learner_state.params, trajectory, learner_state.hparams)
    if axis_name is not None:
        grads = jax.lax.pmean(grads, axis_name)
    updates, opt_state = optimizer.update(grads, learner_state.opt_state,
                                          learner_state.params)
    params = optax.apply_updates(learner_state.params, updates)
    metrics = {
        "loss": out.loss,
        "policy_loss": out.policy_loss,
        "baseline_loss": out.baseline_loss,
        "entropy": out.entropy,
        "mean_rho": out.mean_rho,
        "grad_norm": optax.tree.norm(grads),
    }
    if axis_name is not None:
        metrics = jax.lax.pmean(metrics, axis_name)
    new_state = learner_state.replace(params=params, opt_state=opt_state,
                                      updates=learner_state.updates + 1)
    return new_state, metrics
