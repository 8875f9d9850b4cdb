"""Benchmark: Anakin V-trace environment steps per second next to its ceiling.

The ceiling is the same wrapped environment stepped with uniformly random actions in the same
vmapped, scanned, replicated program, with no agent. With more than one device the same chunk
is also timed without its cross-device means (each device learns alone: `axis_name=None`),
which prices the gradient and metric `pmean`s. All are measured in this run, after
compilation, as the best of `--repeats` timed chunks; the last line is a JSON record of them
(`experiments.benchmarks.scaling` reads it).

    python -m experiments.benchmarks.anakin [--config.env.name=catch] [--repeats=5]

Under `experiments.launch` (`--module=experiments.benchmarks.anakin`) the processes join one
`jax.distributed` run and the program spans the devices of all of them; process 0 prints.
"""

from __future__ import annotations

import json
import os
import platform
import time

import jax
import jax.numpy as jnp
from absl import app, flags

import anakin
import envs_jax
from experiments import _cli
from agents.actor_critic import mlp_hidden_sizes
from experiments.benchmarks._ceiling import env_ceiling_seconds
from podracer import distributed, replication
from podracer.types import DEVICE_AXIS

# experiments/configs/, next to this package.
_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
_CONFIG = _cli.define_config_file(
    os.path.join(_CONFIGS, "vtrace_catch.py"),
    "Experiment config; num_envs is overridden to envs_per_device x devices.")
_ENVS_PER_DEVICE = flags.DEFINE_integer("envs_per_device", 256, "Environments per device.")
_ROLLOUT_LENGTH = flags.DEFINE_integer(
    "rollout_length", 20, "T of the measured workload (overrides the config's; the figures in "
    "docs/benchmarks.md use 20).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed chunks per measurement (best is kept).")


def _best_times(programs: dict, repeats: int) -> dict:
    """Best seconds per call of each `name: (fn, state)`, the programs timed in turn (one call
    of each per repeat), so that load from outside falls on all of them alike."""
    states, best = {}, {}
    for name, (fn, state) in programs.items():  # warm-up
        states[name], out = fn(state)
        jax.block_until_ready(out)
        best[name] = float("inf")
    for _ in range(repeats):
        for name, (fn, _) in programs.items():
            start = time.perf_counter()
            states[name], out = fn(states[name])
            jax.block_until_ready(out)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main(argv):
    del argv
    distributed.initialize_from_env()
    config = _CONFIG.value
    num_devices = anakin.validate(config, jax.device_count())
    config.num_envs = _ENVS_PER_DEVICE.value * num_devices
    config.rollout_length = _ROLLOUT_LENGTH.value
    mesh = replication.make_mesh(jax.devices()[:num_devices])
    env = envs_jax.wrap_for_training(envs_jax.make(config.env.name, **config.env.kwargs),
                                     config.env.max_episode_steps or None)
    steps_per_chunk = config.updates_per_chunk * config.rollout_length * config.num_envs
    n = _ENVS_PER_DEVICE.value

    # CEILING: the environment alone, random actions, same scan structure.
    env_seconds = env_ceiling_seconds(env, mesh, envs_per_device=n,
                                      rollout_length=config.rollout_length,
                                      updates_per_chunk=config.updates_per_chunk,
                                      repeats=_REPEATS.value)

    # ANAKIN: the same chunk the runner compiles.
    import agents  # kept next to its only use

    agent = agents.make(config.agent, env.spec())
    env_keys = replication.from_global(jax.random.split(jax.random.PRNGKey(1), num_devices), mesh)
    params_keys = replication.from_global(
        jnp.broadcast_to(jax.random.PRNGKey(2), (num_devices, 2)), mesh)
    programs = {}
    # Without the means only where there is something to average over; timed in turn with
    # the chunk that has them.
    for axis_name in (DEVICE_AXIS, None) if num_devices > 1 else (DEVICE_AXIS,):
        init, chunk = anakin.make_programs(
            agent, env, envs_per_device=n, rollout_length=config.rollout_length,
            updates_per_chunk=config.updates_per_chunk, axis_name=axis_name)
        state = replication.replicate(init, mesh)(env_keys, params_keys)
        programs[axis_name] = (replication.replicate(chunk, mesh, donate_argnums=0), state)
    seconds = _best_times(programs, _REPEATS.value)

    if jax.process_index() != 0:
        return
    device = jax.devices()[0]
    load = os.getloadavg()[0]
    print(f"hardware: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores; "
          f"{num_devices} x {device.platform} ({device.device_kind}) in "
          f"{jax.process_count()} process(es); jax {jax.__version__}; load average {load:.1f}")
    print(f"workload: {config.agent.name} on {config.env.name}, {n} envs/device, "
          f"T={config.rollout_length}, {config.updates_per_chunk} updates/chunk, "
          f"torso={config.agent.torso} {mlp_hidden_sizes(config.agent.hidden_sizes, env.spec())}")
    env_sps = steps_per_chunk / env_seconds
    anakin_sps = steps_per_chunk / seconds[DEVICE_AXIS]
    print(f"ceiling (env only, random actions): {env_sps:>12,.0f} env steps/s")
    print(f"anakin (act + step + learn):        {anakin_sps:>12,.0f} env steps/s "
          f"({100 * anakin_sps / env_sps:.0f}% of ceiling)")
    # The chunk's parts are fused in one program; the environment's share is estimated by
    # its time alone in the same scan structure.
    env_share = env_seconds / seconds[DEVICE_AXIS]
    print(f"shares of a chunk: environment stepping ~{100 * env_share:.0f}% (its time alone), "
          f"acting and learning the rest ~{100 * (1 - env_share):.0f}%")
    result = {"devices": num_devices, "processes": jax.process_count(),
              "envs_per_device": n, "ceiling_sps": env_sps, "anakin_sps": anakin_sps,
              "env_share": env_share, "load": load}
    if None in seconds:
        alone_sps = steps_per_chunk / seconds[None]
        print(f"anakin without cross-device means:  {alone_sps:>12,.0f} env steps/s (the "
              f"means cost {100 * (1 - seconds[None] / seconds[DEVICE_AXIS]):.0f}% of a chunk)")
        result["no_mean_sps"] = alone_sps
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
