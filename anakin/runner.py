"""The Anakin runner (Hessel et al., 2021, section 3): acting, environment stepping and
learning in one XLA program per device.

Per device, inside one compiled call:

    repeat K times (lax.scan):                              # updates_per_chunk
        repeat T times (lax.scan):                          # rollout_length
            action = agent.actor_step(params, timestep)     # batched over B envs
            env_state, timestep = vmap(env.step)(env_state, action)
        learner_state = agent.learner_step(trajectory)      # gradients pmean'd over devices
    return state, metrics reduced over the chunk

The per-device program is replicated over every device (of every process) by
`podracer.replication.replicate`. A thin host loop calls the compiled chunk repeatedly and
logs between calls; compile time is measured separately from run time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import agents
import envs_jax
from anakin.config import validate
from podracer import replication
from podracer.agent import Agent
from podracer.metrics import MetricsWriter
from podracer.types import DEVICE_AXIS, Metrics, Trajectory


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
    `envs_jax.EpisodeStatistics` adds)."""
    done = timesteps.last().astype(jnp.float32)
    return {
        "episode_return_sum": jnp.sum(done * timesteps.extras["episode_return"]),
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
            return (actor_state, env_state, next_timestep), (timestep, action, extras)

        keys = jax.random.split(key, rollout_length)
        (actor_state, env_state, last), (timesteps, actions, extras) = jax.lax.scan(
            body, (actor_state, env_state, timestep), keys
        )
        all_timesteps = jax.tree.map(
            lambda xs, x: jnp.concatenate([xs, x[None]], axis=0), timesteps, last
        )
        trajectory = Trajectory(timestep=all_timesteps, action=actions, extras=extras)
        return trajectory, actor_state, env_state, last

    return rollout


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
        # Timesteps o_1 .. o_T are new in this rollout (o_0 was the previous one's o_T).
        new_timesteps = jax.tree.map(lambda x: x[1:], trajectory.timestep)
        metrics = {**metrics, **episode_statistics(new_timesteps)}
        state = RunnerState(learner_state=learner_state, actor_state=actor_state,
                            env_state=env_state, timestep=timestep, key=key)
        return state, metrics

    def chunk(state: RunnerState) -> tuple[RunnerState, Metrics]:
        state, metrics = jax.lax.scan(update, state, length=updates_per_chunk)
        counts = {k: jnp.sum(metrics.pop(k)) for k in list(metrics) if k.startswith("episode")}
        means = jax.tree.map(jnp.mean, metrics)
        if axis_name is not None:
            counts = jax.lax.psum(counts, axis_name)
            means = jax.lax.pmean(means, axis_name)
        return state, {**means, **counts}

    return init, chunk


@dataclasses.dataclass
class TrainResult:
    state: RunnerState  # stacked over devices
    final_metrics: dict[str, float]  # the last log record
    history: list[dict[str, float]]  # every log record
    compile_seconds: float
    run_seconds: float

    @property
    def params(self) -> Any:
        """The learner parameters of this process's first device."""
        return replication.unreplicate(self.state.learner_state.params)


def train(config: ml_collections.ConfigDict, workdir: str | None = None, *,
          log_fn: Callable[[dict], None] | None = None) -> TrainResult:
    """Runs an Anakin experiment to `config.total_env_steps` and returns its final state.

    Writes `<workdir>/metrics.jsonl` and prints one progress line per chunk (process 0 only).
    """
    num_devices = validate(config, jax.device_count())
    mesh = replication.make_mesh(jax.devices()[:num_devices])
    env = envs_jax.make(config.env.name, **config.env.get("kwargs", {}))
    env = envs_jax.wrap_for_training(env, config.env.max_episode_steps or None)
    agent = agents.make(config.agent, env.spec())
    envs_per_device = config.num_envs // num_devices
    init, chunk = make_programs(
        agent, env,
        envs_per_device=envs_per_device,
        rollout_length=config.rollout_length,
        updates_per_chunk=config.updates_per_chunk,
    )

    # Every process derives the same global keys and places its own devices' slices.
    env_key, params_key = jax.random.split(jax.random.PRNGKey(config.seed))
    env_keys = replication.from_global(np.asarray(jax.random.split(env_key, num_devices)), mesh)
    params_keys = replication.from_global(
        np.broadcast_to(np.asarray(params_key), (num_devices, 2)), mesh
    )

    start = time.perf_counter()
    init_fn = replication.replicate(init, mesh)
    state = init_fn(env_keys, params_keys)
    chunk_fn = replication.replicate(chunk, mesh, donate_argnums=0).lower(state).compile()
    compile_seconds = time.perf_counter() - start

    steps_per_chunk = config.updates_per_chunk * config.rollout_length * config.num_envs
    num_chunks = -(-config.total_env_steps // steps_per_chunk)
    writer = MetricsWriter(workdir, enabled=jax.process_index() == 0)
    is_main = jax.process_index() == 0
    if is_main:
        print(f"Anakin: {config.agent.name} on {config.env.name}, {num_devices} device(s) "
              f"({jax.devices()[0].platform}), {config.num_envs} envs, T={config.rollout_length}, "
              f"{config.updates_per_chunk} updates/chunk, {num_chunks} chunks; "
              f"compiled in {compile_seconds:.1f}s", flush=True)

    history = []
    run_start = last_time = time.perf_counter()
    for i in range(num_chunks):
        state, metrics = chunk_fn(state)
        metrics = jax.device_get(replication.unreplicate(metrics))
        now = time.perf_counter()
        episodes = float(metrics.pop("episodes"))
        return_sum = float(metrics.pop("episode_return_sum"))
        length_sum = float(metrics.pop("episode_length_sum"))
        record = {
            "env_steps": (i + 1) * steps_per_chunk,
            "updates": (i + 1) * config.updates_per_chunk,
            "episode_return": return_sum / episodes if episodes else float("nan"),
            "episode_length": length_sum / episodes if episodes else float("nan"),
            "episodes": int(episodes),
            "steps_per_second": steps_per_chunk / (now - last_time),
            "wall_time": now - run_start + compile_seconds,
            **{k: float(v) for k, v in metrics.items()},
        }
        last_time = now
        history.append(record)
        writer.write(record)
        if log_fn is not None:
            log_fn(record)
    run_seconds = time.perf_counter() - run_start
    writer.close()
    final = history[-1] if history else {}
    if is_main:
        print(f"Done: {final.get('env_steps', 0):,} env steps in {run_seconds:.1f}s "
              f"(+{compile_seconds:.1f}s compile); final mean episode return "
              f"{final.get('episode_return', float('nan')):.3f}", flush=True)
    return TrainResult(state=state, final_metrics=final, history=history,
                       compile_seconds=compile_seconds, run_seconds=run_seconds)
