"""PPO's acting and learning as top-level pure functions of explicit arguments (the network,
the optimiser, a `LearnConfig` of static settings, the learner state's hyperparameters);
`make_agent` (`agent.py`) binds the first three:

    apply          the network over any leading axes of observations
    actor_step     sample (or, evaluating, take the mode of) the policy; keep log pi and V
    targets        once per step, with theta_0: advantages, value targets, weights, metrics
    minibatch_loss clipped surrogate + value_cost * value loss - entropy_cost * entropy
    optimise       epochs of shuffled minibatches, each a pmean'd gradient and optimiser step
    learner_step   one PPO iteration: targets, then `optimise`, metrics pmean'd over devices

`agent.py`'s docstring sets out the iteration and what `off_policy` does with stale data.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.flatten_util
import jax.numpy as jnp
import optax

from agents import popart
from agents.actor_critic import LearnerState
from agents.ppo import losses, networks
from podracer import scans
from podracer.config import ConfigError
from podracer.types import Array, Extras, Metrics, Params, PRNGKey, TimeStep, Trajectory


@dataclasses.dataclass(frozen=True)
class LearnConfig:
    """The static settings of PPO's learner: the agent config's fields of the same names, and
    what the environment's spec fixes (built once by `make_agent`)."""

    num_epochs: int  # passes over each trajectory batch
    num_minibatches: int  # per epoch, per device
    off_policy: str  # "plain" | "corrected"
    advantage_normalization: str  # "batch" | "none" (ADVANTAGE_NORMALIZATIONS)
    unroll_updates: bool  # unroll the epoch and minibatch scans
    continuous: bool  # the actions are a vector [D] (a Gaussian policy), not one integer
    observation_rank: int  # the rank of one observation, without leading axes
    popart: bool = False  # PopArt value normalisation: statistics in `PopArtLearnerState`
    popart_step_size: float = 1e-3  # beta, the statistics' exponential-averaging step
    popart_average_first: bool = False  # step max(beta, 1/(n+1)) at update n (popart.py)


def apply(network: nn.Module, params: Params, observation: Array, *,
          observation_rank: int) -> tuple[Any, Array]:
    """The network over any leading axes: [..., *obs] -> policy [..., *], value [...]."""
    lead = observation.shape[:observation.ndim - observation_rank]
    flat = observation.reshape((-1,) + observation.shape[len(lead):])
    policy, value = network.apply(params, flat)
    return (jax.tree.map(lambda x: x.reshape(lead + x.shape[1:]), policy),
            value.reshape(lead))


def actor_step(network: nn.Module, params: Params, actor_state: tuple[()], timestep: TimeStep,
               key: PRNGKey, *, continuous: bool, evaluation: bool = False
               ) -> tuple[Array, tuple[()], Extras]:
    """`Agent.actor_step`: an action sampled from the policy at each observation ([B, ...]),
    or its mode when evaluating; its log-probability and the value go to the learner."""
    policy, value = network.apply(params, timestep.observation)
    if evaluation:
        action = networks.mode(policy, continuous=continuous)
    else:
        action = networks.sample(policy, key, continuous=continuous)
    extras = {"log_prob": networks.log_prob(policy, action, continuous=continuous),
              "value": value}
    return action, actor_state, extras


def targets(network: nn.Module, learn: LearnConfig, params: Params, trajectory: Trajectory,
            hparams: dict[str, Array], *, axis_name: str | None,
            popart_stats: popart.PopArtStats | None = None
            ) -> tuple[dict[str, Array], Metrics]:
    """Per-sample [T, B] inputs of the epochs: old log-probabilities and values,
    advantages (normalised over `axis_name` too), value targets, importance weights and the
    mask; and the advantages' metrics. With PopArt statistics `popart_stats` the network's
    value is the normalised n(x): values and targets here are sigma n(x) + mu."""

    def unnormalised(values: Array) -> Array:
        if popart_stats is None:
            return values
        return values * popart.scale(popart_stats) + popart_stats.mean

    continuous = learn.continuous
    ts = trajectory.timestep
    mask = trajectory.transition_mask()
    behaviour_log_prob = trajectory.extras["log_prob"]
    kw = {"discount": hparams["discount"], "lambda_": hparams["gae_lambda"]}
    gae = jax.vmap(lambda r, d, v, m, rho: losses.gae_advantages(r, d, v, m,
                                                                 trace_ratios=rho, **kw),
                   in_axes=1, out_axes=1)
    if learn.off_policy == "corrected":
        # pi_0 and V_0 at x_0 .. x_T
        policy, values = apply(network, params, ts.observation,
                               observation_rank=learn.observation_rank)
        values = unnormalised(values)
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
        # (Under Sebulba with a policy lag the actor's n(x) came from statistics one update
        # older; PopArt moves them by beta per update, so the difference is of that order.)
        values = unnormalised(
            jnp.concatenate([trajectory.extras["value"], last_value[None]], axis=0))
        old_log_prob = behaviour_log_prob
        advantages = jax.vmap(
            lambda r, d, v, m: losses.gae_advantages(r, d, v, m, **kw),
            in_axes=1, out_axes=1)(ts.reward[1:], ts.discount[1:], values, mask)
        returns = advantages + values[:-1]
        weights = jnp.ones_like(advantages)
    values = jax.lax.stop_gradient(values)
    normalised, adv_mean, adv_std = losses.normalize_advantages(
        advantages, mask, axis_name=axis_name)
    if learn.advantage_normalization == "none":
        # In value units: with PopArt divided by sigma, as V-trace's policy gradient is
        # (Hessel et al., 2019), so that the entropy bonus weighs the same at any reward scale.
        normalised = advantages * mask
        if popart_stats is not None:
            normalised = normalised / popart.scale(popart_stats)
    metrics = {"advantage_mean": adv_mean, "advantage_std": adv_std,
               "importance_weight": jnp.sum(weights * mask) / jnp.maximum(mask.sum(), 1.0)}
    batch = {"observation": ts.observation[:-1], "action": trajectory.action,
             "old_log_prob": jax.lax.stop_gradient(old_log_prob),
             "old_value": values[:-1], "advantage": normalised, "return": returns,
             "mask": mask}
    if learn.off_policy == "corrected":
        batch["weight"] = weights  # "plain"'s are all 1: not carried through the epochs
    return batch, metrics


def minibatch_loss(network: nn.Module, learn: LearnConfig, params: Params,
                   mb: dict[str, Array], hparams: dict[str, Array]
                   ) -> tuple[Array, dict[str, Array]]:
    """([] loss, metrics) of one minibatch (`targets`' leaves, flattened and sampled):
    clipped surrogate + value_cost * clipped value loss - entropy_cost * entropy (a Gaussian
    policy's: gaussian_entropy_cost), with the ratio's largest deviation from 1 as
    `ratio_deviation`."""
    continuous = learn.continuous
    policy, value = apply(network, params, mb["observation"],
                          observation_rank=learn.observation_rank)
    log_prob = networks.log_prob(policy, mb["action"], continuous=continuous)
    surrogate = losses.clipped_surrogate_loss(
        log_prob, mb["old_log_prob"], mb["advantage"], mb["mask"], mb.get("weight"),
        clip_eps=hparams["clip_eps"])
    v_loss = losses.value_loss(value, mb["old_value"], mb["return"], mb["mask"],
                               clip_eps=hparams["value_clip_eps"])
    count = jnp.maximum(jnp.sum(mb["mask"]), 1.0)
    ent = jnp.sum(networks.entropy(policy, continuous=continuous) * mb["mask"]) / count
    entropy_cost = hparams["gaussian_entropy_cost" if continuous else "entropy_cost"]
    loss = surrogate.loss + hparams["value_cost"] * v_loss - entropy_cost * ent
    deviation = jnp.max(jnp.abs(jnp.exp(log_prob - mb["old_log_prob"]) - 1.0) * mb["mask"])
    return loss, {"loss": loss, "policy_loss": surrogate.loss, "value_loss": v_loss,
                  "entropy": ent, "clip_fraction": surrogate.clip_fraction,
                  "approx_kl": surrogate.approx_kl, "ratio_deviation": deviation}


def optimise(network: nn.Module, optimizer: optax.GradientTransformation, learn: LearnConfig,
             params: Params, opt_state: optax.OptState, flat: dict[str, Array],
             hparams: dict[str, Array], key: PRNGKey, *, axis_name: str | None
             ) -> tuple[tuple[Params, optax.OptState], dict[str, Array]]:
    """`learn.num_epochs` passes over the N samples `flat` (leaves [N, ...]), each in a fresh
    order drawn from `key` and cut into `learn.num_minibatches` minibatches, each one
    optimiser step on the `minibatch_loss` gradient averaged over `axis_name`. Returns the
    new parameters and optimiser state, and metrics [num_epochs, num_minibatches]."""
    num_minibatches = learn.num_minibatches
    n = jax.tree.leaves(flat)[0].shape[0]
    unroll = learn.unroll_updates
    loss_fn = functools.partial(minibatch_loss, network, learn)

    def minibatch_step(carry, mb):
        params, opt_state = carry
        grads, metrics = jax.grad(loss_fn, has_aux=True)(params, mb, hparams)
        if axis_name is not None:
            grads = jax.lax.pmean(grads, axis_name)
        metrics["grad_norm"] = jnp.linalg.norm(jax.flatten_util.ravel_pytree(grads)[0])
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), metrics

    def epoch(carry, epoch_key):
        permutation = jax.random.permutation(epoch_key, n)
        minibatches = jax.tree.map(
            lambda x: jnp.take(x, permutation, axis=0).reshape(
                (num_minibatches, n // num_minibatches) + x.shape[1:]), flat)
        return scans.scan_with_metrics(minibatch_step, carry, minibatches,
                                       unroll=num_minibatches if unroll else 1)

    return jax.lax.scan(epoch, (params, opt_state), jax.random.split(key, learn.num_epochs),
                        unroll=learn.num_epochs if unroll else 1)


def learner_step(network: nn.Module, optimizer: optax.GradientTransformation,
                 learn: LearnConfig, learner_state: LearnerState, trajectory: Trajectory,
                 key: PRNGKey, *, axis_name: str | None) -> tuple[LearnerState, Metrics]:
    """`Agent.learner_step`: one PPO iteration on a `[T+1, B]` trajectory (`targets` with the
    parameters the step starts from, then `optimise`), metrics averaged over the updates
    and over `axis_name`; `first_ratio_deviation` is the first minibatch's, max over devices.
    Raises `ConfigError` unless `learn.num_minibatches` divides the T x B transitions."""
    t, b = trajectory.action.shape[:2]
    n = t * b
    if n % learn.num_minibatches:
        raise ConfigError(
            "agent.num_minibatches",
            f"{learn.num_minibatches} does not divide the {n} transitions (T={t} x {b} "
            "environments) each learner device receives",
            f"use a divisor of {n}, or change rollout_length or the number of environments")
    hparams = learner_state.hparams
    stats = learner_state.popart if learn.popart else None
    batch, target_metrics = targets(network, learn, learner_state.params, trajectory, hparams,
                                    axis_name=axis_name, popart_stats=stats)
    params, extra = learner_state.params, {}
    if stats is not None:
        # ART on the global batch's value targets, POP on the value head; the epochs then fit
        # n(x) to the targets normalised with the new statistics (the old values too, so that
        # value clipping acts in normalised units).
        mask = batch["mask"]
        moments = jnp.stack([jnp.sum(mask), jnp.sum(batch["return"] * mask),
                             jnp.sum(jnp.square(batch["return"]) * mask)])
        if axis_name is not None:
            moments = jax.lax.psum(moments, axis_name)
        count = jnp.maximum(moments[0], 1.0)
        step_size = popart.step_size_at(learn.popart_step_size, learner_state.updates,
                                        average_first=learn.popart_average_first)
        new_stats = popart.update(stats, moments[1] / count, moments[2] / count, step_size)
        params = popart.preserve(params, stats, new_stats)
        sigma = popart.scale(new_stats)
        batch = {**batch, "return": (batch["return"] - new_stats.mean) / sigma,
                 "old_value": (batch["old_value"] - new_stats.mean) / sigma}
        target_metrics = {**target_metrics, "popart_mean": new_stats.mean,
                          "popart_scale": sigma}
        extra = {"popart": new_stats}
    flat = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]), batch)
    (params, opt_state), metrics = optimise(
        network, optimizer, learn, params, learner_state.opt_state, flat,
        hparams, key, axis_name=axis_name)
    first_deviation = metrics.pop("ratio_deviation")[0, 0]
    metrics = {**jax.tree.map(jnp.mean, metrics), **target_metrics}
    if axis_name is not None:
        metrics = jax.lax.pmean(metrics, axis_name)
        first_deviation = jax.lax.pmax(first_deviation, axis_name)
    metrics["first_ratio_deviation"] = first_deviation
    new_state = learner_state.replace(params=params, opt_state=opt_state,
                                      updates=learner_state.updates + 1, **extra)
    return new_state, metrics
