"""Benchmark: Sebulba V-trace on Atari Pong, end to end, next to what each of its parts
reaches alone, all measured in this one run (the Podracer paper's section 4.3 and Figure 4b).

Parts, each with the same environments, threads, devices and network as the full run:
  envpool   the actor threads' envpool batches stepped with uniformly random actions
  actor     the actor threads' jitted `actor_step` on the actor devices (host observations in,
            actions back to the host), no environment
  learner   the replicated update on the learner devices, on a batch already in place
  sebulba   `sebulba.train`, steady state (compilation and the first log records excluded)

The slowest part alone is the ceiling; Sebulba's job is to overlap the rest behind it. Each part
also reports the cores it keeps busy (process CPU seconds per wall second); when the parts share
the same cores (simulated CPU devices), the run prints the CPU-time bound too: the cores
divided by the CPU seconds all parts need per agent step, which end to end cannot beat either.
The end-to-end run's own timers then say where its time went, as shares of one run: of
an actor thread's time, inference (until the actions are on the host), host environment
stepping, handing observations to the device, and waits for a parameter version or for room in
the queue; of the learner thread's, waiting for rollouts (the rest is dispatching updates).
Then, as Figure 4b, end-to-end frames/s for several actor batch sizes (environments per actor
thread) and actor threads per device, each next to envpool alone with the same batches and
threads. Frames are environment frames: agent steps x frame skip (4).

    python -m experiments.benchmarks.sebulba [--config.agent.torso=conv] \
        [--batch_sizes=16,32,64,128] [--thread_counts=1,2,4]

Sizes the config leaves to the machine are derived as a run would (`sebulba.derive_sizes`).

On CPU, `--cpu_devices` simulated devices are made (default 2: actor cpu:0, learner cpu:1);
they share the host's cores, so every part competes with the others for them.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from experiments import _cli
from experiments.benchmarks import _fig4b

# experiments/configs/, next to this package.
_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
_CONFIG = _cli.define_config_file(
    os.path.join(_CONFIGS, "sebulba_vtrace_atari.py"),
    "Experiment config (Pong, IMPALA protocol, deep ResNet by default).")
_SECONDS = flags.DEFINE_float("seconds", 20.0, "Length of each envpool / actor measurement.")
_LEARNER_UPDATES = flags.DEFINE_integer("learner_updates", 3, "Timed updates, learner alone.")
_E2E_UPDATES = flags.DEFINE_integer("e2e_updates", 8, "Updates in each end-to-end run; the "
                                    "first two are warm-up.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", [], "Envs per actor thread for the Figure 4b "
                                 "sweep (empty: no sweep).")
_THREAD_COUNTS = flags.DEFINE_list("thread_counts", [], "Actor threads per actor device for "
                                   "the Figure 4b sweep (empty: the config's).")
_SWEEP_TORSO = flags.DEFINE_string("sweep_torso", "", "Torso for the sweep (default: config's).")
_CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 2, "Simulated CPU devices (CPU only).")


def _set_cpu_devices(argv: list[str]) -> None:
    # Must happen before JAX starts its backend, so before anything below imports it.
    count = next((a.split("=", 1)[1] for a in argv if a.startswith("--cpu_devices=")), "2")
    flag = f"--xla_force_host_platform_device_count={count}"
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(kept + [flag])


_set_cpu_devices(sys.argv)

import itertools
import platform
import threading
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import agents
import sebulba
from podracer import replication
from podracer.types import TimeStep
from sebulba import config as sebulba_config
from sebulba import envpool_env, learner
from sebulba.actor import acting_view, make_actor_functions


class Rate(NamedTuple):
    """A part's agent steps per second, and the cores it keeps busy meanwhile: process CPU
    seconds per wall second in its timed window (envpool's own C++ threads included)."""
    steps_per_second: float
    cores_busy: float


def _in_threads(num_threads: int, body) -> float:
    """Runs `body(i)` in `num_threads` threads; returns the longest one's seconds."""
    times = [0.0] * num_threads

    def run(i):
        start = time.perf_counter()
        body(i)
        times[i] = time.perf_counter() - start

    threads = [threading.Thread(target=run, args=(i,)) for i in range(num_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return max(times)


def envpool_alone(config, options, seconds: float) -> Rate:
    """Agent steps per second of the actor threads' envpool batches, random actions, each
    thread stepping its `env.batches` batches in turn as the actor does (sending one batch its
    actions before receiving the next one's step)."""
    n = config.actor_threads_per_device * len(config.actor_device_ids)
    batches = config.env.get("batches", 1)
    b = config.envs_per_actor_thread // batches
    envs = [[envpool_env.EnvpoolEnv(config.env.task, b, seed=batches * i + j,
                                    num_threads=config.env.num_threads, options=options)
             for j in range(batches)] for i in range(n)]
    num_actions = envs[0][0].spec().action.num_values
    steps = [0] * n

    def body(i):
        rng = np.random.default_rng(i)
        for env in envs[i]:
            env.reset()
        for env in envs[i]:
            env.send(rng.integers(0, num_actions, b, dtype=np.int32))
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for env in envs[i]:
                env.recv()
                env.send(rng.integers(0, num_actions, b, dtype=np.int32))
                steps[i] += b
        for env in envs[i]:
            env.recv()

    cpu = time.process_time()
    elapsed = _in_threads(n, body)
    busy = (time.process_time() - cpu) / elapsed
    for env in itertools.chain.from_iterable(envs):
        env.close()
    return Rate(sum(steps) / elapsed, busy)


def actor_alone(config, options, agent, spec, params, seconds: float) -> Rate:
    """Agent steps per second of `actor_step` in the actor threads, on the actor devices (each
    call on one of a thread's `env.batches` batches)."""
    local = jax.local_devices()
    devices = [local[i] for i in config.actor_device_ids]
    n_per = config.actor_threads_per_device
    b = config.envs_per_actor_thread // config.env.get("batches", 1)  # per call of `act`
    act, _ = make_actor_functions(agent, 1)
    # Observations as envpool returns them (channels first); `act` converts them on device.
    raw_shape = (b,) + tuple(envpool_env.envpool.make_spec(
        config.env.task, **options).observation_space.shape)
    obs = np.random.default_rng(0).integers(0, 255, raw_shape).astype(spec.observation.dtype)
    # What the run sends to the actor device at every step (`acting_view`).
    acting = acting_view(TimeStep(step_type=np.ones(b, np.int32), reward=np.zeros(b, np.float32),
                                  discount=np.ones(b, np.float32), observation=obs))
    steps = [0] * (n_per * len(devices))
    busy = [0.0]
    ready = threading.Barrier(len(steps))

    def body(i):
        device = devices[i // n_per]
        p = jax.device_put(params, device)
        key = jax.device_put(jax.random.PRNGKey(i), device)
        actor_state = jax.device_put(agent.init_actor_state(b), device)
        for _ in range(2):  # compile and warm up
            action, actor_state, _, key = act(p, actor_state, jax.device_put(acting, device),
                                              key)
            np.asarray(action)
        ready.wait()  # every thread compiled: measure them side by side
        start, cpu = time.perf_counter(), time.process_time()
        end = start + seconds
        while time.perf_counter() < end:
            action, actor_state, _, key = act(p, actor_state, jax.device_put(acting, device),
                                              key)
            np.asarray(action)
            steps[i] += b
        if i == 0:
            busy[0] = (time.process_time() - cpu) / (time.perf_counter() - start)

    _in_threads(len(steps), body)  # includes compilation; the rate below does not
    return Rate(sum(steps) / seconds, busy[0])


def learner_alone(config, agent, spec, num_updates: int) -> Rate:
    """Agent steps per second consumed by the replicated update on the learner devices."""
    local = jax.local_devices()
    mesh = replication.make_mesh([local[i] for i in config.learner_device_ids])
    n = config.actor_threads_per_device * len(config.actor_device_ids)
    shard_batch = config.envs_per_actor_thread // len(config.learner_device_ids)
    state, keys = learner.init_learner(agent, spec, mesh, jax.random.PRNGKey(0),
                                       jax.random.PRNGKey(1))
    abstract = learner.abstract_batch(agent, spec, mesh, rollout_length=config.rollout_length,
                                      shard_batch=shard_batch, num_rollouts=n)
    batch = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype, device=s.sharding), abstract)
    update = replication.replicate(learner.make_update(agent), mesh, donate_argnums=(0, 1))
    state, keys, metrics = update(state, keys, batch)  # compile and warm up
    jax.block_until_ready(metrics)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(num_updates):
        state, keys, metrics = update(state, keys, batch)
    jax.block_until_ready(metrics)
    elapsed = time.perf_counter() - start
    steps = num_updates * n * config.envs_per_actor_thread * config.rollout_length
    return Rate(steps / elapsed, (time.process_time() - cpu) / elapsed)


# The actor threads' timers in each metrics record (seconds per rollout), by part.
ACTOR_PARTS = {"inference": "actor_inference_s", "host env stepping": "actor_env_s",
               "host->device transfer": "actor_transfer_s",
               "waiting for parameters": "actor_params_wait_s",
               "waiting for queue room": "actor_put_wait_s"}


def end_to_end_shares(config, num_updates: int) -> tuple[Rate, dict[str, float]]:
    """Steady-state agent steps per second of `sebulba.train` (after two warm-up updates), and
    where its time went: each actor part's share of an actor thread's time, and the learner
    thread's share spent waiting for rollouts (`ACTOR_PARTS`, "learner waiting for rollouts"),
    averaged over the records after the warm-up."""
    config = config.copy_and_resolve_references()
    n = config.actor_threads_per_device * len(config.actor_device_ids)
    per_update = n * config.envs_per_actor_thread * config.rollout_length
    config.total_env_steps = num_updates * per_update
    config.log_every_updates = 1
    marks, records = [], []

    def log(record):
        marks.append((time.perf_counter(), time.process_time(), record["env_steps"]))
        records.append(record)

    sebulba.train(config, log_fn=log)
    (t0, c0, s0), (t1, c1, s1) = marks[1], marks[-1]
    steady = records[2:] or records[-1:]
    # Each record covers one update: its seconds, and the rollouts the actors finished in them
    # (whose parts' seconds it gives per rollout); the threads' time is n x the seconds.
    seconds = [per_update / r["steps_per_second"] for r in steady]
    rollouts = [r["actor_steps_per_second"] * s
                / (config.rollout_length * config.envs_per_actor_thread)
                for r, s in zip(steady, seconds)]
    shares = {part: sum(r[key] * k for r, k in zip(steady, rollouts)) / (n * sum(seconds))
              for part, key in ACTOR_PARTS.items()}
    shares["learner waiting for rollouts"] = sum(
        r["learner_wait_fraction"] * s for r, s in zip(steady, seconds)) / sum(seconds)
    return Rate((s1 - s0) / (t1 - t0), (c1 - c0) / (t1 - t0)), shares


def end_to_end(config, num_updates: int) -> Rate:
    """Steady-state agent steps per second of `sebulba.train` (after two warm-up updates)."""
    return end_to_end_shares(config, num_updates)[0]


def shares_table(shares: dict[str, float]) -> str:
    """The shares of `end_to_end_shares` as a markdown table."""
    rows = [f"| actor thread: {part} | {100 * shares[part]:.0f}% |" for part in ACTOR_PARTS]
    rows.append(f"| actor thread: the rest (packing, sending shards, Python) | "
                f"{100 * max(0.0, 1 - sum(shares[p] for p in ACTOR_PARTS)):.0f}% |")
    rows.append(f"| learner thread: waiting for rollouts | "
                f"{100 * shares['learner waiting for rollouts']:.0f}% |")
    return "| part of one end-to-end run | share of its thread's time |\n|---|---:|\n" + (
        "\n".join(rows))


def main(argv):
    del argv
    config = _CONFIG.value
    if jax.default_backend() == "cpu" and _CPU_DEVICES.value >= 2:
        config.actor_device_ids = (0,)
        config.learner_device_ids = (1,)
    config, sizes = sebulba_config.resolved(config)
    sebulba.validate(config)
    options = envpool_env.make_options(config.env.task, config.env.protocol, config.env.kwargs)
    spec = envpool_env.env_spec(config.env.task, options)
    agent = agents.make(config.agent, spec)
    frame_skip = options.get("frame_skip", 1)
    n = config.actor_threads_per_device * len(config.actor_device_ids)
    load = os.getloadavg()
    print(f"# Sebulba benchmark: {config.env.task} ({config.env.protocol} protocol), "
          f"torso={config.agent.torso}, {n} actor thread(s) x {config.envs_per_actor_thread} "
          f"envs, T={config.rollout_length}, actors {list(config.actor_device_ids)}, learners "
          f"{list(config.learner_device_ids)}; {jax.devices()[0].platform} "
          f"({jax.device_count()} devices), {os.cpu_count()} CPU cores "
          f"({platform.processor() or platform.machine()}), load average at start "
          f"{load[0]:.1f}; jax {jax.__version__}, envpool {envpool_env.envpool.__version__}; "
          f"{config.env.get('batches', 1)} batch(es) per actor thread, each with "
          f"{sizes.env_threads} envpool thread(s); derived from the machine: "
          f"{', '.join(sizes.derived) or 'nothing'}", flush=True)

    params = agent.actor_params(agent.init(jax.random.PRNGKey(0), spec))
    parts: dict[str, Rate] = {}
    for name, measure in (
            ("envpool alone (random actions)",
             lambda: envpool_alone(config, options, _SECONDS.value)),
            ("actor inference alone",
             lambda: actor_alone(config, options, agent, spec, params, _SECONDS.value)),
            ("learner update alone",
             lambda: learner_alone(config, agent, spec, _LEARNER_UPDATES.value))):
        parts[name] = measure()
        print(f"{name}: {parts[name].steps_per_second * frame_skip:,.0f} frames/s", flush=True)
    e2e, shares = end_to_end_shares(config, _E2E_UPDATES.value)
    ceiling_name = min(parts, key=lambda name: parts[name].steps_per_second)
    ceiling = parts[ceiling_name].steps_per_second

    print("\n| part | agent steps/s | frames/s | cores busy |\n|---|---:|---:|---:|")
    for name, (rate, busy) in parts.items():
        print(f"| {name} | {rate:,.0f} | {rate * frame_skip:,.0f} | {busy:.2f} |")
    print(f"| **Sebulba end to end** | {e2e.steps_per_second:,.0f} | "
          f"{e2e.steps_per_second * frame_skip:,.0f} | {e2e.cores_busy:.2f} |")
    print(f"\nCeiling: {ceiling_name}. End to end = "
          f"{100 * e2e.steps_per_second / ceiling:.0f}% of the ceiling.", flush=True)
    # Where every part runs on the same cores (simulated CPU devices), they also share the
    # machine's CPU time: an agent step needs each part's CPU seconds per step (its busy cores
    # over its rate), and the machine has os.cpu_count() of them per second. End to end can
    # beat neither that nor the slowest part alone.
    cpu_per_step = sum(busy / rate for rate, busy in parts.values())
    capacity = (os.cpu_count() or 1) / cpu_per_step
    bound = min(ceiling, capacity)
    print(f"CPU-time bound ({os.cpu_count()} cores / sum of the parts' CPU seconds per step): "
          f"{capacity:,.0f} agent steps/s; the tighter bound, {bound:,.0f}, is "
          f"{'the slowest part' if bound == ceiling else 'the CPU time'}; end to end = "
          f"{100 * e2e.steps_per_second / bound:.0f}% of it.", flush=True)

    print("\n" + shares_table(shares), flush=True)

    if _BATCH_SIZES.value or _THREAD_COUNTS.value:
        sweep = config.copy_and_resolve_references()
        if _SWEEP_TORSO.value:
            sweep.agent.torso = _SWEEP_TORSO.value
        print(f"\nFigure 4b: frames/s against actor batch size and actor threads "
              f"(torso={sweep.agent.torso}, {len(sweep.actor_device_ids)} actor device(s), "
              f"T={sweep.rollout_length})\n")
        print(_fig4b.header())
        seconds = max(5.0, _SECONDS.value / 2)
        agent = agents.make(sweep.agent, spec)
        params = agent.actor_params(agent.init(jax.random.PRNGKey(0), spec))
        for threads in map(int, _THREAD_COUNTS.value or [sweep.actor_threads_per_device]):
            for b in map(int, _BATCH_SIZES.value or [sweep.envs_per_actor_thread]):
                sweep.actor_threads_per_device, sweep.envs_per_actor_thread = threads, b
                if "env.num_threads" in sizes.derived:  # as a run with these sizes would
                    sweep.env.num_threads = sebulba_config.derive_sizes(
                        sizes.machine, actor_device_ids=tuple(sweep.actor_device_ids),
                        learner_device_ids=tuple(sweep.learner_device_ids),
                        actor_threads_per_device=threads, envs_per_actor_thread=b).env_threads
                trajectories = threads * len(sweep.actor_device_ids) * b
                rates = [envpool_alone(sweep, options, seconds),
                         actor_alone(sweep, options, agent, spec, params, seconds),
                         learner_alone(sweep, agent, spec, _LEARNER_UPDATES.value),
                         end_to_end(sweep, _E2E_UPDATES.value)]
                print(_fig4b.row(threads, b, trajectories,
                                 [r.steps_per_second * frame_skip for r in rates]), flush=True)


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
