"""EfficientZero's learning, built from MuZero's pieces (`agents.muzero.learning`):

    value_prefix_targets   rewards of an unroll -> sums since the last LSTM reset
    td_horizon             n of each sample's value target, shortened with its data's age
    augment                random shift and intensity of image observations, on the device
    augment_unroll         the online input and the consistency targets, drawn apart
    unroll_model           MuZero's unroll with the value-prefix head and per-step gradient
                           scaling (and the consistency loss's latents, optionally apart from h)
    consistency_loss       SimSiam: -cos(predictor(projector(g's latent)),
                           stop_gradient(projector(h(o_{t+k}))))
    consistency_weight     the loss's cost, raised linearly from 0 over a warm-up
    learner_update         MuZero's, given these targets (value prefix, n by age, Reanalyse
                           through EfficientZero's search), inputs, unroll and consistency loss
    refresh_priorities     Priority Refresh (SpeedyZero): every stored position's |v - z|
    learner_step           insert a trajectory (with its birth date), MuZero's updates, and
                           Priority Refresh when due

Static settings are explicit arguments or the frozen `LearnConfig` (MuZero's and these), which
`make_agent` builds once from the agent's config.
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import optax

from agents.efficientzero import search as ez_search
from agents.efficientzero.networks import EfficientZeroNetwork, initial_carry, reset_carry
from agents.muzero import learning as mz
from agents.muzero import losses as mz_losses
from agents.muzero import targets as tgt
from agents.muzero.networks import VECTOR_LATENT, scale_gradient
from agents.muzero.search import value_to_scalar
from podracer import position_replay as pr
from podracer.types import Array, Metrics, Params, PRNGKey, StepType, Trajectory


def value_prefix_targets(rewards: Array, horizon: int) -> Array:
    """[K+1] the value prefix at each unroll step k: r_{j+1} + ... + r_k, j = H floor((k-1)/H)
    the last reset before k (0 at k = 0).

    Args:
      rewards: [K+1] the reward targets into each unroll step (step 0: unused).
      horizon: H, the LSTM's reset interval.
    """
    chex.assert_rank(rewards, 1)
    k = jnp.arange(rewards.shape[0])
    running = jnp.cumsum(rewards.at[0].set(0.0))
    last_reset = horizon * (jnp.maximum(k - 1, 0) // horizon)
    return jnp.where(k == 0, 0.0, running - running[last_reset])


def td_horizon(age: Array, *, td_steps: int, td_steps_min: int, td_age_interval: int
               ) -> Array:
    """[S] int32 n of each value target: `td_steps` shortened by one for every
    `td_age_interval` environment steps of `age` ([S]), at least `td_steps_min`
    (EfficientZero, Atari 100k: n = clip(5 - floor(age / 30,000), 1, 5))."""
    n = td_steps - age // td_age_interval
    return jnp.clip(n, td_steps_min, td_steps).astype(jnp.int32)


def augment(observations: Array, key: PRNGKey, *, shift: int, intensity: float) -> Array:
    """Random shift (pad `shift` pixels by repeating the edge, crop back at a random offset)
    and random intensity (x (1 + intensity * clip(N(0, 1), -2, 2))) of image observations
    `[S, M, H, W, C]`, one draw per sample shared by its M steps. Returns float32 in the
    network's input scale (uint8 frames divided by 255)."""
    chex.assert_rank(observations, 5)
    x = observations.astype(jnp.float32)
    if observations.dtype == jnp.uint8:
        x = x / 255.0
    s, _, h, w, _ = x.shape
    shift_key, scale_key = jax.random.split(key)
    if shift:
        padded = jnp.pad(x, ((0, 0), (0, 0), (shift, shift), (shift, shift), (0, 0)), "edge")
        offsets = jax.random.randint(shift_key, (s, 2), 0, 2 * shift + 1)
        x = jax.vmap(lambda img, o: jax.lax.dynamic_slice(
            img, (0, o[0], o[1], 0), (img.shape[0], h, w, img.shape[-1])))(padded, offsets)
    if intensity:
        noise = jnp.clip(jax.random.normal(scale_key, (s, 1, 1, 1, 1)), -2.0, 2.0)
        x = x * (1.0 + intensity * noise)
    return x


GRADIENT_SCALES = ("whole", "per_step")
AUGMENT_DRAWS = ("separate", "shared")


def per_step_scale(gradient_scale: str, num_unroll: int) -> float:
    """The gradient scale of the predictions past unroll step 0.

    "whole" (the reference, `core/train.py: update_weights`): 1/K multiplies the gradient of
    the whole loss, so every term keeps its weight relative to the others; here the loss is
    already a mean over the K+1 steps, the same up to a constant factor. "per_step": 1/K on
    the predictions of steps 1..K only (MuZero appendix G's reading), which weighs the
    consistency and value-prefix losses, that exist only there, 1/K against step 0's."""
    if gradient_scale == "per_step" and num_unroll:
        return 1.0 / num_unroll
    return 1.0


def augment_unroll(observations: Array, key: PRNGKey, *, shift: int, intensity: float,
                   draws: str) -> Array:
    """`augment` (with `shift` and `intensity`) of a batch's unroll observations
    `[S, K+1, H, W, C]`. With `draws == "separate"` (the reference, `core/train.py:
    update_weights`) the online input o_0 and the consistency targets o_1..o_K get
    independent draws (one draw per sample shared by its K targets), so the consistency loss
    has to see through the augmentation; "shared": one draw per sample for all K+1."""
    kwargs = {"shift": shift, "intensity": intensity}
    if draws == "shared":
        return augment(observations, key, **kwargs)
    online_key, target_key = jax.random.split(key)
    return jnp.concatenate([augment(observations[:, :1], online_key, **kwargs),
                            augment(observations[:, 1:], target_key, **kwargs)], axis=1)


def unroll_model(network: EfficientZeroNetwork, params: Params, observation: Array,
                 actions: Array, *, value_prefix: bool, value_prefix_horizon: int,
                 lstm_size: int, gradient_scale: str,
                 latents_reach_representation: bool = True) -> mz_losses.UnrollOutput:
    """MuZero's K-step unroll (`agents.muzero.losses.unroll_model`) where the reward head is
    the value-prefix LSTM (of `lstm_size`, reset after every `value_prefix_horizon` steps, as
    in search) when `value_prefix`, and, with `gradient_scale == "per_step"`
    (`unroll_gradient_scale`), the gradient of every prediction past step 0 is scaled by 1/K
    (MuZero appendix G). The returned `latents` (the consistency loss's online branch) are the
    unroll's own, or, without `latents_reach_representation`, the same dynamics steps run
    again from a stop-gradient h(o): a loss on them then trains g but not h."""
    chex.assert_rank(actions, 2)
    num_unroll = actions.shape[1]

    def prefix(params, latent, carry, k):
        reward_logits, carry = network.apply(params, latent, carry, method="prefix")
        reset = jnp.full((observation.shape[0],), (k + 1) % value_prefix_horizon == 0)
        return reward_logits, reset_carry(carry, reset)

    out = mz_losses.unroll_model(network, params, observation, actions,
                                 step_scale=per_step_scale(gradient_scale, num_unroll),
                                 reward_head=prefix if value_prefix else None,
                                 reward_carry=initial_carry(observation.shape[0], lstm_size))
    if latents_reach_representation:
        return out
    latent = jax.lax.stop_gradient(network.apply(params, observation, method="represent"))
    latents = []
    for k in range(num_unroll):
        _, latent = network.apply(params, latent, actions[:, k], method="dynamics")
        latent = scale_gradient(latent, 0.5)
        latents.append(latent)
    return out.replace(latents=jnp.stack(latents, axis=1))


def consistency_loss(network: EfficientZeroNetwork, params: Params, latents: Array,
                     target_observations: Array, mask: Array, *, step_scale: float) -> Array:
    """[B] sum over k = 1..K of mask_k * -cos(p_k, z_k): p_k = predictor(projector(s_k)) of
    the dynamics' latent s_k, z_k = projector(h(o_k)) of the real observation at step k with
    the same parameters, gradient stopped (EfficientZero's SimSiam loss).

    Args:
      latents: [B, K, ...] the dynamics' latents.
      target_observations: [B, K, ...] o_1..o_K.
      mask: [B, K] 1 where o_k belongs to the episode of o_0.
      step_scale: gradient scale of each step's online branch.
    """
    b, k = latents.shape[:2]
    flat = lambda x: x.reshape((b * k,) + x.shape[2:])
    # The heads run once per unroll step, over the batch (as the reference's loop does), so
    # batch-statistics normalisation uses each step's B samples.
    per_step = lambda method: jax.vmap(
        lambda x: network.apply(params, x, method=method), in_axes=1, out_axes=1)
    online = per_step("project_predict")(per_step("project")(latents))
    online = scale_gradient(online, step_scale)
    target_latent = network.apply(params, flat(target_observations), method="represent")
    target_latent = target_latent.reshape((b, k) + target_latent.shape[1:])
    target = jax.lax.stop_gradient(per_step("project")(target_latent))
    normalise = lambda x: x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-8)
    cosine = jnp.sum(normalise(online) * normalise(target), axis=-1)
    return -jnp.sum(mask * cosine, axis=1)


def consistency_weight(cost: Array, updates: Array, warmup_updates: int) -> Array:
    """The consistency loss's weight after `updates` learner updates: `cost` times
    min(updates / warmup_updates, 1), so 0 at the first update; `cost` throughout when
    `warmup_updates` is 0."""
    if warmup_updates <= 0:
        return cost
    return cost * mz.ramp_fraction(updates, warmup_updates)


def same_episode(step_types: Array, num_unroll: int) -> Array:
    """[S, K] 1.0 where o_k (k = 1..K) follows o_0 with no episode end before it."""
    last = (step_types[:, :num_unroll] == StepType.LAST).astype(jnp.int32)
    return (jnp.cumsum(last, axis=1) == 0).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class LearnConfig:
    """The static settings of EfficientZero's learner: MuZero's (`muzero`) and the agent
    config's EfficientZero fields of the same names (its `default_config` documents each),
    built once by `make_agent`."""

    muzero: mz.LearnConfig
    value_prefix: bool
    value_prefix_horizon: int
    lstm_size: int
    consistency: bool
    consistency_to_representation: bool
    consistency_warmup_updates: int  # 0: the full cost from the first update
    td_steps_min: int
    td_age_interval: int  # 0: n = td_steps always
    augment: bool
    augment_shift: int
    augment_intensity: float
    augment_draws: str  # "separate" | "shared"
    unroll_gradient_scale: str  # "whole" | "per_step"
    refresh_interval: int  # 0: no Priority Refresh
    refresh_batch: int
    rollout_length: int  # T of the trajectories, the positions each stored window owns


def learner_update(network: EfficientZeroNetwork, optimizer: optax.GradientTransformation,
                   replay: pr.PositionReplay, learn: LearnConfig,
                   state: mz.LearnerState, key: PRNGKey, *, history: int,
                   steps_per_add: Array | int, axis_name: str | None
                   ) -> tuple[mz.LearnerState, Metrics]:
    """One EfficientZero update: MuZero's (`agents.muzero.learning.learner_update`) with
    value-prefix targets, the consistency loss, n shortened by the data's age (its
    environment steps: replay adds since it was stored times `steps_per_add`), Reanalyse
    through EfficientZero's search and augmented images."""
    base = learn.muzero  # MuZero's settings
    k = base.unroll_steps
    cost = consistency_weight(state.hparams["consistency_cost"], state.updates,
                              learn.consistency_warmup_updates)
    step_scale = per_step_scale(learn.unroll_gradient_scale, k)

    def targets_fn(windows, key):
        n = None
        if learn.td_age_interval > 0:
            age = (state.replay.adds - windows["collected_at"][:, history]) * steps_per_add
            n = td_horizon(age, td_steps=base.td_steps, td_steps_min=learn.td_steps_min,
                           td_age_interval=learn.td_age_interval)
        search = functools.partial(_reanalyse_search, network, learn)
        targets = mz.batch_targets(network, state.target_params, windows, key, base,
                                   history=history, n=n, search=search)
        if learn.value_prefix:
            targets = targets.replace(reward=jax.vmap(functools.partial(
                value_prefix_targets, horizon=learn.value_prefix_horizon))(targets.reward))
        return targets, {"td_steps": jnp.mean(n) if n is not None
                         else jnp.float32(base.td_steps)}

    def inputs_fn(windows, key):  # o_0 .. o_K: the online input and the consistency targets
        steps = jnp.broadcast_to(jnp.arange(k + 1), (base.batch_size, k + 1))
        observations = mz.observations_at(windows, history + steps, history=history)
        # Shifts are a prior for convolutions over real images; an MLP reading a small grid
        # (MinAtar's 10x10) would see a different input for the same state.
        if (learn.augment and observations.ndim == 5
                and network.muzero.kind not in VECTOR_LATENT):
            observations = augment_unroll(observations, key, shift=learn.augment_shift,
                                          intensity=learn.augment_intensity,
                                          draws=learn.augment_draws)
        return observations

    def unroll_fn(params, observations, actions):
        return unroll_model(network, params, observations[:, 0], actions,
                            value_prefix=learn.value_prefix,
                            value_prefix_horizon=learn.value_prefix_horizon,
                            lstm_size=learn.lstm_size, gradient_scale=learn.unroll_gradient_scale,
                            latents_reach_representation=learn.consistency_to_representation)

    def extra_loss_fn(params, out, observations, windows, targets):
        del targets  # the consistency loss's targets are the observations
        consistency = jnp.zeros((base.batch_size,), jnp.float32)
        if learn.consistency and k:
            mask = same_episode(windows["step_type"][:, history:].astype(jnp.int32), k)
            consistency = consistency_loss(network, params, out.latents, observations[:, 1:],
                                           mask, step_scale=step_scale) / (k + 1)
        return cost * consistency, {"consistency_loss": jnp.mean(consistency)}

    return mz.learner_update(network, optimizer, replay, base, state, key, history=history,
                             axis_name=axis_name, targets_fn=targets_fn, inputs_fn=inputs_fn,
                             unroll_fn=unroll_fn, extra_loss_fn=extra_loss_fn)


def _reanalyse_search(network, learn: LearnConfig, params, observation, key):
    return ez_search.run_search(network, params, observation, key,
                                learn.muzero.reanalyse_search, value_prefix=learn.value_prefix,
                                value_prefix_horizon=learn.value_prefix_horizon,
                                lstm_size=learn.lstm_size, evaluation=False)


def window_priorities(network: EfficientZeroNetwork, params: Params, target_params: Params,
                      windows: dict, *, support_size: int, td_steps: int, discount: float,
                      history: int, period: int) -> Array:
    """[b, T] |v(o_u) - z_u| of the T positions each stored window ([b, L, ...]) owns: v from
    `params`, z the `td_steps`-step target bootstrapping from `target_params`' values."""
    length = windows["step_type"].shape[1]
    b = windows["step_type"].shape[0]
    where = jnp.broadcast_to(jnp.arange(history, length), (b, length - history))
    observations = mz.observations_at(windows, where, history=history)
    flat = observations.reshape((-1,) + observations.shape[2:])

    def values(p):
        latent = network.apply(p, flat, method="represent")
        _, value_logits = network.apply(p, latent, method="predict")
        return value_to_scalar(value_logits, support_size).reshape(where.shape)

    ahead = jax.tree.map(lambda x: x[:, history:], windows)
    z = jax.vmap(functools.partial(tgt.n_step_values, n=td_steps, discount=discount))(
        ahead["reward"], ahead["discount"], ahead["step_type"].astype(jnp.int32),
        values(target_params))
    return jnp.abs(values(params) - z)[:, :period]


def refresh_priorities(network: EfficientZeroNetwork, replay: pr.PositionReplay,
                       learn: LearnConfig, state: mz.LearnerState, *,
                       history: int) -> mz.LearnerState:
    """Priority Refresh (SpeedyZero): every stored position's priority recomputed with the
    current networks, `learn.refresh_batch` windows at a time."""
    period = learn.rollout_length
    fn = functools.partial(window_priorities, network, state.params, state.target_params,
                           support_size=learn.muzero.support_size,
                           td_steps=learn.muzero.td_steps, discount=learn.muzero.discount,
                           history=history, period=period)
    return state.replace(replay=replay.refresh(state.replay, fn, learn.refresh_batch))


def learner_step(network: EfficientZeroNetwork, optimizer: optax.GradientTransformation,
                 replay: pr.PositionReplay, learn: LearnConfig, state: mz.LearnerState,
                 trajectory: Trajectory, key: PRNGKey, *, history: int, frames_once: bool,
                 metric_names: tuple[str, ...], axis_name: str | None
                 ) -> tuple[mz.LearnerState, Metrics]:
    """`Agent.learner_step`: the trajectory's timesteps into the replay, each stamped with the
    add it arrives in (its data's birth date, for `td_horizon`), then MuZero's
    `learner_step` of `learner_update`s, then Priority Refresh when `learn.refresh_interval`
    updates have passed since the last (`priority_refreshes`: 1 when it ran)."""
    mz.check_trajectory(state, trajectory, rollout_length=learn.rollout_length)
    t, b = trajectory.action.shape[:2]
    devices = 1 if axis_name is None else jax.lax.psum(1, axis_name)
    steps, sampleable = mz.to_replay_steps(trajectory, frames_once=frames_once,
                                           reward_scale=learn.muzero.reward_scale)
    # The add this trajectory becomes (the replay counts adds): its data's birth date.
    steps["collected_at"] = jnp.full((t, b), state.replay.adds + 1, jnp.int32)
    update = lambda s, k: learner_update(
        network, optimizer, replay, learn, s, k, history=history,
        steps_per_add=t * b * devices, axis_name=axis_name)
    before = state.updates
    state, metrics = mz.learner_step(update, replay, state, steps, sampleable, key,
                                     updates_per_step=learn.muzero.updates_per_step,
                                     min_replay_items=learn.muzero.min_replay_items,
                                     metric_names=metric_names, axis_name=axis_name)
    if learn.refresh_interval > 0:
        due = state.updates // learn.refresh_interval > before // learn.refresh_interval
        state = jax.lax.cond(
            due, lambda s: refresh_priorities(network, replay, learn, s, history=history),
            lambda s: s, state)
        metrics = {**metrics, "priority_refreshes": due.astype(jnp.float32)}
    return state, metrics
