"""MuZero's learning as top-level pure functions over a batch of sampled positions.

Each function takes the pieces it uses (network, optimiser, replay, static settings as
explicit arguments or a frozen `LearnConfig`, hyperparameters held in the learner state for
the sweepable ones), so another agent (EfficientZero) can call them, or replace one, without
copying the rest:

    check_trajectory   the runner's trajectories fit the replay
    to_replay_steps    trajectory [T+1, B] -> the T new timesteps the replay stores
    observations_at    sampled windows -> observations at given window indices
    batch_targets      the target network (and Reanalyse) at the positions the batch uses
    sample_positions   draw a batch with the state's priority and importance exponents
    apply_gradients    pmean, optimiser step, target copy
    learner_update     sample, targets, gradient step, target copy, priority update; what
                       another agent adds (its targets, inputs, unroll, extra loss) as functions
    learner_step       insert a trajectory, then `updates_per_step` updates once ready
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import optax

from agents.muzero import losses
from agents.muzero import targets as tgt
from agents.muzero.networks import MuZeroNetwork
from agents.muzero.search import SearchConfig, run_search, value_to_scalar
from podracer import position_replay as pr
from podracer import replay_loop
from podracer.config import ConfigError
from podracer.types import Array, Metrics, Params, PRNGKey, StepType, Trajectory


# Where the value targets bootstrap from (`LearnConfig.target_positions`, `batch_targets`).
TARGET_POSITIONS = ("bootstrap", "window")


@chex.dataclass(frozen=True)
class LearnerState:
    params: Params
    target_params: Params
    opt_state: optax.OptState  # an `optax.InjectHyperparamsState`: the optimiser's hparams
    replay: pr.PositionReplayState
    updates: Array  # [] int32 learner updates applied so far
    hparams: dict[str, Array]  # {name: [] float32} the loss's and replay's hyperparameters


@dataclasses.dataclass(frozen=True)
class LearnConfig:
    """The static settings of MuZero's learner: the agent config's fields of the same names
    (MuZero's `default_config` documents each), built once by `make_agent`."""

    unroll_steps: int  # K
    td_steps: int  # n of the n-step value targets
    discount: float
    support_size: int
    batch_size: int  # sampled positions per update (per device)
    target_positions: str  # "bootstrap" | "window"
    reanalyse_fraction: float
    reanalyse_value: str  # "target_network" | "root"
    past_end_targets: str  # "masked" | "absorbing"
    reward_scale: float  # rewards are stored multiplied by it
    importance_anneal_updates: int
    target_update_interval: int
    updates_per_step: int
    min_replay_items: int
    reanalyse_search: SearchConfig  # the search Reanalyse runs (the acting one)


def check_trajectory(state: LearnerState, trajectory: Trajectory, *,
                     rollout_length: int) -> None:
    """Raises `ConfigError` when the runner's trajectories do not fit the replay: another T
    than `rollout_length` (`agent.rollout_length`), or more environments per device than it
    has windows."""
    t, b = trajectory.action.shape[:2]
    if t != rollout_length:
        raise ConfigError(
            "agent.rollout_length",
            f"is {rollout_length} but the runner sends trajectories of T={t}",
            "tie them: config.agent.rollout_length = config.get_ref('rollout_length')",
        )
    windows = state.replay.sampleable.shape[0]
    if b > windows:
        raise ConfigError(
            "agent.replay_capacity",
            f"holds {windows} windows of {t} positions, fewer than the {b} environments "
            "each learner device receives",
            f"use at least {b * t} positions",
        )


def to_replay_steps(trajectory: Trajectory, *, frames_once: bool,
                    reward_scale: float = 1.0) -> tuple[dict, Array]:
    """The T new timesteps o_0..o_{T-1} of a trajectory with the action and search policy at
    each (o_T arrives again as the next trajectory's o_0), leaves [T, B, ...], and which of
    them may be sampled as a position ([T, B] bool: not LAST, where no action is taken).
    Rewards are stored multiplied by `reward_scale`.

    With `frames_once` an observation `[H, W, C]` is stored as its newest frame and a flag
    for stacks holding one frame repeated (`targets.stack_restarts`)."""
    ts = jax.tree.map(lambda x: x[:-1], trajectory.timestep)
    if frames_once:
        observation = {"frame": ts.observation[..., -1],
                       "stack_restart": tgt.stack_restarts(ts.observation)}
    else:
        observation = {"observation": ts.observation}
    steps = {
        **observation,
        "action": trajectory.action.astype(jnp.int32),
        "reward": ts.reward.astype(jnp.float32) * reward_scale,
        "discount": ts.discount.astype(jnp.float32),
        "step_type": ts.step_type.astype(jnp.int8),
        "policy": trajectory.extras["policy"].astype(jnp.float32),
    }
    return steps, ts.step_type != StepType.LAST


def observations_at(windows: dict, indices: Array, *, history: int) -> Array:
    """Observations `[S, M, ...]` at window indices `indices` ([S, M]) of sampled windows
    (leaves [S, W, ...]); stored as one frame per step, stacks of `history + 1` frames are
    rebuilt (the windows hold the `history` steps before their position)."""
    chex.assert_rank(indices, 2)
    if "observation" in windows:
        return jax.vmap(lambda obs, i: obs[i])(windows["observation"], indices)
    at = functools.partial(tgt.frame_stack, num_stack=history + 1)
    return jax.vmap(jax.vmap(at, in_axes=(None, None, 0)))(
        windows["frame"], windows["stack_restart"], indices)


def batch_targets(network: MuZeroNetwork, target_params: Params, windows: dict, key: PRNGKey,
                  learn: LearnConfig, *, history: int, n: Array | None = None,
                  search: Callable | None = None) -> tgt.UnrollTargets:
    """`unroll_targets` of a batch of sampled windows (leaves [S, H + K + n + 1, ...], the
    position at index H), leaves [S, K+1, ...].

    The target network evaluates only the K+1 observations each target bootstraps from
    (`learn.target_positions == "bootstrap"`); "window" evaluates (and Reanalyse searches)
    all K + n + 1 and picks those, the width of computing targets for whole windows, kept to
    measure the saving.
    Reanalyse (the first `round(reanalyse_fraction * S)` samples) searches with the target
    network at the K+1 unroll positions (policy targets); with `learn.reanalyse_value ==
    "root"` also at the bootstrap positions, whose root values replace the target network's
    estimates ("target_network", the default, keeps those: EfficientZero's reference with
    `use_root_value=False`, and MuZero Reanalyse). `key` is consumed by that search.

    `n` ([S] int32, each at most `learn.td_steps`) shortens each sample's n-step horizon
    (EfficientZero's off-policy correction); None: `learn.td_steps` for all. `search`
    (params, observations [B, ...], key) -> `mctx.PolicyOutput` replaces MuZero's search
    (`run_search` with `learn.reanalyse_search`) for Reanalyse (an agent with another model,
    e.g. EfficientZero's value prefix)."""
    if search is None:
        search = lambda params, obs, key: run_search(network, params, obs, key,
                                                     learn.reanalyse_search, evaluation=False)
    k1 = learn.unroll_steps + 1
    s = windows["step_type"].shape[0]
    ahead = jax.tree.map(lambda x: x[:, history:], windows)
    step_types = ahead["step_type"].astype(jnp.int32)  # [S, K+n+1]

    def horizon(n_i):  # one static n, or each sample's traced n (None is an empty pytree)
        return {"n": learn.td_steps} if n_i is None else {"n": n_i, "max_n": learn.td_steps}

    boot = jax.vmap(lambda st, n_i: tgt.bootstrap_indices(
        st, num_unroll=learn.unroll_steps, **horizon(n_i)))(step_types, n)  # [S, K+1]

    def values(obs):  # [S', M, ...] -> [S', M]
        flat = obs.reshape((-1,) + obs.shape[2:])
        latent = network.apply(target_params, flat, method="represent")
        _, value_logits = network.apply(target_params, latent, method="predict")
        return value_to_scalar(value_logits, learn.support_size).reshape(obs.shape[:2])

    if learn.target_positions == "window":
        everywhere = jnp.broadcast_to(jnp.arange(step_types.shape[1]), step_types.shape)
        boot_values = jnp.take_along_axis(
            values(observations_at(windows, history + everywhere, history=history)), boot, axis=1)
    elif learn.target_positions == "bootstrap":
        boot_values = values(observations_at(windows, history + boot, history=history))
    else:
        raise ValueError(f"agent.target_positions={learn.target_positions!r}: use one of "
                         f"{TARGET_POSITIONS}.")
    policies = ahead["policy"]
    num_reanalyse = round(learn.reanalyse_fraction * s)
    by_root = learn.reanalyse_value == "root"
    if num_reanalyse:
        # REANALYSE: fresh searches with the target network.
        sub = jax.tree.map(lambda x: x[:num_reanalyse], windows)
        if not by_root:  # policies only: the unroll positions
            where = jnp.broadcast_to(jnp.arange(k1), (num_reanalyse, k1))
        elif learn.target_positions == "window":
            where = jnp.broadcast_to(jnp.arange(step_types.shape[1]),
                                     (num_reanalyse, step_types.shape[1]))
        else:  # the unroll positions, then the bootstrap positions
            where = jnp.concatenate(
                [jnp.broadcast_to(jnp.arange(k1), (num_reanalyse, k1)), boot[:num_reanalyse]], 1)
        obs = observations_at(sub, history + where, history=history)
        out = search(target_params, obs.reshape((-1,) + obs.shape[2:]), key)
        searched = out.action_weights.reshape(where.shape + (-1,))
        root_values = out.search_tree.summary().value.reshape(where.shape)
        policies = policies.at[:num_reanalyse, :k1].set(searched[:, :k1])
        if by_root:
            if learn.target_positions == "window":
                root_values = jnp.take_along_axis(root_values, boot[:num_reanalyse], axis=1)
            else:
                root_values = root_values[:, k1:]
            boot_values = boot_values.at[:num_reanalyse].set(root_values)
    targets = jax.vmap(lambda r, d, st, pi, v, n_i: tgt.unroll_targets(
        r, d, st, pi, v, num_unroll=learn.unroll_steps, discount=learn.discount,
        past_end=learn.past_end_targets, **horizon(n_i)))(
            ahead["reward"], ahead["discount"], step_types, policies, boot_values, n)
    return jax.lax.stop_gradient(targets)


def ramp_fraction(updates: Array, over_updates: int) -> Array:
    """min(updates / over_updates, 1): the share done of a linear ramp over `over_updates`
    learner updates (`over_updates` > 0)."""
    return jnp.minimum(updates.astype(jnp.float32) / over_updates, 1.0)


def importance_exponent(beta0: Array, updates: Array, anneal_updates: int) -> Array:
    """beta annealed linearly from beta0 to 1 over `anneal_updates` (0: constant beta0), as
    in prioritised replay (Schaul et al., 2016)."""
    if anneal_updates <= 0:
        return beta0
    return beta0 + (1.0 - beta0) * ramp_fraction(updates, anneal_updates)


def sample_positions(replay: pr.PositionReplay, state: LearnerState, key: PRNGKey, *,
                     batch_size: int, importance_anneal_updates: int) -> pr.PositionSample:
    """`batch_size` positions drawn with the learner state's priority exponent and the
    importance exponent annealed to the current update over `importance_anneal_updates`."""
    hp = state.hparams
    beta = importance_exponent(hp["importance_exponent"], state.updates,
                               importance_anneal_updates)
    return replay.sample(state.replay, key, batch_size, alpha=hp["priority_exponent"],
                         beta=beta)


def apply_gradients(optimizer: optax.GradientTransformation, state: LearnerState,
                    grads: Params, *, target_update_interval: int, axis_name: str | None
                    ) -> LearnerState:
    """The optimiser step on gradients averaged over `axis_name`, the update count, and the
    target network copied every `target_update_interval` updates."""
    if axis_name is not None:
        grads = jax.lax.pmean(grads, axis_name)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    count = state.updates + 1
    copy = count % target_update_interval == 0
    target_params = jax.tree.map(lambda new, old: jnp.where(copy, new, old), params,
                                 state.target_params)
    return state.replace(params=params, target_params=target_params, opt_state=opt_state,
                         updates=count)


def learner_update(network: MuZeroNetwork, optimizer: optax.GradientTransformation,
                   replay: pr.PositionReplay, learn: LearnConfig,
                   state: LearnerState, key: PRNGKey, *, history: int,
                   axis_name: str | None, targets_fn: Callable | None = None,
                   inputs_fn: Callable | None = None, unroll_fn: Callable | None = None,
                   extra_loss_fn: Callable | None = None) -> tuple[LearnerState, Metrics]:
    """One update on `learn.batch_size` positions sampled from `state.replay`: targets,
    the K-step unrolled loss weighted by importance weights, a gradient step (gradients
    averaged over `axis_name`), the periodic target copy, and the sampled positions'
    priorities set to |v - z| at the position. Keys: sampling, Reanalyse, `inputs_fn`'s.

    What another agent adds to MuZero (EfficientZero: the value prefix, the consistency
    loss, augmentation) comes in as functions, each None for MuZero's own:
      targets_fn: (windows, key) -> (`UnrollTargets` leaves [S, K+1, ...], metrics) of the
        sampled windows (leaves [S, H + K + n + 1, ...]), `key` Reanalyse's; None:
        `batch_targets`.
      inputs_fn: (windows, key) -> [S, M, ...] the observations the update reads, o_0
        first; None: o_0 alone.
      unroll_fn: (params, observations, actions [S, K]) -> the model's predictions, with
        `losses.UnrollOutput`'s fields; None: `losses.unroll_model` from o_0.
      extra_loss_fn: (params, predictions, observations, windows, targets) -> ([S] a loss
        added to each sample's MuZero loss before the importance weights, metrics); None:
        none.
    Their metrics join MuZero's; `network.terminal_head` adds `terminal_loss`."""
    sample_key, reanalyse_key, inputs_key = jax.random.split(key, 3)
    hp = state.hparams
    sample = sample_positions(replay, state, sample_key, batch_size=learn.batch_size,
                              importance_anneal_updates=learn.importance_anneal_updates)
    windows = sample.windows
    if targets_fn is None:
        targets_fn = lambda windows, key: (batch_targets(
            network, state.target_params, windows, key, learn, history=history), {})
    if inputs_fn is None:
        inputs_fn = lambda windows, key: observations_at(
            windows, jnp.full((learn.batch_size, 1), history), history=history)
    if unroll_fn is None:
        unroll_fn = lambda params, observations, actions: losses.unroll_model(
            network, params, observations[:, 0], actions)
    targets, target_metrics = targets_fn(windows, reanalyse_key)
    observations = inputs_fn(windows, inputs_key)
    actions = windows["action"][:, history:history + learn.unroll_steps]

    def loss_fn(params):
        out = unroll_fn(params, observations, actions)
        per_example = jax.vmap(functools.partial(
            losses.unroll_loss, support_size=learn.support_size,
            value_cost=hp["value_cost"]))(out.policy_logits, out.value_logits,
                                          out.reward_logits, targets,
                                          terminal_logits=out.terminal_logits)
        total, extra_metrics = per_example.loss, {}
        if extra_loss_fn is not None:
            extra, extra_metrics = extra_loss_fn(params, out, observations, windows, targets)
            total = total + extra
        value = value_to_scalar(out.value_logits[:, 0], learn.support_size)
        return jnp.mean(sample.weights * total), (
            jnp.abs(value - targets.value[:, 0]), per_example, total, extra_metrics)

    grads, (priorities, per_example, total, extra_metrics) = jax.grad(
        loss_fn, has_aux=True)(state.params)
    new_state = apply_gradients(optimizer, state, grads,
                                target_update_interval=learn.target_update_interval,
                                axis_name=axis_name)
    k1 = learn.unroll_steps + 1
    metrics = {
        "loss": jnp.mean(sample.weights * total),
        "value_loss": jnp.mean(per_example.value_loss) / k1,
        "policy_loss": jnp.mean(per_example.policy_loss) / k1,
        "reward_loss": jnp.mean(per_example.reward_loss) / max(learn.unroll_steps, 1),
        "grad_norm": optax.tree.norm(grads),
        "mean_priority": jnp.mean(priorities),
        "importance_exponent": sample_beta(state, learn.importance_anneal_updates),
        **target_metrics,
        **extra_metrics,
    }
    if network.terminal_head:
        metrics["terminal_loss"] = jnp.mean(per_example.terminal_loss) / max(
            learn.unroll_steps, 1)
    new_state = new_state.replace(
        replay=replay.update(state.replay, sample.slots, sample.positions, priorities))
    return new_state, metrics


def sample_beta(state: LearnerState, importance_anneal_updates: int) -> Array:
    """The importance exponent in force at `state`'s update (annealed over
    `importance_anneal_updates`)."""
    return importance_exponent(state.hparams["importance_exponent"], state.updates,
                               importance_anneal_updates)


def learner_step(update: Callable[[LearnerState, PRNGKey], tuple[LearnerState, Metrics]],
                 replay: pr.PositionReplay, state: LearnerState, steps: dict,
                 sampleable: Array, key: PRNGKey, *, updates_per_step: int,
                 min_replay_items: int, metric_names: tuple[str, ...], axis_name: str | None
                 ) -> tuple[LearnerState, Metrics]:
    """Appends a trajectory's timesteps (`steps` leaves [T, B, ...], `sampleable` [T, B]) to
    the replay, then runs `update` `updates_per_step` times once every device's replay
    holds `min_replay_items` sampleable positions (zeros for `metric_names` until then).
    Metrics are averaged over the updates and over `axis_name`; `search_entropy` is the mean
    entropy (nats) of the acting search's policies over the trajectory's sampleable steps
    (ln A for a uniform one over A actions; acting's spread, as an actor-critic's entropy)."""
    search_entropy = policy_entropy(steps["policy"], sampleable)
    state = state.replace(replay=replay.add(state.replay, steps, sampleable))
    size = replay.size(state.replay)
    state, metrics = replay_loop.train_when_ready(
        update, state, key, size=size, updates_per_step=updates_per_step,
        min_items=min_replay_items, metric_names=metric_names, axis_name=axis_name)
    metrics = {**metrics, "replay_size": size.astype(jnp.float32),
               "search_entropy": search_entropy}
    if axis_name is not None:
        metrics = jax.lax.pmean(metrics, axis_name)
    return state, metrics


def policy_entropy(policies: Array, mask: Array) -> Array:
    """[] The mean entropy (nats) of the policies `[..., A]` where `mask` (`[...]` bool) is
    set; 0 where none is. A zero probability contributes 0."""
    logs = jnp.log(jnp.where(policies > 0, policies, 1.0))
    entropy = -jnp.sum(policies * logs, axis=-1)
    weights = mask.astype(jnp.float32)
    return jnp.sum(entropy * weights) / jnp.maximum(jnp.sum(weights), 1.0)
