"""Benchmark: Anakin PPO end to end, next to the environment-only ceiling.

Runs `anakin.train` on `--config` (default `ppo_cartpole.py`: PureJaxRL's CartPole settings)
and prints, for that run: wall time including compilation, compilation time, environment
steps per second excluding compilation (all chunks, host loop included) and the final chunk's
mean episode return. Then the same run again in this process (its compiled programs reused),
timed by the wall clock and by process CPU time; then the ceiling: the same wrapped environment
stepped with uniformly random actions in the same scan structure, no agent (best of
`--repeats` chunks after compilation). With `--reference` (the default when the config is
`ppo_cartpole.py`'s workload), a hand-written PPO at PureJaxRL's settings
(`_ppo_reference.py`, one jitted function over the same wrapped environment) is compiled and
then timed in alternating rounds with our compiled run (`--rounds`, A B then B A), and the
ratio of the medians is printed: ours over the reference, env steps per second, compilation
excluded. With `--reference_agent` the rounds also time the reference's PPO as a
`podracer.Agent` run by `anakin.train` (`_ppo_reference.make_agent`): the same network, acting
and learning inside our runner, which tells what the agent costs from what the runner does.
With `--reference_in_chunks` (the default) the rounds also time the reference called chunk by
chunk, in the same number of calls as `anakin.train` makes
(`_ppo_reference.make_train_in_chunks`). Each contestant's line also gives the voluntary
context switches of XLA:CPU's worker threads per run (Linux): a call that XLA:CPU's runtime
runs with its work handed between threads shows up there, as about one switch per minibatch.
XLA:CPU's pool of worker threads is the config's `cpu_worker_threads` (`ppo_cartpole.py`: 1),
sized when `anakin.train` first starts JAX's backends, for every contestant alike; set
`--config.cpu_worker_threads=0` for XLA's own choice, one per core.

    python -m experiments.benchmarks.ppo [--config.num_envs=2048 --config.total_env_steps=...]
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
from absl import app, flags

import agents
import anakin
import envs_jax
from experiments import _cli
from experiments.benchmarks import _ppo_reference
from experiments.benchmarks._ceiling import env_ceiling_seconds
from podracer import machine, replication

# experiments/configs/, next to this package.
_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
_CONFIG = _cli.define_config_file(
    os.path.join(_CONFIGS, "ppo_cartpole.py"),
    "Anakin PPO experiment config.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed chunks for the ceiling (best is kept).")
_CEILING = flags.DEFINE_bool("ceiling", True, "Also measure the environment-only ceiling.")
_SECOND_RUN = flags.DEFINE_bool("second_run", True,
                                "Run again with the compiled programs and time it by CPU too.")
_REFERENCE = flags.DEFINE_bool(
    "reference", True, "Time a hand-written PPO at PureJaxRL's settings side by side "
    "(CartPole-like workloads with discrete actions only).")
_ROUNDS = flags.DEFINE_integer("rounds", 4, "Alternating rounds of ours and the reference.")
_REFERENCE_AGENT = flags.DEFINE_bool(
    "reference_agent", False, "Also time the reference's PPO as an agent run by anakin.train "
    "(its network, acting and learning inside our runner), to tell the agent's cost from the "
    "runner's.")

_REFERENCE_IN_CHUNKS = flags.DEFINE_bool(
    "reference_in_chunks", True, "Also time the reference called chunk by chunk, in as many "
    "calls as anakin.train makes, to tell what the calls cost from what the program does.")


def _reference_settings(config) -> dict:
    agent = config.agent
    return dict(num_envs=config.num_envs, num_steps=config.rollout_length,
                total_steps=config.total_env_steps, num_epochs=agent.num_epochs,
                num_minibatches=agent.num_minibatches, learning_rate=agent.learning_rate,
                discount=agent.discount, gae_lambda=agent.gae_lambda, clip_eps=agent.clip_eps,
                entropy_cost=agent.entropy_cost, value_cost=agent.value_cost,
                max_grad_norm=agent.max_grad_norm)


def _reference_agent_config(config):
    """`config` with the reference's PPO as its agent (`_ppo_reference.make_agent`), registered
    as `ppo_reference`: the same network, acting and learning, run by `anakin.train`."""
    if anakin.validate(config, jax.device_count()) != 1:
        raise ValueError("--reference_agent times the reference on one device (its learner "
                         "averages no gradients): set --config.num_devices=1")
    settings = _reference_settings(config)
    agents.register(
        "ppo_reference",
        lambda agent_config, spec: _ppo_reference.make_agent(
            spec, **{k: agent_config[k] for k in settings}),
        default_config=lambda: ml_collections.ConfigDict({"name": "ppo_reference", **settings}),
        replace=True)
    wrapped = copy.deepcopy(config)
    wrapped.agent = agents.default_config("ppo_reference")
    return wrapped


def _reference_rounds(config, rounds: int, with_agent: bool, in_chunks: bool) -> None:
    """Our compiled run and the reference's, alternately (A B, B A, ...), by the wall clock;
    with `with_agent`, also the reference's agent run by `anakin.train`; with `in_chunks`, also
    the reference called chunk by chunk as `anakin.train` calls its chunks."""
    env = envs_jax.wrap_for_training(envs_jax.make(config.env.name, **config.env.kwargs),
                                     config.env.max_episode_steps or None)
    settings = _reference_settings(config)
    train = _ppo_reference.make_train(env, **settings)
    start = time.perf_counter()
    compiled = jax.jit(train).lower(jax.random.PRNGKey(config.seed)).compile()
    compile_seconds = time.perf_counter() - start
    steps = (config.total_env_steps // (config.num_envs * config.rollout_length)
             * config.num_envs * config.rollout_length)

    def under_anakin(run_config) -> Callable[[], tuple[float, float]]:
        def run() -> tuple[float, float]:
            result = anakin.train(run_config)
            return result.history[-1]["env_steps"] / result.run_seconds, \
                float(result.history[-1]["episode_return"])
        return run

    def reference() -> tuple[float, float]:
        start = time.perf_counter()
        returns = np.asarray(jax.block_until_ready(compiled(jax.random.PRNGKey(config.seed))))
        return steps / (time.perf_counter() - start), float(np.nanmean(returns[-8:]))

    contestants = [("ours", under_anakin(config)), ("reference", reference)]
    if in_chunks:
        chunks = steps // (config.num_envs * config.rollout_length * config.updates_per_chunk)
        init, chunk = _ppo_reference.make_train_in_chunks(env, config.updates_per_chunk,
                                                          **settings)
        init, chunk = jax.jit(init), jax.jit(chunk, donate_argnums=0)
        jax.block_until_ready(chunk(init(jax.random.PRNGKey(config.seed))))  # compiles

        def reference_in_chunks() -> tuple[float, float]:
            carry = jax.block_until_ready(init(jax.random.PRNGKey(config.seed)))
            start = time.perf_counter()
            for _ in range(chunks):  # each chunk's returns fetched, as the runner fetches
                carry, returns = chunk(carry)
                returns = np.asarray(returns)
            seconds = time.perf_counter() - start
            return chunks * returns.size * config.num_envs * config.rollout_length / seconds, \
                float(np.nanmean(returns[-8:]))

        in_chunks_name = f"reference in {chunks} call{'s' if chunks != 1 else ''}"
        contestants.append((in_chunks_name, reference_in_chunks))
    if with_agent:
        wrapped = _reference_agent_config(config)
        anakin.train(wrapped)  # compiles its programs outside the rounds
        contestants.append(("reference agent under anakin.train", under_anakin(wrapped)))
    figures = {name: [] for name, _ in contestants}
    switches = {name: [] for name, _ in contestants}
    for r in range(rounds):
        for name, fn in (contestants if r % 2 == 0 else contestants[::-1]):
            before = machine.xla_cpu_worker_threads()
            figures[name].append(fn())
            after = machine.xla_cpu_worker_threads()
            if before is not None and after is not None:
                switches[name].append(after[1] - before[1])
    medians = {k: float(np.median([sps for sps, _ in v])) for k, v in figures.items()}
    for name, values in figures.items():
        print(f"{name}: " + " ".join(f"{sps:,.0f}" for sps, _ in values)
              + f" env steps/s (median {medians[name]:,.0f}); final return "
              + " ".join(f"{ret:.1f}" for _, ret in values))
        if switches[name]:
            print("  XLA:CPU worker threads' context switches per run: "
                  + " ".join(str(n) for n in switches[name]))
    print(f"reference compile={compile_seconds:.2f}s; ours / reference = "
          f"{medians['ours'] / medians['reference']:.2f} over {rounds} alternating rounds")
    if in_chunks:
        name = in_chunks_name
        print(f"ours / {name} = {medians['ours'] / medians[name]:.2f}; {name} / reference = "
              f"{medians[name] / medians['reference']:.2f}")
    if with_agent:
        agent = medians["reference agent under anakin.train"]
        print(f"reference agent under anakin.train / reference = "
              f"{agent / medians['reference']:.2f}; ours / reference agent under anakin.train "
              f"= {medians['ours'] / agent:.2f}")


def main(argv):
    del argv
    config = _CONFIG.value
    start = time.perf_counter()
    result = anakin.train(config)
    wall = time.perf_counter() - start
    steps = result.history[-1]["env_steps"]
    device = jax.devices()[0]
    num_devices = anakin.validate(config, jax.device_count())
    print(f"hardware: {machine.cpu_model()}, {os.cpu_count()} CPU cores; "
          f"{num_devices} x {device.platform} ({device.device_kind}); jax {jax.__version__}; "
          f"XLA:CPU worker threads: {(machine.xla_cpu_worker_threads() or (None,))[0]}")
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
    if _REFERENCE.value and not envs_jax.make(config.env.name).action_spec().shape:
        _reference_rounds(config, _ROUNDS.value, _REFERENCE_AGENT.value,
                          _REFERENCE_IN_CHUNKS.value)


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
