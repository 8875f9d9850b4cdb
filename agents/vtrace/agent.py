"""The V-trace (IMPALA) agent as the three pure functions of `podracer.agent.Agent`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax

from agents.hparams import LearnerState, init_learner_state, replace_hparams
from agents.vtrace.losses import vtrace_loss
from agents.vtrace.networks import make_network
from podracer.agent import Agent
from podracer.types import Array, EnvSpec, Metrics, Params, PRNGKey, TimeStep, Trajectory

# Scalar hyperparameters that live in the learner state as arrays, so that one compiled program
# can run several values side by side (`jax.vmap` over runs; see `set_hparams`). The
# optimiser's are injected into its state by `optax.inject_hyperparams`; the loss's are in
# `LearnerState.hparams`.
OPTIMIZER_HPARAMS = ("learning_rate", "adam_eps", "max_grad_norm")
LOSS_HPARAMS = ("discount", "lambda_", "clip_rho_threshold", "clip_pg_rho_threshold",
                "baseline_cost", "entropy_cost")
SWEEPABLE = OPTIMIZER_HPARAMS + LOSS_HPARAMS


def default_config() -> ml_collections.ConfigDict:
    """The agent's hyperparameters, one comment per field."""
    c = ml_collections.ConfigDict()
    c.name = "vtrace"
    c.torso = "auto"  # "auto" | "mlp" | "conv" | "resnet"
    c.hidden_sizes = (64, 64)  # MLP torso layer sizes
    c.learning_rate = 1e-3  # Adam step size
    c.adam_eps = 1e-5
    c.max_grad_norm = 1.0  # gradients are clipped to this global norm
    c.discount = 0.99  # gamma
    c.lambda_ = 1.0  # V-trace trace-cutting lambda
    c.clip_rho_threshold = 1.0  # rho-bar in the paper
    c.clip_pg_rho_threshold = 1.0
    c.baseline_cost = 0.5
    c.entropy_cost = 0.01
    return c


def _clipped_adam(learning_rate: float, adam_eps: float,
                  max_grad_norm: float) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adam(learning_rate, eps=adam_eps),
    )


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Global-norm clipping then Adam, with its hyperparameters held in the optimiser state."""
    return optax.inject_hyperparams(_clipped_adam)(
        **{name: float(config[name]) for name in OPTIMIZER_HPARAMS}
    )


def set_hparams(learner_state: LearnerState, hparams: dict[str, Array]) -> LearnerState:
    """`learner_state` with the named hyperparameters (fields of `default_config()` listed in
    `SWEEPABLE`) replaced by `hparams`' values, which may be traced scalars."""
    return replace_hparams(learner_state, hparams, optimizer_hparams=OPTIMIZER_HPARAMS,
                           loss_hparams=LOSS_HPARAMS, agent_name="V-trace")


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the V-trace agent for environments with a discrete action spec."""
    network = make_network(config, env_spec)
    optimizer = make_optimizer(config)

    def init(key: PRNGKey, spec: EnvSpec = env_spec) -> LearnerState:
        return init_learner_state(network, optimizer, config, LOSS_HPARAMS, key, spec)

    def init_actor_state(batch_size: int) -> tuple[()]:
        del batch_size
        return ()

    def actor_params(learner_state: LearnerState) -> Params:
        return learner_state.params

    def actor_step(params, actor_state, timestep: TimeStep, key: PRNGKey, *, evaluation=False):
        logits, _ = network.apply(params, timestep.observation)
        if evaluation:
            action = jnp.argmax(logits, axis=-1)
        else:
            action = jax.random.categorical(key, logits)
        return action.astype(jnp.int32), actor_state, {"logits": logits}

    def loss_fn(params: Params, trajectory: Trajectory, hparams: dict[str, Array]):
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

    def learner_step(learner_state: LearnerState, trajectory: Trajectory, key: PRNGKey, *,
                     axis_name: str | None) -> tuple[LearnerState, Metrics]:
        del key  # V-trace's update is deterministic.
        grads, out = jax.grad(loss_fn, has_aux=True)(learner_state.params, trajectory,
                                                     learner_state.hparams)
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

    return Agent(
        init=init,
        actor_step=actor_step,
        learner_step=learner_step,
        init_actor_state=init_actor_state,
        actor_params=actor_params,
        set_hparams=set_hparams,
        sweepable=SWEEPABLE,
    )
