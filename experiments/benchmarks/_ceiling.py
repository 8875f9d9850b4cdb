"""The environment-only ceiling that the Anakin benchmarks print next to their figures, the
timing helpers the benchmarks share, and the loop count of a batched mctx search and the
search programs whose mean Q differs only in how it is computed."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import anakin
from agents.muzero import search as muzero_search
from podracer import replication


def best_time(fn, state, repeats: int) -> float:
    """Best wall time of `repeats` calls of `fn(state) -> (state, out)` after one warm-up."""
    state, out = fn(state)  # warm-up
    jax.block_until_ready(out)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        state, out = fn(state)
        jax.block_until_ready(out)
        best = min(best, time.perf_counter() - start)
    return best


def best_call_time(fn, *args, repeats: int) -> float:
    """Best wall time of `repeats` calls of `fn(*args)` after one warm-up call."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def env_ceiling_seconds(env, mesh, *, envs_per_device: int, rollout_length: int,
                        updates_per_chunk: int, repeats: int) -> float:
    """Best time of one chunk of the environment alone: `envs_per_device` environments per
    device of `mesh` stepped with uniformly random actions in the runner's scan structure
    (`updates_per_chunk` x `rollout_length` steps), replicated, after compilation."""
    n = envs_per_device
    spec = env.action_spec()

    def random_action(key):
        if hasattr(spec, "num_values"):
            return jax.random.randint(key, (n,), 0, spec.num_values)
        return jax.random.uniform(key, (n,) + tuple(spec.shape), minval=-1.0, maxval=1.0)

    def env_init(key):
        state, _ = jax.vmap(env.reset)(jax.random.split(key, n))
        return state, key

    def env_chunk(carry):
        def step(carry, _):
            state, key = carry
            key, action_key = jax.random.split(key)
            state, timestep = jax.vmap(env.step)(state, random_action(action_key))
            return (state, key), timestep.reward.sum()

        def rollout(carry, _):
            carry, rewards = jax.lax.scan(step, carry, length=rollout_length)
            return carry, rewards.sum()

        carry, rewards = jax.lax.scan(rollout, carry, length=updates_per_chunk)
        return carry, rewards.sum()

    num_devices = mesh.devices.size
    keys = replication.from_global(jax.random.split(jax.random.PRNGKey(0), num_devices), mesh)
    env_state = replication.replicate(env_init, mesh)(keys)
    env_fn = replication.replicate(env_chunk, mesh, donate_argnums=0)
    return best_time(env_fn, env_state, repeats)


def anakin_replay_chunk(agent, env, config) -> tuple[Callable, Any, int]:
    """A replay agent's Anakin chunk on one device, compiled and run once (which fills its
    replay past the warm-up): (the jitted chunk, the state after that first call, the env
    steps one call makes)."""
    n = config.num_envs
    init, chunk = anakin.make_programs(agent, env, envs_per_device=n,
                                       rollout_length=config.rollout_length,
                                       updates_per_chunk=config.updates_per_chunk, axis_name=None)
    state = jax.jit(init)(jax.random.PRNGKey(0), jax.random.PRNGKey(1))
    chunk = jax.jit(chunk)
    state, _ = chunk(state)
    return chunk, state, config.updates_per_chunk * config.rollout_length * n


def muzero_passes(network, steps: int) -> Callable:
    """A jitted `f(params, obs)` that makes the network passes of one MuZero search of `steps`
    simulations over the roots `obs` and nothing else (one representation and prediction, then
    one dynamics and prediction per simulation, no tree): the searches' ceiling."""

    @jax.jit
    def passes(params, obs):
        latent = network.apply(params, obs, method="represent")
        out = network.apply(params, latent, method="predict")

        def body(latent, action):
            _, latent = network.apply(params, latent, action, method="dynamics")
            logits, value = network.apply(params, latent, method="predict")
            return latent, logits.sum() + value.sum()

        actions = jnp.zeros((steps, obs.shape[0]), jnp.int32)
        return jax.lax.scan(body, latent, actions)[1].sum() + out[0].sum()

    return passes


def mean_q_searches(network, search_config) -> dict[str, Callable]:
    """Per method of `agents.muzero.mean_q` ("walk", "jumps"), a jitted `f(params, obs, key)`
    that runs `search_config`'s search alone (no actor step around it) with the parents' mean
    Q computed that way."""
    return {method: jax.jit(lambda p, o, k, c=dataclasses.replace(
                search_config, mean_q_method=method): muzero_search.run_search(
                    network, p, o, k, c, evaluation=False).action_weights)
            for method in muzero_search.MEAN_Q_METHODS}


def tree_loop_iterations(parents) -> int:
    """The while-loop iterations of one batched mctx search whose tree has `parents` ([B, N],
    node k + 1 added by simulation k; -1 at the root): each simulation walks from the root down
    to its new node and from there back up, one edge an iteration, and as both loops are
    vmapped over the batch, each runs until its deepest root is done: 2 x the sum over
    simulations of the depth of the batch's deepest new node."""
    parents = np.asarray(parents)
    batch, nodes = parents.shape
    depth = np.zeros((batch, nodes), np.int64)
    for node in range(1, nodes):
        parent = parents[:, node]
        depth[:, node] = np.where(parent >= 0, depth[np.arange(batch), np.maximum(parent, 0)] + 1,
                                  0)
    return int(2 * depth[:, 1:].max(axis=0).sum())
