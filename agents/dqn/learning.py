"""The DQN family's acting and learning as top-level pure functions over explicit arguments
(the network, optimiser, replay and a frozen `LearnConfig`), so that another agent (PQN) can
call them, or replace one, without copying the rest:

    epsilon_at         the exploration rate after a number of learner steps (linear anneal)
    actor_step         epsilon-greedy on the online Q (greedy when evaluating)
    to_replay_steps    trajectory [T+1, B] -> the T new timesteps the replay stores
    batch_targets      sampled windows -> n-step returns, bootstrap discounts and observations
    apply_gradients    pmean over the devices, optimiser step
    learner_update     sample, loss (Double DQN or C51), gradient step, target copy, priorities
    learner_step       insert a trajectory, then `replay_ratio` updates once warmed up

One learner step:

    # INSERT
    replay <- o_0 .. o_{T-1} with a_t, the reward and discount on arriving at each, step type
    # TRAIN, once every device holds `warmup` sampleable positions, replay_ratio times:
    sample S positions (P ∝ p^alpha), each with its n following timesteps
    G, gamma^k prod d, o_{t+k} <- n-step target stopping at an episode's end
    loss = mean_i w_i * Huber(G + gamma^k Q_target(o_{t+k}, argmax Q(o_{t+k})) - Q(o_t, a_t))
    grads pmean'd over the devices, clipped, Adam; target <- online every C updates
    priorities <- |td| (C51: the cross-entropy)
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import optax

from agents.dqn import losses
from agents.dqn.networks import QNetwork
from podracer import replay_loop
from podracer import transition_replay as tr
from podracer.types import Array, Metrics, Params, PRNGKey, StepType, TimeStep, Trajectory

METRIC_NAMES = ("loss", "q_mean", "td_abs", "grad_norm", "importance_weight")


@chex.dataclass(frozen=True)
class LearnerState:
    params: Params
    target_params: Params
    opt_state: optax.OptState  # an `optax.InjectHyperparamsState`: the optimiser's hparams
    replay: tr.TransitionReplayState
    steps: Array  # [] int32 learner steps so far (the exploration schedule's clock)
    updates: Array  # [] int32 optimiser updates so far (the target copy's clock)
    hparams: dict[str, Array]  # {name: [] float32} the loss's and replay's hyperparameters


@dataclasses.dataclass(frozen=True)
class LearnConfig:
    """The static settings of the DQN learner: the agent config's fields of the same names
    (`agents.dqn.default_config` documents each), built once by `make_agent`."""

    n_step: int
    batch_size: int
    replay_ratio: int
    warmup: int
    target_update_interval: int
    double: bool
    head: str  # "q" | "c51"
    huber_delta: float
    # priority_exponent is 0 and not swept: the replay draws uniformly without reading every
    # priority (`podracer.transition_replay`), and the importance weights are 1.
    uniform: bool = False


def epsilon_at(steps: Array, *, start: float, end: float, anneal_steps: int) -> Array:
    """[] float32 the exploration rate after `steps` learner steps: linear from `start` to
    `end` over `anneal_steps`, then `end` (`end` throughout when `anneal_steps` is 0)."""
    if anneal_steps <= 0:
        return jnp.asarray(end, jnp.float32)
    fraction = jnp.clip(steps.astype(jnp.float32) / anneal_steps, 0.0, 1.0)
    return (start + fraction * (end - start)).astype(jnp.float32)


def actor_step(network: QNetwork, params: dict, actor_state, timestep: TimeStep, key: PRNGKey,
               *, evaluation: bool = False):
    """Epsilon-greedy on the online Q (`params`: {"network", "epsilon"}), greedy when
    `evaluation`; consumes `key` only when not evaluating. Reads only the observation."""
    q, _ = network.apply(params["network"], timestep.observation)
    greedy = jnp.argmax(q, axis=-1).astype(jnp.int32)
    if evaluation:
        return greedy, actor_state, {}
    explore_key, action_key = jax.random.split(key)
    random = jax.random.randint(action_key, greedy.shape, 0, q.shape[-1], jnp.int32)
    explore = jax.random.uniform(explore_key, greedy.shape) < params["epsilon"]
    return jnp.where(explore, random, greedy), actor_state, {}


def to_replay_steps(trajectory: Trajectory) -> tuple[dict, Array]:
    """The T new timesteps o_0 .. o_{T-1} of a trajectory with the action at each (o_T
    arrives again as the next trajectory's o_0), leaves [T, B, ...], and which may be sampled
    as a position ([T, B] bool: not LAST, whose action is ignored)."""
    ts = jax.tree.map(lambda x: x[:-1], trajectory.timestep)
    steps = {
        "observation": ts.observation,
        "action": trajectory.action.astype(jnp.int32),
        "reward": ts.reward.astype(jnp.float32),
        "discount": ts.discount.astype(jnp.float32),
        "last": ts.step_type == StepType.LAST,
    }
    return steps, ts.step_type != StepType.LAST


def batch_targets(windows: dict, *, gamma: float | Array) -> tuple[Array, Array, Array]:
    """For sampled windows (leaves [S, n + 1, ...], the position at index 0): the n-step
    returns [S], bootstrap discounts [S] and the observations they bootstrap from [S, ...]
    (`transition_replay.n_step_target`)."""
    g, discount, k = jax.vmap(lambda r, d, last: tr.n_step_target(r, d, last, gamma=gamma))(
        windows["reward"][:, 1:], windows["discount"][:, 1:], windows["last"][:, 1:])
    observation = jax.vmap(lambda obs, i: obs[i])(windows["observation"], k)
    return g, discount, observation


def apply_gradients(optimizer: optax.GradientTransformation, params: Params,
                    opt_state: optax.OptState, grads: Params, *,
                    axis_name: str | None) -> tuple[Params, optax.OptState]:
    """One optimiser step on gradients averaged over `axis_name` (when replicated)."""
    if axis_name is not None:
        grads = jax.lax.pmean(grads, axis_name)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def sample_loss(network: QNetwork, learn: LearnConfig, params: Params, target_params: Params,
                windows: dict, weights: Array, gamma: Array) -> tuple[Array, tuple]:
    """The importance-weighted mean loss of a sampled batch, and (per-sample priorities [S],
    metrics)."""
    g, discount, obs_t = batch_targets(windows, gamma=gamma)
    obs_tm1, a_tm1 = windows["observation"][:, 0], windows["action"][:, 0]
    q_tm1, logits_tm1 = network.apply(params, obs_tm1)
    q_t_online, _ = network.apply(params, obs_t)
    q_t_target, logits_t_target = network.apply(target_params, obs_t)
    if learn.head == "c51":
        per_sample = losses.categorical_loss(
            network.atoms(), logits_tm1, a_tm1, g, discount,
            jax.lax.stop_gradient(logits_t_target), q_t_online, double=learn.double)
        td = jnp.take_along_axis(q_tm1, a_tm1[:, None], axis=-1)[:, 0] - (
            g + discount * jnp.max(q_t_target, axis=-1))
        priorities = per_sample
    else:
        per_sample, td = losses.double_q_loss(
            q_tm1, a_tm1, g, discount, jax.lax.stop_gradient(q_t_target), q_t_online,
            double=learn.double, huber_delta=learn.huber_delta)
        priorities = jnp.abs(td)
    loss = jnp.mean(weights * per_sample)
    metrics = {"q_mean": jnp.mean(q_tm1), "td_abs": jnp.mean(jnp.abs(td)),
               "importance_weight": jnp.mean(weights)}
    return loss, (jax.lax.stop_gradient(priorities), metrics)


def learner_update(network: QNetwork, optimizer: optax.GradientTransformation,
                   replay: tr.TransitionReplay, learn: LearnConfig, state: LearnerState,
                   key: PRNGKey, *, axis_name: str | None) -> tuple[LearnerState, Metrics]:
    """One optimiser update on a batch sampled from this device's replay; the sampled
    positions' priorities are set to their new |td| (C51: cross-entropy)."""
    hp = state.hparams
    alpha = 0.0 if learn.uniform else hp["priority_exponent"]
    sample = replay.sample(state.replay, key, learn.batch_size,
                           alpha=alpha, beta=hp["importance_exponent"])
    grad_fn = jax.value_and_grad(sample_loss, argnums=2, has_aux=True)
    (loss, (priorities, metrics)), grads = grad_fn(
        network, learn, state.params, state.target_params, sample.items, sample.weights,
        hp["discount"])
    params, opt_state = apply_gradients(optimizer, state.params, state.opt_state, grads,
                                        axis_name=axis_name)
    updates = state.updates + 1
    target_params = optax.periodic_update(params, state.target_params, updates,
                                          learn.target_update_interval)
    new_replay = replay.update_priorities(state.replay, sample.indices, priorities)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), **metrics}
    return state.replace(params=params, target_params=target_params, opt_state=opt_state,
                         replay=new_replay, updates=updates), metrics


def learner_step(network: QNetwork, optimizer: optax.GradientTransformation,
                 replay: tr.TransitionReplay, learn: LearnConfig, state: LearnerState,
                 trajectory: Trajectory, key: PRNGKey, *, axis_name: str | None
                 ) -> tuple[LearnerState, Metrics]:
    """`Agent.learner_step`: the trajectory's timesteps into this device's replay, then
    `replay_ratio` updates once every device holds `warmup` sampleable positions. Metrics are
    averaged over the updates and over `axis_name`."""
    steps, sampleable = to_replay_steps(trajectory)
    state = state.replace(replay=replay.add(state.replay, steps, sampleable),
                          steps=state.steps + 1)
    size = replay.size(state.replay)
    update = lambda s, k: learner_update(network, optimizer, replay, learn, s, k,
                                         axis_name=axis_name)
    state, metrics = replay_loop.train_when_ready(
        update, state, key, size=size, updates_per_step=learn.replay_ratio,
        min_items=learn.warmup, metric_names=METRIC_NAMES, axis_name=axis_name)
    metrics = {**metrics, "replay_size": size.astype(jnp.float32)}
    if axis_name is not None:
        metrics = jax.lax.pmean(metrics, axis_name)
    return state, metrics
