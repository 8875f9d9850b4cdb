"""Benchmark: Anakin V-trace environment steps per second next to its ceiling.

The ceiling is the same wrapped environment stepped with uniformly random actions in the same
vmapped, scanned, replicated program, with no agent. Both are measured in this run, after
compilation, as the best of `--repeats` timed chunks.

    python -m experiments.benchmark_anakin [--config.env.name=catch] [--repeats=5]
"""

from __future__ import annotations

import os
import platform

import jax
import jax.numpy as jnp
from absl import app, flags
from ml_collections import config_flags

import anakin
import envs_jax
from experiments._ceiling import best_time as _best_time
from experiments._ceiling import env_ceiling_seconds
from podracer import replication

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "configs", "vtrace_catch.py"),
    "Experiment config; num_envs is overridden to envs_per_device x devices.")
_ENVS_PER_DEVICE = flags.DEFINE_integer("envs_per_device", 256, "Environments per device.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed chunks per measurement (best is kept).")


def main(argv):
    del argv
    config = _CONFIG.value
    num_devices = anakin.validate(config, jax.device_count())
    config.num_envs = _ENVS_PER_DEVICE.value * num_devices
    mesh = replication.make_mesh(jax.devices()[:num_devices])
    env = envs_jax.wrap_for_training(envs_jax.make(config.env.name, **config.env.kwargs),
                                     config.env.max_episode_steps or None)
    steps_per_chunk = config.updates_per_chunk * config.rollout_length * config.num_envs
    n = _ENVS_PER_DEVICE.value

    env_seconds = env_ceiling_seconds(env, mesh, envs_per_device=n,
                                      rollout_length=config.rollout_length,
                                      updates_per_chunk=config.updates_per_chunk,
                                      repeats=_REPEATS.value)

    # ANAKIN: the same chunk the runner compiles.
    import agents  # noqa: PLC0415  (kept next to its only use)

    agent = agents.make(config.agent, env.spec())
    init, chunk = anakin.make_programs(
        agent, env, envs_per_device=n, rollout_length=config.rollout_length,
        updates_per_chunk=config.updates_per_chunk)
    env_keys = replication.from_global(jax.random.split(jax.random.PRNGKey(1), num_devices), mesh)
    params_keys = replication.from_global(
        jnp.broadcast_to(jax.random.PRNGKey(2), (num_devices, 2)), mesh)
    state = replication.replicate(init, mesh)(env_keys, params_keys)
    chunk_fn = replication.replicate(chunk, mesh, donate_argnums=0)
    anakin_seconds = _best_time(chunk_fn, state, _REPEATS.value)

    device = jax.devices()[0]
    print(f"hardware: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores; "
          f"{num_devices} x {device.platform} ({device.device_kind}); jax {jax.__version__}")
    print(f"workload: {config.agent.name} on {config.env.name}, {n} envs/device, "
          f"T={config.rollout_length}, {config.updates_per_chunk} updates/chunk, "
          f"torso={config.agent.torso} {tuple(config.agent.hidden_sizes)}")
    env_sps = steps_per_chunk / env_seconds
    anakin_sps = steps_per_chunk / anakin_seconds
    print(f"ceiling (env only, random actions): {env_sps:>12,.0f} env steps/s")
    print(f"anakin (act + step + learn):        {anakin_sps:>12,.0f} env steps/s "
          f"({100 * anakin_sps / env_sps:.0f}% of ceiling)")


if __name__ == "__main__":
    app.run(main)
