"""Benchmark: Anakin PPO end to end, next to the environment-only ceiling.

Runs `anakin.train` on `--config` (default `ppo_cartpole.py`: PureJaxRL's CartPole settings)
and prints, for that run: wall time including compilation, compilation time, environment
steps per second excluding compilation (all chunks, host loop included) and the final chunk's
mean episode return. Then the same run again in this process (its compiled programs reused),
timed by the wall clock and by process CPU time; then the ceiling: the same wrapped environment
stepped with uniformly random actions in the same scan structure, no agent (best of
`--repeats` chunks after compilation). docs/benchmarks.md ("PPO") compares these figures with
PureJaxRL's measured side by side.

    python -m experiments.benchmarks.ppo [--config.num_envs=2048 --config.total_env_steps=...]
"""

from __future__ import annotations

import os
import platform
import time

import jax
from absl import app, flags
from ml_collections import config_flags

import anakin
import envs_jax
from experiments.benchmarks._ceiling import env_ceiling_seconds
from podracer import replication

# experiments/configs/, next to this package.
_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_CONFIGS, "ppo_cartpole.py"),
    "Anakin PPO experiment config.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed chunks for the ceiling (best is kept).")
_CEILING = flags.DEFINE_bool("ceiling", True, "Also measure the environment-only ceiling.")
_SECOND_RUN = flags.DEFINE_bool("second_run", True,
                                "Run again with the compiled programs and time it by CPU too.")


def main(argv):
    del argv
    config = _CONFIG.value
    start = time.perf_counter()
    result = anakin.train(config)
    wall = time.perf_counter() - start
    steps = result.history[-1]["env_steps"]
    device = jax.devices()[0]
    num_devices = anakin.validate(config, jax.device_count())
    print(f"hardware: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores; "
          f"{num_devices} x {device.platform} ({device.device_kind}); jax {jax.__version__}")
    print(f"workload: {config.agent.name} on {config.env.name}, {config.num_envs} envs, "
          f"T={config.rollout_length}, {config.agent.num_epochs} epochs x "
          f"{config.agent.num_minibatches} minibatches, {result.history[-1]['updates']} updates "
          f"in chunks of {config.updates_per_chunk}, {steps} env steps")
    print(f"podracer ppo: wall_incl_compile={wall:.2f}s compile={result.compile_seconds:.2f}s "
          f"run={result.run_seconds:.2f}s sps_excl_compile={steps / result.run_seconds:,.0f} "
          f"final_return={result.history[-1]['episode_return']:.1f}")
    if _SECOND_RUN.value:
        # The same run again in this process: its programs come from the cache, so this times
        # the run alone, by the wall clock and by this process's CPU time (which other jobs on
        # the machine disturb less than the wall clock).
        cpu = time.process_time()
        again = anakin.train(config)
        cpu = time.process_time() - cpu
        print(f"podracer ppo, second run: run={again.run_seconds:.2f}s "
              f"sps_excl_compile={steps / again.run_seconds:,.0f} cpu={cpu:.2f}s "
              f"sps_per_cpu_second={steps / cpu:,.0f} "
              f"final_return={again.history[-1]['episode_return']:.1f}")
    if _CEILING.value:
        mesh = replication.make_mesh(jax.devices()[:num_devices])
        env = envs_jax.wrap_for_training(envs_jax.make(config.env.name, **config.env.kwargs),
                                         config.env.max_episode_steps or None)
        seconds = env_ceiling_seconds(env, mesh, envs_per_device=config.num_envs // num_devices,
                                      rollout_length=config.rollout_length,
                                      updates_per_chunk=config.updates_per_chunk,
                                      repeats=_REPEATS.value)
        ceiling = config.updates_per_chunk * config.rollout_length * config.num_envs / seconds
        print(f"ceiling (env only, random actions): {ceiling:,.0f} env steps/s; ppo at "
              f"{100 * steps / result.run_seconds / ceiling:.0f}% of it")


if __name__ == "__main__":
    app.run(main)
