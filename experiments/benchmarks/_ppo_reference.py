"""A hand-written PPO at PureJaxRL's CartPole settings: the reference that
`experiments.benchmarks.ppo` times Podracer's PPO against, in the same process.

The whole run is one jittable function of a key (PureJaxRL's `make_train` shape): separate
64 x 64 tanh actor and critic MLPs with orthogonal initialisation, Adam with a linearly
annealed step size and a global gradient-norm clip, GAE, advantages normalised per minibatch,
the clipped surrogate and clipped value losses and an entropy bonus. It steps the same wrapped
`envs_jax` environment as the Anakin run (automatic reset, episode statistics): the step out of
a LAST timestep is the reset, and its transition is masked; a time-limit end (LAST with discount
1) bootstraps from the final observation. It has no host loop, no metrics beyond the episode
returns, no checkpoints and no replication: a floor for what PPO costs on this workload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from podracer.agent import Agent
from podracer.types import EnvSpec


class _ActorCritic(nn.Module):
    num_actions: int

    @nn.compact
    def __call__(self, x):
        def mlp(y, out, scale):
            for _ in range(2):
                y = nn.tanh(nn.Dense(64, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(y))
            return nn.Dense(out, kernel_init=nn.initializers.orthogonal(scale))(y)

        return mlp(x, self.num_actions, 0.01), mlp(x, 1, 1.0)[..., 0]


class _Settings(NamedTuple):
    num_envs: int = 4
    num_steps: int = 128
    total_steps: int = 499_712
    num_epochs: int = 4
    num_minibatches: int = 4
    learning_rate: float = 2.5e-4
    discount: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    entropy_cost: float = 0.01
    value_cost: float = 0.5
    max_grad_norm: float = 0.5


def _pieces(num_actions: int, s: _Settings):
    """The network, the optimiser, and `learn(params, opt_state, traj, last_obs, last_mask,
    key)`: GAE backwards over a [T, B] rollout dict, then the epochs of shuffled minibatches."""
    num_updates = s.total_steps // (s.num_envs * s.num_steps)
    network = _ActorCritic(num_actions)
    schedule = optax.linear_schedule(s.learning_rate, 0.0,
                                     s.num_epochs * s.num_minibatches * num_updates)
    optimizer = optax.chain(optax.clip_by_global_norm(s.max_grad_norm),
                            optax.adam(schedule, eps=1e-5))
    clip_eps, discount, gae_lambda = s.clip_eps, s.discount, s.gae_lambda

    def loss_fn(params, mb):
        logits, value = network.apply(params, mb["obs"])
        log_pi = jax.nn.log_softmax(logits)
        log_prob = jnp.take_along_axis(log_pi, mb["action"][:, None], axis=-1)[:, 0]
        count = jnp.maximum(mb["mask"].sum(), 1.0)
        mean = lambda x: jnp.sum(x * mb["mask"]) / count
        adv = mb["adv"]
        adv = (adv - mean(adv)) / (jnp.sqrt(mean(jnp.square(adv - mean(adv)))) + 1e-8)
        ratio = jnp.exp(log_prob - mb["log_prob"])
        policy_loss = -mean(jnp.minimum(ratio * adv,
                                        jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv))
        clipped = mb["value"] + jnp.clip(value - mb["value"], -clip_eps, clip_eps)
        value_loss = 0.5 * mean(jnp.maximum(jnp.square(value - mb["target"]),
                                            jnp.square(clipped - mb["target"])))
        entropy = mean(-jnp.sum(jnp.exp(log_pi) * log_pi, axis=-1))
        return policy_loss + s.value_cost * value_loss - s.entropy_cost * entropy

    def learn(params, opt_state, traj, last_obs, last_mask, key):
        # GAE, BACKWARDS OVER THE ROLLOUT
        _, last_value = network.apply(params, last_obs)

        def gae_step(carry, t):
            advantage, next_value, next_mask = carry
            delta = t["reward"] + discount * t["discount"] * next_value - t["value"]
            advantage = delta + discount * gae_lambda * t["discount"] * next_mask * advantage
            return (advantage, t["value"], t["mask"]), advantage

        init = (jnp.zeros(last_mask.shape), last_value, last_mask)
        _, advantages = jax.lax.scan(gae_step, init, traj, reverse=True)
        data = {"obs": traj["obs"], "action": traj["action"], "log_prob": traj["log_prob"],
                "value": traj["value"], "mask": traj["mask"], "adv": advantages,
                "target": advantages + traj["value"]}
        batch = advantages.size
        data = jax.tree.map(lambda x: x.reshape((batch,) + x.shape[2:]), data)

        # EPOCHS OF SHUFFLED MINIBATCHES
        def epoch(carry, key):
            def minibatch(carry, mb):
                params, opt_state = carry
                grads = jax.grad(loss_fn)(params, mb)
                updates, opt_state = optimizer.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), None

            order = jax.random.permutation(key, batch)
            minibatches = jax.tree.map(
                lambda x: x[order].reshape((s.num_minibatches, -1) + x.shape[1:]), data)
            return jax.lax.scan(minibatch, carry, minibatches)[0], None

        (params, opt_state), _ = jax.lax.scan(epoch, (params, opt_state),
                                              jax.random.split(key, s.num_epochs))
        return params, opt_state

    return network, optimizer, learn


def _act(network, params, observation, key):
    logits, value = network.apply(params, observation)
    action = jax.random.categorical(key, logits)
    log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
    return action, log_prob, value


def _init_and_update(env, s: _Settings):
    """`init(key) -> carry` and `update(carry, _) -> (carry, mean return)`: one PPO update (a
    rollout, then `learn`), the body that `make_train` scans over the whole run."""
    network, optimizer, learn = _pieces(env.action_spec().num_values, s)

    def init(key):
        key, init_key, reset_key = jax.random.split(key, 3)
        params = network.init(init_key, jnp.zeros((1,) + env.observation_spec().shape))
        opt_state = optimizer.init(params)
        env_state, timestep = jax.vmap(env.reset)(jax.random.split(reset_key, s.num_envs))
        return params, opt_state, env_state, timestep, key

    def update(carry, _):
        params, opt_state, env_state, timestep, key = carry

        # COLLECT TRAJECTORIES
        def env_step(carry, key):
            env_state, timestep = carry
            action, log_prob, value = _act(network, params, timestep.observation, key)
            env_state, next_timestep = jax.vmap(env.step)(env_state, action)
            out = {"obs": timestep.observation, "action": action, "log_prob": log_prob,
                   "value": value, "mask": 1.0 - timestep.last(),
                   "reward": next_timestep.reward, "discount": next_timestep.discount,
                   "ended": next_timestep.last(),
                   "return": next_timestep.extras["episode_return"]}
            return (env_state, next_timestep), out

        key, rollout_key, epoch_key = jax.random.split(key, 3)
        (env_state, timestep), traj = jax.lax.scan(
            env_step, (env_state, timestep), jax.random.split(rollout_key, s.num_steps))
        params, opt_state = learn(params, opt_state, traj, timestep.observation,
                                  1.0 - timestep.last(), epoch_key)
        ended = traj["ended"].astype(jnp.float32)
        mean_return = jnp.sum(traj["return"] * ended) / jnp.sum(ended)
        return (params, opt_state, env_state, timestep, key), mean_return

    return init, update


def make_train(env, **settings) -> Callable[[jax.Array], jax.Array]:
    """`train(key) -> [num_updates]` mean return of the episodes that ended in each update
    (NaN where none did), for `env` (an `envs_jax` environment with discrete actions, wrapped
    for training); `settings`: the fields of `_Settings` (PureJaxRL's CartPole values)."""
    s = _Settings(**settings)
    num_updates = s.total_steps // (s.num_envs * s.num_steps)
    init, update = _init_and_update(env, s)

    def train(key):
        return jax.lax.scan(update, init(key), length=num_updates)[1]

    return train


def make_train_in_chunks(env, updates_per_chunk: int, **settings
                         ) -> tuple[Callable[[jax.Array], Any], Callable[[Any], Any]]:
    """The same run as `make_train`, as `init(key) -> carry` and `chunk(carry) -> (carry,
    [updates_per_chunk] mean returns)`, for a host loop to call chunk after chunk as
    `anakin.train` calls its compiled chunks."""
    init, update = _init_and_update(env, _Settings(**settings))
    return init, lambda carry: jax.lax.scan(update, carry, length=updates_per_chunk)


@chex.dataclass(frozen=True)
class ReferenceLearnerState:
    params: Any
    opt_state: Any


def make_agent(env_spec: EnvSpec, **settings) -> Agent:
    """The same PPO as a `podracer.Agent`, for `anakin.train` to run: the same network, acting
    and `learn`, the trajectory read into the dict `learn` takes. With it the benchmark tells
    the agent's cost from the runner's."""
    s = _Settings(**settings)
    network, optimizer, learn = _pieces(env_spec.action.num_values, s)

    def init(key, spec=env_spec):
        params = network.init(key, jnp.zeros((1,) + tuple(spec.observation.shape)))
        return ReferenceLearnerState(params=params, opt_state=optimizer.init(params))

    def actor_step(params, actor_state, timestep, key, evaluation=False):
        action, log_prob, value = _act(network, params, timestep.observation, key)
        return action, actor_state, {"log_prob": log_prob, "value": value}

    def learner_step(state, trajectory, key, *, axis_name):
        del axis_name  # one device
        ts = trajectory.timestep
        traj = {"obs": ts.observation[:-1], "action": trajectory.action,
                "log_prob": trajectory.extras["log_prob"], "value": trajectory.extras["value"],
                "mask": 1.0 - ts.last()[:-1], "reward": ts.reward[1:],
                "discount": ts.discount[1:]}
        params, opt_state = learn(state.params, state.opt_state, traj, ts.observation[-1],
                                  1.0 - ts.last()[-1], key)
        return ReferenceLearnerState(params=params, opt_state=opt_state), {}

    return Agent(init=init, actor_step=actor_step, learner_step=learner_step,
                 init_actor_state=lambda batch_size: (), actor_params=lambda state: state.params)
