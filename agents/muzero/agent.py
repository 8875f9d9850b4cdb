"""MuZero as the three pure functions of `podracer.agent.Agent`, with on-device replay.

Acting runs an mctx search (PUCT `muzero_policy` with Dirichlet noise at the root, or
`gumbel_muzero_policy`) from the representation of each observation. Learning owns the
replay: each call of `learner_step` inserts the fresh trajectory (one replay item per
environment: a whole `[T+1]` segment) and then performs `updates_per_step` updates, each on a
sampled batch unrolled K steps through the dynamics — an explicit replay ratio, so results do
not depend on how fast the hardware is. Value targets are n-step returns bootstrapped from a
target network; optionally (Reanalyse) a fraction of each batch has its policy and value
targets recomputed by searching with the target network.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import ml_collections
import mctx
import optax

from agents.muzero import targets as tgt
from agents.muzero.networks import MuZeroNetwork, make_network
from podracer import replay as replay_lib
from podracer.agent import Agent
from podracer.config import ConfigError
from podracer.types import Array, EnvSpec, Metrics, Params, PRNGKey, StepType, TimeStep, Trajectory


@chex.dataclass(frozen=True)
class LearnerState:
    params: Params
    target_params: Params
    opt_state: optax.OptState
    replay: replay_lib.ReplayState
    updates: Array  # [] int32 learner updates applied so far


def default_config() -> ml_collections.ConfigDict:
    """MuZero's hyperparameters, one comment per field."""
    c = ml_collections.ConfigDict()
    c.name = "muzero"
    # Networks.
    c.network = "auto"  # "auto" | "mlp" | "resnet" (auto: resnet for rank-3 observations)
    c.latent_size = 64  # MLP latent width
    c.hidden_sizes = (64,)  # hidden layers of the MLP nets and of every head
    c.channels = 32  # resnet latent channels
    c.num_blocks = 2  # resnet blocks in each of h, g and f
    c.support_size = 10  # categorical value/reward support: integers in [-S, S] after h(x)
    # Search.
    c.search = "muzero"  # "muzero" (PUCT + Dirichlet noise) | "gumbel"
    c.num_simulations = 16
    c.dirichlet_alpha = 0.3
    c.dirichlet_fraction = 0.25
    c.temperature = 1.0  # visit-count temperature for acting (PUCT search)
    c.max_num_considered_actions = 16  # Gumbel search
    c.gumbel_scale = 1.0  # Gumbel search, acting (evaluation uses 0)
    # Learning.
    c.discount = 0.97
    c.unroll_steps = 5  # K
    c.td_steps = 10  # n of the n-step value targets
    c.batch_size = 64  # sampled segments per update (per device)
    c.updates_per_step = 1  # updates per inserted trajectory: the replay ratio
    c.learning_rate = 1e-3
    c.max_grad_norm = 5.0
    c.weight_decay = 1e-4
    c.value_cost = 0.25
    c.target_update_interval = 100  # updates between target-network copies
    c.reanalyse_fraction = 0.0  # share of each batch whose targets are recomputed by search
    # Replay (per device).
    c.replay_capacity = 2048  # segments; each holds rollout_length + 1 timesteps
    c.min_replay_items = 256  # no updates until this many segments are stored
    c.priority_exponent = 1.0  # alpha; 0 = uniform
    c.importance_exponent = 1.0  # beta
    c.rollout_length = 20  # T of the segments it receives; experiments tie it to the runner's
    # Store stacked image observations ([H, W, C] uint8) as one frame per step plus the first
    # stack of each segment, rebuilding stacks when sampled: C times less replay memory.
    # "auto": on for rank-3 uint8 observations.
    c.store_frames_once = "auto"
    return c


def _check_replay_fits(config: ml_collections.ConfigDict, item: dict) -> None:
    needed = replay_lib.replay_bytes(config.replay_capacity, item)
    available = replay_lib.device_memory_bytes(jax.local_devices()[0])
    if available is not None and needed > 0.8 * available:
        raise ConfigError(
            "agent.replay_capacity",
            f"{config.replay_capacity} segments need {needed / 2**30:.2f} GiB per device, more "
            f"than 80% of the {available / 2**30:.2f} GiB the device has",
            f"use at most {int(0.8 * available / (needed / config.replay_capacity))} segments",
        )


def make_recurrent_fn(network: MuZeroNetwork, support_size: int, discount: float):
    """mctx's `recurrent_fn`: one step of the learnt model from `embedding` ([B, ...]) with
    `action` ([B]) -> (RecurrentFnOutput with [B] reward, discount, value and [B, A] prior
    logits, next embedding). Consumes no randomness."""

    def to_scalar(logits: Array) -> Array:
        return tgt.probs_to_scalar(jax.nn.softmax(logits), support_size)

    def recurrent_fn(params, key, action, embedding):
        del key
        reward_logits, latent = network.apply(params, embedding, action, method="dynamics")
        prior_logits, value_logits = network.apply(params, latent, method="predict")
        output = mctx.RecurrentFnOutput(
            reward=to_scalar(reward_logits),
            # The learnt model does not predict episode ends: MuZero plans as if the episode
            # went on, and terminal states are handled by the value targets instead (a
            # terminal's value target is 0, so the model learns to value it so).
            discount=jnp.full(action.shape, discount, jnp.float32),
            prior_logits=prior_logits,
            value=to_scalar(value_logits),
        )
        return output, latent

    return recurrent_fn


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    network: MuZeroNetwork = make_network(config, env_spec)
    num_actions = env_spec.action.num_values
    support = config.support_size
    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(config.learning_rate, weight_decay=config.weight_decay),
    )
    replay = replay_lib.make_replay(config.replay_capacity, alpha=config.priority_exponent,
                                    beta=config.importance_exponent)
    length = config.rollout_length + 1
    obs_spec = env_spec.observation
    frames_once = config.store_frames_once
    if frames_once == "auto":
        frames_once = len(obs_spec.shape) == 3 and obs_spec.dtype == jnp.uint8
    if frames_once:
        observation_fields = {
            "frames": jnp.zeros((length,) + tuple(obs_spec.shape[:2]), obs_spec.dtype),
            "first_stack": jnp.zeros(tuple(obs_spec.shape), obs_spec.dtype),
        }
    else:
        observation_fields = {
            "observation": jnp.zeros((length,) + tuple(obs_spec.shape), obs_spec.dtype)}
    example_item = {
        **observation_fields,
        "action": jnp.zeros((length - 1,), jnp.int32),
        "reward": jnp.zeros((length,), jnp.float32),
        "discount": jnp.zeros((length,), jnp.float32),
        "step_type": jnp.zeros((length,), jnp.int8),
        "policy": jnp.zeros((length - 1, num_actions), jnp.float32),
    }
    _check_replay_fits(config, example_item)

    def to_scalar(logits: Array) -> Array:
        return tgt.probs_to_scalar(jax.nn.softmax(logits), support)

    recurrent_fn = make_recurrent_fn(network, support, config.discount)

    def search(params, observation, key, *, evaluation: bool):
        latent = network.apply(params, observation, method="represent")
        prior_logits, value_logits = network.apply(params, latent, method="predict")
        root = mctx.RootFnOutput(prior_logits=prior_logits, value=to_scalar(value_logits),
                                 embedding=latent)
        if config.search == "gumbel":
            return mctx.gumbel_muzero_policy(
                params, key, root, recurrent_fn,
                num_simulations=config.num_simulations,
                max_num_considered_actions=config.max_num_considered_actions,
                gumbel_scale=0.0 if evaluation else config.gumbel_scale,
            )
        return mctx.muzero_policy(
            params, key, root, recurrent_fn,
            num_simulations=config.num_simulations,
            dirichlet_fraction=0.0 if evaluation else config.dirichlet_fraction,
            dirichlet_alpha=config.dirichlet_alpha,
            temperature=config.temperature,
        )

    # ACTING

    def actor_step(params, actor_state, timestep: TimeStep, key: PRNGKey, *, evaluation=False):
        out = search(params, timestep.observation, key, evaluation=evaluation)
        action = jnp.argmax(out.action_weights, -1) if evaluation else out.action
        extras = {"policy": out.action_weights,
                  "root_value": out.search_tree.summary().value}
        return action.astype(jnp.int32), actor_state, extras

    # LEARNING

    def init(key: PRNGKey, spec: EnvSpec = env_spec) -> LearnerState:
        dummy_obs = jnp.zeros((1,) + tuple(spec.observation.shape), spec.observation.dtype)
        params = network.init(key, dummy_obs, jnp.zeros((1,), jnp.int32))
        return LearnerState(
            params=params,
            target_params=params,
            opt_state=optimizer.init(params),
            replay=replay.init(jax.tree.map(lambda x: x, example_item)),
            updates=jnp.zeros((), jnp.int32),
        )

    def trajectory_items(trajectory: Trajectory) -> dict:
        """One replay item per environment: [T+1, B, ...] -> [B, T+1, ...]."""
        ts = trajectory.timestep
        if frames_once:
            observation_fields = {"frames": ts.observation[..., -1],
                                  "first_stack": ts.observation[:1]}  # [1, B, H, W, C]
        else:
            observation_fields = {"observation": ts.observation}
        items = {
            **observation_fields,
            "action": trajectory.action,
            "reward": ts.reward,
            "discount": ts.discount,
            "step_type": ts.step_type.astype(jnp.int8),
            "policy": trajectory.extras["policy"],
        }
        items = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), items)
        if frames_once:
            items["first_stack"] = items["first_stack"][:, 0]
        return items

    def with_observations(items: dict) -> dict:
        """Sampled items with `observation` [B, L, ...] rebuilt when frames are stored once."""
        if not frames_once:
            return items
        items = dict(items)
        items["observation"] = jax.vmap(tgt.rebuild_frame_stacks)(
            items.pop("frames"), items.pop("first_stack"), items["step_type"].astype(jnp.int32))
        return items

    def segment_targets(target_params, items, key):
        """Value (n-step) and policy targets for every position of each sampled segment."""
        obs = items["observation"]  # [B, L, ...]
        b, l = obs.shape[:2]
        flat = obs.reshape((b * l,) + obs.shape[2:])
        policy = jnp.concatenate(
            [items["policy"], jnp.zeros((b, 1, num_actions), jnp.float32)], axis=1)
        num_reanalyse = int(round(config.reanalyse_fraction * b))
        if num_reanalyse:
            # REANALYSE: fresh search with the target network on the first segments.
            re_obs = flat[: num_reanalyse * l]
            out = search(target_params, re_obs, key, evaluation=False)
            re_values = out.search_tree.summary().value.reshape(num_reanalyse, l)
            re_policy = out.action_weights.reshape(num_reanalyse, l, num_actions)
        latent = network.apply(target_params, flat, method="represent")
        _, value_logits = network.apply(target_params, latent, method="predict")
        values = to_scalar(value_logits).reshape(b, l)
        if num_reanalyse:
            values = values.at[:num_reanalyse].set(re_values)
            policy = policy.at[:num_reanalyse].set(re_policy)
        z = jax.vmap(functools.partial(tgt.n_step_values, n=config.td_steps,
                                       discount=config.discount))(
            items["reward"], items["discount"], items["step_type"].astype(jnp.int32), values)
        return jax.lax.stop_gradient(z), jax.lax.stop_gradient(policy)

    def loss_fn(params, items, starts, z, policy, weights):
        """The K-step unrolled loss for a batch of segments starting at `starts` ([B])."""
        b, l = items["step_type"].shape
        k_steps = config.unroll_steps
        gather = jax.vmap(lambda x, i: x[i])
        last = items["step_type"] == StepType.LAST  # [B, L]
        obs0 = gather(items["observation"], starts)
        latent = network.apply(params, obs0, method="represent")
        alive = jnp.ones((b,), jnp.float32)  # no episode end before this unroll step
        value_loss = policy_loss = reward_loss = 0.0
        first_value = None
        for k in range(k_steps + 1):
            pos = starts + k
            in_segment = (pos < l).astype(jnp.float32)
            pos_c = jnp.minimum(pos, l - 1)
            valid = alive * in_segment
            if k > 0:
                # Reward for the transition into `pos` from the previous unroll step.
                reward_target = tgt.scalar_to_probs(gather(items["reward"], pos_c), support)
                reward_loss += valid * optax.softmax_cross_entropy(reward_logits, reward_target)
            policy_logits, value_logits = network.apply(params, latent, method="predict")
            if k == 0:
                first_value = to_scalar(value_logits)
            value_target = tgt.scalar_to_probs(gather(z, pos_c), support)
            value_loss += valid * optax.softmax_cross_entropy(value_logits, value_target)
            has_policy = valid * (pos < l - 1) * (1.0 - gather(last, pos_c))
            policy_loss += has_policy * optax.softmax_cross_entropy(
                policy_logits, gather(policy, pos_c))
            if k < k_steps:
                action = gather(items["action"], jnp.minimum(pos_c, l - 2))
                reward_logits, latent = network.apply(params, latent, action, method="dynamics")
                # Halve the gradient into the dynamics (MuZero appendix G).
                latent = 0.5 * latent + 0.5 * jax.lax.stop_gradient(latent)
                alive = alive * (1.0 - gather(last, pos_c).astype(jnp.float32))
        per_example = (policy_loss + config.value_cost * value_loss + reward_loss) / (k_steps + 1)
        loss = jnp.mean(weights * per_example)
        priorities = jnp.abs(first_value - gather(z, starts))
        metrics = {
            "loss": loss,
            "value_loss": jnp.mean(value_loss) / (k_steps + 1),
            "policy_loss": jnp.mean(policy_loss) / (k_steps + 1),
            "reward_loss": jnp.mean(reward_loss) / k_steps,
        }
        return loss, (priorities, metrics)

    def one_update(state: LearnerState, key: PRNGKey, axis_name):
        sample_key, start_key, reanalyse_key = jax.random.split(key, 3)
        sample = replay.sample(state.replay, sample_key, config.batch_size)
        items = with_observations(sample.items)
        starts = jax.random.randint(start_key, (config.batch_size,), 0,
                                    config.rollout_length)
        z, policy = segment_targets(state.target_params, items, reanalyse_key)
        grads, (priorities, metrics) = jax.grad(loss_fn, has_aux=True)(
            state.params, items, starts, z, policy, sample.weights)
        if axis_name is not None:
            grads = jax.lax.pmean(grads, axis_name)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        count = state.updates + 1
        target_params = jax.tree.map(
            lambda new, old: jnp.where(count % config.target_update_interval == 0, new, old),
            params, state.target_params)
        new_state = LearnerState(
            params=params, target_params=target_params, opt_state=opt_state,
            replay=replay.update(state.replay, sample.indices, priorities), updates=count)
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads),
                   "mean_priority": jnp.mean(priorities)}
        return new_state, metrics

    metric_names = ("loss", "value_loss", "policy_loss", "reward_loss", "grad_norm",
                    "mean_priority")

    def learner_step(state: LearnerState, trajectory: Trajectory, key: PRNGKey, *,
                     axis_name: str | None) -> tuple[LearnerState, Metrics]:
        if trajectory.action.shape[0] != config.rollout_length:
            raise ConfigError(
                "agent.rollout_length",
                f"is {config.rollout_length} but the runner sends trajectories of "
                f"T={trajectory.action.shape[0]}",
                "tie them: config.agent.rollout_length = config.get_ref('rollout_length')",
            )
        state = state.replace(replay=replay.add(state.replay, trajectory_items(trajectory)))

        def train(state):
            keys = jax.random.split(key, config.updates_per_step)
            state, metrics = jax.lax.scan(
                lambda s, k: one_update(s, k, axis_name), state, keys)
            return state, jax.tree.map(jnp.mean, metrics)

        def wait(state):
            return state, {name: jnp.zeros((), jnp.float32) for name in metric_names}

        # Every device inserts the same number of items, so all take the same branch.
        ready = state.replay.size >= config.min_replay_items
        state, metrics = jax.lax.cond(ready, train, wait, state)
        metrics = {**metrics, "replay_size": state.replay.size.astype(jnp.float32)}
        if axis_name is not None:
            metrics = jax.lax.pmean(metrics, axis_name)
        return state, metrics

    return Agent(
        init=init,
        actor_step=actor_step,
        learner_step=learner_step,
        init_actor_state=lambda batch_size: (),
        actor_params=lambda state: state.params,
    )
