"""Anakin's compiled core (Hessel et al., 2021, section 3): the rollout, the per-device `init`
and `chunk` programs, greedy evaluation and episode statistics, all pure functions of the agent
and the environment, with no host loop (that is `anakin.runner.train`).

Per device, inside one compiled call:

    repeat K times (lax.scan):                              # updates_per_chunk
        repeat T times (lax.scan):                          # rollout_length
            action = agent.actor_step(params, timestep)     # batched over B envs
            env_state, timestep = vmap(env.step)(env_state, action)
        learner_state = agent.learner_step(trajectory)      # gradients pmean'd over devices
    return state, metrics reduced over the chunk
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

import envs_jax
from podracer import faults, scans
from podracer.agent import Agent
from podracer.types import DEVICE_AXIS, Metrics, Params, PRNGKey, Trajectory


@chex.dataclass(frozen=True)
class RunnerState:
    """Everything one device carries from chunk to chunk."""

    learner_state: Any
    actor_state: Any
    env_state: Any  # [B_per_device, ...]
    timestep: Any  # [B_per_device, ...] the latest timestep of every environment
    key: jax.Array  # this device's RNG key


def episode_statistics(timesteps: Any) -> dict[str, jax.Array]:
    """Sums and counts of completed episodes among `timesteps` ([T, B], with the extras that
    `envs_jax.EpisodeStatistics` adds). An environment with one reward per agent ([T, B, N])
    counts the team's return, the sum over agents."""
    done = timesteps.last().astype(jnp.float32)
    returns = timesteps.extras["episode_return"]
    returns = jnp.sum(jnp.reshape(returns, done.shape + (-1,)), axis=-1)
    return {
        "episode_return_sum": jnp.sum(done * returns),
        "episode_length_sum": jnp.sum(done * timesteps.extras["episode_length"]),
        "episodes": jnp.sum(done),
    }


def make_rollout(agent: Agent, env: envs_jax.Environment, rollout_length: int) -> Callable:
    """`rollout(params, actor_state, env_state, timestep, key)` -> T steps of experience."""

    def rollout(params, actor_state, env_state, timestep, key):
        def body(carry, key):
            actor_state, env_state, timestep = carry
            action, actor_state, extras = agent.actor_step(params, actor_state, timestep, key)
            env_state, next_timestep = jax.vmap(env.step)(env_state, action)
            return (actor_state, env_state, next_timestep), (next_timestep, action, extras)

        keys = jax.random.split(key, rollout_length)
        (actor_state, env_state, _), (new_timesteps, actions, extras) = jax.lax.scan(
            body, (actor_state, env_state, timestep), keys
        )
        # o_T read from the stacked outputs, not from the carry: the carried timestep's fields
        # that the actor does not read are then dead in the loop and XLA drops them from it.
        last = jax.tree.map(lambda x: x[-1], new_timesteps)
        # o_0, then the scan's o_1 .. o_T: the loop emits the timestep it makes, rather than
        # the one it carried in, so it needs no copy of the carried one per step.
        all_timesteps = jax.tree.map(
            lambda x, xs: jnp.concatenate([x[None], xs], axis=0), timestep, new_timesteps
        )
        trajectory = Trajectory(timestep=all_timesteps, action=actions, extras=extras)
        return trajectory, actor_state, env_state, last

    return rollout


FIRST_NONFINITE = "first_nonfinite_update"  # a chunk metric, not logged: see `train`


def make_programs(agent: Agent, env: envs_jax.Environment, *, envs_per_device: int,
                  rollout_length: int, updates_per_chunk: int,
                  axis_name: str | None = DEVICE_AXIS) -> tuple[Callable, Callable]:
    """The per-device `init(env_key, params_key) -> RunnerState` and
    `chunk(RunnerState) -> (RunnerState, metrics)` programs (unreplicated)."""
    rollout = make_rollout(agent, env, rollout_length)

    def init(env_key: jax.Array, params_key: jax.Array) -> RunnerState:
        # Same params key on every device: identical initial parameters without a broadcast.
        learner_state = agent.init(params_key, env.spec())
        env_key, reset_key = jax.random.split(env_key)
        env_state, timestep = jax.vmap(env.reset)(jax.random.split(reset_key, envs_per_device))
        return RunnerState(
            learner_state=learner_state,
            actor_state=agent.init_actor_state(envs_per_device),
            env_state=env_state,
            timestep=timestep,
            key=env_key,
        )

    def update(state: RunnerState, _: Any) -> tuple[RunnerState, Metrics]:
        key, act_key, learn_key = jax.random.split(state.key, 3)
        # COLLECT A TRAJECTORY
        params = agent.actor_params(state.learner_state)
        trajectory, actor_state, env_state, timestep = rollout(
            params, state.actor_state, state.env_state, state.timestep, act_key
        )
        # LEARN FROM IT
        learner_state, metrics = agent.learner_step(
            state.learner_state, trajectory, learn_key, axis_name=axis_name
        )
        finite = faults.all_finite(metrics, agent.actor_params(learner_state))
        # Timesteps o_1 .. o_T are new in this rollout (o_0 was the previous one's o_T).
        new_timesteps = jax.tree.map(lambda x: x[1:], trajectory.timestep)
        metrics = {**metrics, **episode_statistics(new_timesteps), faults.FINITE: finite}
        state = RunnerState(learner_state=learner_state, actor_state=actor_state,
                            env_state=env_state, timestep=timestep, key=key)
        return state, metrics

    def chunk(state: RunnerState) -> tuple[RunnerState, Metrics]:
        state, metrics = scans.scan_with_metrics(update, state, length=updates_per_chunk)
        # The first update (0-based, within the chunk) whose loss or parameters are not
        # finite on any device; `updates_per_chunk` when all are.
        first_bad = faults.first_false(metrics.pop(faults.FINITE) > 0)
        counts = {k: jnp.sum(metrics.pop(k)) for k in list(metrics) if k.startswith("episode")}
        means = jax.tree.map(jnp.mean, metrics)
        if axis_name is not None:
            counts = jax.lax.psum(counts, axis_name)
            means = jax.lax.pmean(means, axis_name)
            first_bad = jax.lax.pmin(first_bad, axis_name)
        return state, {**means, **counts, FIRST_NONFINITE: first_bad}

    return init, chunk


def make_evaluator(agent: Agent, env: envs_jax.Environment, *, num_episodes: int,
                   max_steps: int) -> Callable[[Params, PRNGKey], Metrics]:
    """`evaluate(params, key)` -> greedy returns over `num_episodes` fresh environments.

    Each environment plays one episode with `actor_step(..., evaluation=True)`; the loop stops
    when all have ended or after `max_steps` steps (an unfinished episode counts with its
    return so far). Returns `eval_return` (mean), `eval_return_std` and `eval_finished` (the
    fraction of episodes that ended).
    """

    def evaluate(params: Params, key: PRNGKey) -> Metrics:
        reset_key, act_key = jax.random.split(key)
        env_state, timestep = jax.vmap(env.reset)(jax.random.split(reset_key, num_episodes))
        actor_state = agent.init_actor_state(num_episodes)
        returns = jnp.zeros(timestep.reward.shape, jnp.float32)
        done = jnp.zeros((num_episodes,), bool)

        def cond(carry):
            t, *_, done = carry
            return (t < max_steps) & ~jnp.all(done)

        def body(carry):
            t, key, actor_state, env_state, timestep, returns, done = carry
            key, step_key = jax.random.split(key)
            action, actor_state, _ = agent.actor_step(params, actor_state, timestep, step_key,
                                                      evaluation=True)
            env_state, timestep = jax.vmap(env.step)(env_state, action)
            # Rewards after an environment's first LAST belong to its next episode.
            live = jnp.reshape(~done, (-1,) + (1,) * (returns.ndim - 1))
            returns = returns + jnp.where(live, timestep.reward.astype(jnp.float32), 0.0)
            done = done | timestep.last()
            return t + 1, key, actor_state, env_state, timestep, returns, done

        carry = (jnp.zeros((), jnp.int32), act_key, actor_state, env_state, timestep, returns,
                 done)
        *_, returns, done = jax.lax.while_loop(cond, body, carry)
        return {"eval_return": jnp.mean(returns), "eval_return_std": jnp.std(returns),
                "eval_finished": jnp.mean(done.astype(jnp.float32))}

    return evaluate
