"""The PPO agent (Schulman et al., 2017) as the pure functions of `podracer.agent.Agent`.

One `learner_step` is one PPO iteration on a `[T+1, B]` trajectory:

    # TARGETS, once, with the parameters theta_0 the step starts from
    advantages A, value targets R (GAE(lambda); "corrected": truncated importance ratios)
    A <- (A - mean) / std over the real transitions of the global batch (pmean over devices)
    # OPTIMISE
    repeat num_epochs times (lax.scan), each with a fresh permutation from the learner's key:
        repeat num_minibatches times (lax.scan):
            gradient of  clipped surrogate + value_cost * value loss - entropy_cost * entropy
            pmean'd over devices, clipped to max_grad_norm, Adam at the annealed rate

Off-policy data. Under Anakin the rollout is on-policy: the actor used theta_0. Under
Sebulba with a policy lag the actor's policy mu is older than theta_0; `off_policy` says what
to do (docs/ppo.md):
  - "plain": PPO as if on-policy: the ratio's denominator is mu (the actor's log-probability,
    kept in the trajectory), the advantages are GAE on the actor's value estimates. With lag 0
    this is exactly the on-policy algorithm.
  - "corrected": the ratio's denominator is pi_0 = pi_theta_0, recomputed by the learner; the
    advantages are GAE with V-trace's truncated traces min(1, pi_0/mu), the value targets
    V-trace's, and each sample's surrogate is weighted by min(rho_bar, pi_0/mu) (decoupled
    PPO). With pi_0 = mu every correction is 1 and this is again the on-policy algorithm.
The metric `first_ratio_deviation` is max |r - 1| over the first minibatch of the first epoch,
before any update: 0 up to float rounding whenever the data is on-policy for the ratio.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from agents.actor_critic import LearnerState, init_learner_state
from agents.hparams import replace_hparams
from agents.ppo import losses, networks
from podracer.agent import Agent
from podracer.config import ConfigError
from podracer.types import Array, EnvSpec, Metrics, Params, PRNGKey, TimeStep, Trajectory

OPTIMIZER_HPARAMS = ("learning_rate", "adam_eps", "max_grad_norm")
LOSS_HPARAMS = ("discount", "gae_lambda", "clip_eps", "value_clip_eps", "value_cost",
                "entropy_cost", "clip_rho_threshold")
SWEEPABLE = OPTIMIZER_HPARAMS + LOSS_HPARAMS
OFF_POLICY = ("plain", "corrected")


def default_config() -> ml_collections.ConfigDict:
    """The agent's hyperparameters, one comment per field (PPO's usual Atari/classic values)."""
    c = ml_collections.ConfigDict()
    c.name = "ppo"
    c.torso = "auto"  # "auto" | "mlp" | "conv" | "resnet"
    c.hidden_sizes = (64, 64)  # MLP layer sizes (policy and value MLPs each)
    c.activation = "tanh"  # MLP activation: "tanh" | "relu"
    c.learning_rate = 2.5e-4  # Adam step size at the start
    c.adam_eps = 1e-5
    c.max_grad_norm = 0.5  # each minibatch gradient is clipped to this global norm
    # Learner steps over which the step size falls linearly to 0 (constant within a step);
    # 0 = constant. Configs tie it to the run length with field references.
    c.anneal_lr_updates = 0
    c.num_epochs = 4  # passes over each trajectory batch
    c.num_minibatches = 4  # per epoch, per device; must divide T x (environments per device)
    c.discount = 0.99  # gamma
    c.gae_lambda = 0.95  # lambda of GAE(lambda)
    c.clip_eps = 0.2  # the surrogate's ratio is clipped to [1 - eps, 1 + eps]
    c.value_clip_eps = 0.2  # the value may move this far from the old value; 0 = no clipping
    c.value_cost = 0.5
    c.entropy_cost = 0.01
    c.normalize_advantages = True  # over the global batch (every device and process)
    c.off_policy = "plain"  # stale data (Sebulba, lag > 0): "plain" | "corrected" (docs/ppo.md)
    c.clip_rho_threshold = 1.0  # "corrected": rho-bar, the cap on the weights pi_0/mu
    c.unroll_updates = False  # unroll the epoch/minibatch scans (conv nets on CPU: docs/ppo.md)
    return c


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Global-norm clipping then Adam, the step size annealed linearly to 0 over
    `anneal_lr_updates` learner steps (of num_epochs x num_minibatches optimiser steps each),
    with learning rate, epsilon and clipping norm held in the optimiser state."""
    steps_per_update = config.num_epochs * config.num_minibatches
    anneal = int(config.anneal_lr_updates)

    def fraction(count: Array) -> Array:
        if anneal <= 0:
            return jnp.ones((), jnp.float32)
        done = (count // steps_per_update).astype(jnp.float32)
        return jnp.clip(1.0 - done / anneal, 0.0, 1.0)

    def clipped_adam(learning_rate, adam_eps, max_grad_norm):
        return optax.chain(
            optax.clip_by_global_norm(max_grad_norm),
            optax.scale_by_adam(eps=adam_eps),
            optax.scale_by_schedule(fraction),
            optax.scale_by_learning_rate(learning_rate),
        )

    return optax.inject_hyperparams(clipped_adam)(
        **{name: float(config[name]) for name in OPTIMIZER_HPARAMS})


def set_hparams(learner_state: LearnerState, hparams: dict[str, Array]) -> LearnerState:
    """`learner_state` with the named hyperparameters (fields of `default_config()` listed in
    `SWEEPABLE`) replaced by `hparams`' values, which may be traced scalars."""
    return replace_hparams(learner_state, hparams, optimizer_hparams=OPTIMIZER_HPARAMS,
                           loss_hparams=LOSS_HPARAMS, agent_name="PPO")


def _check_config(config: ml_collections.ConfigDict) -> None:
    if config.off_policy not in OFF_POLICY:
        raise ConfigError("agent.off_policy", f"unknown value {config.off_policy!r}",
                          f"use one of {list(OFF_POLICY)}")
    if config.activation not in networks.ACTIVATIONS:
        raise ConfigError("agent.activation", f"unknown value {config.activation!r}",
                          f"use one of {sorted(networks.ACTIVATIONS)}")
    if config.torso not in networks.TORSOS:
        raise ConfigError("agent.torso", f"unknown value {config.torso!r}",
                          f"use one of {list(networks.TORSOS)}")
    for field in ("num_epochs", "num_minibatches"):
        if not isinstance(config[field], int) or config[field] < 1:
            raise ConfigError(f"agent.{field}", f"must be a whole number >= 1, got "
                              f"{config[field]!r}", f"set --config.agent.{field}=4")
    if config.anneal_lr_updates < 0:
        raise ConfigError("agent.anneal_lr_updates", f"must be >= 0, got "
                          f"{config.anneal_lr_updates}", "use 0 for a constant step size")


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the PPO agent for discrete or continuous ([D]-shaped) actions."""
    _check_config(config)
    network = networks.make_network(config, env_spec)
    continuous = networks.is_continuous(env_spec)
    optimizer = make_optimizer(config)
    corrected = config.off_policy == "corrected"
    num_epochs, num_minibatches = config.num_epochs, config.num_minibatches
    unroll = bool(config.unroll_updates)

    def apply(params: Params, observation: Array) -> tuple[Any, Array]:
        """The network over any leading axes: [..., *obs] -> policy [..., *], value [...]."""
        lead = observation.shape[:observation.ndim - len(env_spec.observation.shape)]
        flat = observation.reshape((-1,) + observation.shape[len(lead):])
        policy, value = network.apply(params, flat)
        return (jax.tree.map(lambda x: x.reshape(lead + x.shape[1:]), policy),
                value.reshape(lead))

    def init(key: PRNGKey, spec: EnvSpec = env_spec) -> LearnerState:
        return init_learner_state(network, optimizer, {k: config[k] for k in LOSS_HPARAMS},
                                  key, spec)

    def init_actor_state(batch_size: int) -> tuple[()]:
        del batch_size
        return ()

    def actor_params(learner_state: LearnerState) -> Params:
        return learner_state.params

    def actor_step(params, actor_state, timestep: TimeStep, key: PRNGKey, *, evaluation=False):
        policy, value = network.apply(params, timestep.observation)
        if evaluation:
            action = networks.mode(policy, continuous=continuous)
        else:
            action = networks.sample(policy, key, continuous=continuous)
        extras = {"log_prob": networks.log_prob(policy, action, continuous=continuous),
                  "value": value}
        return action, actor_state, extras

    # TARGETS -----------------------------------------------------------------------------

    def targets(params: Params, trajectory: Trajectory, hparams: dict[str, Array],
                axis_name: str | None) -> tuple[dict[str, Array], Metrics]:
        """Per-sample [T, B] inputs of the epochs: old log-probabilities and values,
        advantages (normalised), value targets, importance weights and the mask."""
        ts = trajectory.timestep
        mask = trajectory.transition_mask()
        behaviour_log_prob = trajectory.extras["log_prob"]
        kw = {"discount": hparams["discount"], "lambda_": hparams["gae_lambda"]}
        gae = jax.vmap(lambda r, d, v, m, rho: losses.gae_advantages(r, d, v, m,
                                                                     trace_ratios=rho, **kw),
                       in_axes=1, out_axes=1)
        if corrected:
            policy, values = apply(params, ts.observation)  # pi_0 and V_0 at x_0 .. x_T
            old_log_prob = networks.log_prob(jax.tree.map(lambda x: x[:-1], policy),
                                             trajectory.action, continuous=continuous)
            rhos = jnp.exp(old_log_prob - behaviour_log_prob)
            advantages = gae(ts.reward[1:], ts.discount[1:], values, mask, rhos)
            returns = jax.vmap(
                lambda *xs: losses.vtrace_value_targets(
                    *xs, clip_rho_threshold=hparams["clip_rho_threshold"], **kw),
                in_axes=1, out_axes=1)(ts.reward[1:], ts.discount[1:], values, mask, rhos)
            weights = jnp.minimum(hparams["clip_rho_threshold"], rhos)
        else:
            # The actor's values at x_0 .. x_{T-1}; x_T's is the learner's (not yet acted on).
            _, last_value = network.apply(params, ts.observation[-1])
            values = jnp.concatenate([trajectory.extras["value"], last_value[None]], axis=0)
            old_log_prob = behaviour_log_prob
            advantages = jax.vmap(
                lambda r, d, v, m: losses.gae_advantages(r, d, v, m, **kw),
                in_axes=1, out_axes=1)(ts.reward[1:], ts.discount[1:], values, mask)
            returns = advantages + values[:-1]
            weights = jnp.ones_like(advantages)
        values = jax.lax.stop_gradient(values)
        normalised, adv_mean, adv_std = losses.normalize_advantages(
            advantages, mask, axis_name=axis_name)
        if not config.normalize_advantages:
            normalised = advantages
        metrics = {"advantage_mean": adv_mean, "advantage_std": adv_std,
                   "importance_weight": jnp.sum(weights * mask) / jnp.maximum(mask.sum(), 1.0)}
        batch = {"observation": ts.observation[:-1], "action": trajectory.action,
                 "old_log_prob": jax.lax.stop_gradient(old_log_prob),
                 "old_value": values[:-1], "advantage": normalised, "return": returns,
                 "weight": weights, "mask": mask}
        return batch, metrics

    # OPTIMISATION ------------------------------------------------------------------------

    def loss_fn(params: Params, mb: dict[str, Array], hparams: dict[str, Array]):
        policy, value = apply(params, mb["observation"])
        log_prob = networks.log_prob(policy, mb["action"], continuous=continuous)
        surrogate = losses.clipped_surrogate_loss(
            log_prob, mb["old_log_prob"], mb["advantage"], mb["mask"], mb["weight"],
            clip_eps=hparams["clip_eps"])
        v_loss = losses.value_loss(value, mb["old_value"], mb["return"], mb["mask"],
                                   clip_eps=hparams["value_clip_eps"])
        count = jnp.maximum(jnp.sum(mb["mask"]), 1.0)
        ent = jnp.sum(networks.entropy(policy, continuous=continuous) * mb["mask"]) / count
        loss = surrogate.loss + hparams["value_cost"] * v_loss - hparams["entropy_cost"] * ent
        deviation = jnp.max(jnp.abs(jnp.exp(log_prob - mb["old_log_prob"]) - 1.0) * mb["mask"])
        return loss, {"loss": loss, "policy_loss": surrogate.loss, "value_loss": v_loss,
                      "entropy": ent, "clip_fraction": surrogate.clip_fraction,
                      "approx_kl": surrogate.approx_kl, "ratio_deviation": deviation}

    def learner_step(learner_state: LearnerState, trajectory: Trajectory, key: PRNGKey, *,
                     axis_name: str | None) -> tuple[LearnerState, Metrics]:
        t, b = trajectory.action.shape[:2]
        n = t * b
        if n % num_minibatches:
            raise ConfigError(
                "agent.num_minibatches",
                f"{num_minibatches} does not divide the {n} transitions (T={t} x {b} "
                "environments) each learner device receives",
                f"use a divisor of {n}, or change rollout_length or the number of environments")
        hparams = learner_state.hparams
        batch, target_metrics = targets(learner_state.params, trajectory, hparams, axis_name)
        flat = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]), batch)

        def minibatch_step(carry, mb):
            params, opt_state = carry
            grads, metrics = jax.grad(loss_fn, has_aux=True)(params, mb, hparams)
            if axis_name is not None:
                grads = jax.lax.pmean(grads, axis_name)
            metrics["grad_norm"] = optax.tree.norm(grads)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), metrics

        def epoch(carry, epoch_key):
            permutation = jax.random.permutation(epoch_key, n)
            minibatches = jax.tree.map(
                lambda x: jnp.take(x, permutation, axis=0).reshape(
                    (num_minibatches, n // num_minibatches) + x.shape[1:]), flat)
            return jax.lax.scan(minibatch_step, carry, minibatches,
                                unroll=num_minibatches if unroll else 1)

        (params, opt_state), metrics = jax.lax.scan(
            epoch, (learner_state.params, learner_state.opt_state),
            jax.random.split(key, num_epochs), unroll=num_epochs if unroll else 1)
        first_deviation = metrics.pop("ratio_deviation")[0, 0]
        metrics = {**jax.tree.map(jnp.mean, metrics), **target_metrics}
        if axis_name is not None:
            metrics = jax.lax.pmean(metrics, axis_name)
            first_deviation = jax.lax.pmax(first_deviation, axis_name)
        metrics["first_ratio_deviation"] = first_deviation
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
