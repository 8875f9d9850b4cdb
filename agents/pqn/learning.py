"""PQN's learning (Gallici et al., 2024) as top-level pure functions: no replay and no target
network; Q(lambda) targets over the runners' on-policy trajectory, then epochs of minibatch
updates on it, the way PPO uses its batch. Acting, the exploration schedule, the Q-network and
the Q(lambda) targets are the DQN family's (`agents.dqn`).

One learner step on a trajectory [T+1, B]:

    # TARGETS, once, with the parameters the step starts from
    G_t = c r_{t+1} + gamma d_{t+1} ((1 - lambda) max_a Q(o_{t+1}, a) + lambda G_{t+1})   (cut at LAST; c: reward_scale)
    # OPTIMISE
    repeat num_epochs times (lax.scan), each with a fresh permutation of the T x B transitions:
        repeat num_minibatches times (lax.scan):
            gradient of mean over real transitions of (Q(o_t, a_t) - G_t)^2 / 2
            pmean'd over devices, clipped, Adam
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import optax

from agents.dqn.learning import apply_gradients
from agents.dqn.losses import q_lambda_targets
from agents.dqn.networks import QNetwork
from podracer.config import ConfigError
from podracer.types import Array, Metrics, Params, PRNGKey, Trajectory


@chex.dataclass(frozen=True)
class LearnerState:
    params: Params
    opt_state: optax.OptState  # an `optax.InjectHyperparamsState`: the optimiser's hparams
    steps: Array  # [] int32 learner steps so far (the exploration schedule's clock)
    hparams: dict[str, Array]  # {name: [] float32} the loss's hyperparameters


@dataclasses.dataclass(frozen=True)
class LearnConfig:
    """PQN's static settings: the agent config's fields of the same names."""

    num_epochs: int
    num_minibatches: int


def _flat(x: Array) -> Array:
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def targets(network: QNetwork, params: Params, trajectory: Trajectory, *, gamma: Array,
            lambda_: Array, reward_scale: Array = 1.0) -> Array:
    """[T, B] the Q(lambda) targets of a trajectory with `params` (`dqn.q_lambda_targets`),
    on rewards multiplied by `reward_scale`."""
    ts = trajectory.timestep
    q, _ = network.apply(params, _flat(ts.observation[1:]))
    q_t = q.reshape(ts.reward[1:].shape + q.shape[-1:])
    return q_lambda_targets(reward_scale * ts.reward[1:], ts.discount[1:], ts.last()[1:], q_t, gamma=gamma,
                            lambda_=lambda_)


def minibatch_loss(network: QNetwork, params: Params, observation: Array, action: Array,
                   target: Array, mask: Array) -> tuple[Array, Array]:
    """The mean of (Q(o, a) - G)^2 / 2 over the real transitions (`mask`), and the mean Q."""
    q, _ = network.apply(params, observation)
    q_a = jnp.take_along_axis(q, action[:, None], axis=-1)[:, 0]
    loss = jnp.sum(mask * 0.5 * (q_a - target) ** 2) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, jnp.mean(q_a)


def learner_step(network: QNetwork, optimizer: optax.GradientTransformation,
                 learn: LearnConfig, state: LearnerState, trajectory: Trajectory,
                 key: PRNGKey, *, axis_name: str | None) -> tuple[LearnerState, Metrics]:
    """`Agent.learner_step`: Q(lambda) targets, then `num_epochs` x `num_minibatches`
    updates (each epoch's permutation from `key`; a remainder of the T x B transitions that
    does not divide is left out of that epoch). Metrics are averaged over the updates and
    over `axis_name`. Raises `ConfigError` when there are fewer transitions than minibatches."""
    hp = state.hparams
    g = targets(network, state.params, trajectory, gamma=hp["discount"], lambda_=hp["lambda_"],
                reward_scale=hp["reward_scale"])
    data = (_flat(trajectory.timestep.observation[:-1]),
            _flat(trajectory.action.astype(jnp.int32)), _flat(g),
            _flat(trajectory.transition_mask()))
    n = data[1].shape[0]
    size = n // learn.num_minibatches
    if size == 0:
        raise ConfigError(
            "agent.num_minibatches",
            f"{learn.num_minibatches} minibatches of the {n} transitions (T x environments) "
            "each learner device receives would be empty",
            f"use at most {n}, or change rollout_length or the number of environments")

    def minibatch(carry, idx):
        params, opt_state = carry
        batch = jax.tree.map(lambda x: x[idx], data)
        (loss, q_mean), grads = jax.value_and_grad(minibatch_loss, argnums=1, has_aux=True)(
            network, params, *batch)
        params, opt_state = apply_gradients(optimizer, params, opt_state, grads,
                                            axis_name=axis_name)
        return (params, opt_state), {"loss": loss, "q_mean": q_mean}

    def epoch(carry, epoch_key):
        order = jax.random.permutation(epoch_key, n)[:size * learn.num_minibatches]
        return jax.lax.scan(minibatch, carry, order.reshape(learn.num_minibatches, size))

    (params, opt_state), metrics = jax.lax.scan(
        epoch, (state.params, state.opt_state), jax.random.split(key, learn.num_epochs))
    metrics = jax.tree.map(jnp.mean, metrics)
    if axis_name is not None:
        metrics = jax.lax.pmean(metrics, axis_name)
    return state.replace(params=params, opt_state=opt_state, steps=state.steps + 1), metrics
