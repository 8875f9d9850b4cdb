"""One prepared check of the devices found: every figure the accelerator questions need, each
next to its ceiling measured in the same run, written as one JSON and one markdown table.

Parts, in the order they run. Each has a time cap (`CAPS_S`, less when the parts before it
ran long: `_schedule.part_cap`), within which it starts its points (`Budget.next_point`), so
that the whole check ends within `--check_s`; the points it does not start are listed as
skipped. A part that fails is reported as failed, so that the check always finishes and
writes its files.
  anakin_catch    Anakin V-trace on Catch at 256 and 4,096 envs per device, against the
                  environment alone in the same scan structure (`_ceiling.py`)
  muzero_search   MuZero's PUCT and Gumbel searches, and PUCT with EfficientZero's value term
                  (`muzero_ez`), at 256, 1,024 and 4,096 roots:
                  simulations/s and the share of their time spent in the network passes alone
                  (as `muzero.py`), with the loop iterations of each search at 256 roots, and
                  at 256 roots `muzero_ez`'s search alone with its mean Q by a walk up the tree
                  and by pointer jumps (`muzero.mean_q`); then `muzero_atari.py`'s search,
                  residual network on Pong's frames, at 256 roots
  muzero_learner  MuZero-Anakin on Catch (acting with search, replay, updates) and its learner
                  updates alone
  maxpool_grad    the IMPALA ResNet's three max-pools, forward and backward, on a Pong learner
                  batch: `agents.layers`' gradient (elementwise, written for XLA:CPU, used on
                  every backend) against XLA's select-and-scatter
  sebulba_pong    Sebulba V-trace on Pong (envpool Atari, IMPALA protocol) at the sizes derived
                  from the machine, in one batch per actor thread and in two stepped in turn,
                  at 2 threads x 16 envs, then more threads and more envpool threads
                  (`SEBULBA_POINTS`), each against envpool alone with the same batches and
                  threads, with the end-to-end run's shares of time and milliseconds per
                  inference call, and at the derived sizes the same calls alone; skipped with
                  the reason when envpool's Atari games cannot be made
  graph_loops     the three Catch searches at 256 roots and Anakin at 4,096 envs per device
                  again, in a fresh process whose XLA records while loops and conditionals into
                  CUDA graphs
                  (`GRAPH_LOOP_FLAGS`): whether the loops' per-iteration cost on the host
                  (reading each iteration's condition back, launching each body) is what keeps
                  the search's share in network passes and Anakin's share of its ceiling low.
                  XLA:CPU reads and ignores these flags, so `--smoke` checks their spelling.

    python -m experiments.benchmarks.device_check [--out=DIR]    # at most 8 minutes on a GPU
    python -m experiments.benchmarks.device_check --smoke         # tiny sizes, CPU, about a minute
    python -m experiments.benchmarks.device_check --parts=muzero_search --roots=1024

`--parts`, `--roots`, `--anakin_envs`, `--noatari_search` and `--nomean_q_methods` choose what
runs (`graph_loops` runs its process so).

On a CPU, importing the Sebulba benchmark's parts makes two simulated CPU devices.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

from absl import app, flags

# Sets up simulated CPU devices before JAX starts, and holds the Sebulba parts.
from experiments.benchmarks import sebulba as sebulba_bench  # isort: skip
from experiments import _cli  # isort: skip

import flax.linen as nn
import jax
import jax.numpy as jnp

import agents
import anakin
import envs_jax
from agents import layers, muzero
from experiments.benchmarks._ceiling import (
    anakin_replay_chunk,
    best_call_time,
    best_time,
    env_ceiling_seconds,
    mean_q_searches,
    muzero_passes,
    tree_loop_iterations,
)
from experiments.benchmarks._schedule import (
    STARTUP_S,
    Budget,
    child_check_s,
    child_results,
    run_parts,
)
from experiments.configs import muzero_atari, muzero_catch, sebulba_vtrace_atari, vtrace_catch
from podracer import machine as machine_lib
from podracer import replication
from sebulba import config as sebulba_config
from sebulba import envpool_env

_OUT = flags.DEFINE_string("out", "", "Directory for device_check.json and device_check.md "
                           "(default: a new temporary directory, printed).")
_SMOKE = flags.DEFINE_bool("smoke", False, "Every part at tiny sizes (CPU, about a minute).")
_PARTS = flags.DEFINE_list("parts", [], "The parts to run, in the check's order (default: all).")
_ROOTS = flags.DEFINE_list("roots", [], "Roots per search for muzero_search (default: "
                           "SEARCH_ROOTS; --smoke uses 4).")
_ANAKIN_ENVS = flags.DEFINE_list("anakin_envs", [], "Envs per device for anakin_catch "
                                 "(default: ANAKIN_ENVS; --smoke uses 8).")
_ATARI_SEARCH = flags.DEFINE_bool("atari_search", True, "muzero_search also times "
                                  "muzero_atari.py's search (where envpool makes Pong).")
_MEAN_Q_METHODS = flags.DEFINE_bool("mean_q_methods", True, "muzero_search also times "
                                    "muzero_ez's search alone with its mean Q by the walk and "
                                    "by pointer jumps, at the first root size.")
_CHECK_S = flags.DEFINE_float("check_s", 450.0, "Seconds for the whole check, from its first "
                              "part (0: each part's own cap only; --smoke: no limit).")
_GRAPH_LOOP_XLA_FLAGS = flags.DEFINE_string(
    "graph_loop_xla_flags", "", "XLA flags for graph_loops' process, added to XLA_FLAGS "
    "(default: GRAPH_LOOP_FLAGS): to try other ones on the same points.")

# Seconds each part may start new points for, at most (`_schedule`: a part's cap is its share
# of the check's time left, and it starts a point only while the time left would hold one as
# long as the last). graph_loops' cap, the last, is a hard limit on its process, so the check
# ends within `--check_s` (450 s: with JAX's start-up, 8 minutes).
CAPS_S = {"anakin_catch": 60.0, "muzero_search": 75.0, "muzero_learner": 45.0,
          "maxpool_grad": 20.0, "sebulba_pong": 270.0, "graph_loops": 75.0}
# Roots per search (the first is the MuZero benchmark's), and Anakin's envs per device.
SEARCH_ROOTS = (256, 1024, 4096)
ANAKIN_ENVS = (256, 4096)
# XLA:GPU runs a while loop from the host: for a loop without a known trip count (mctx's tree
# walks; scans have one), each iteration it launches the condition, copies the predicate back
# and waits for it, then launches the body. These flags record while loops
# and conditionals into the CUDA graph with the kernels around them (CUDA's conditional graph
# nodes), so a loop's iterations run without the host; a minimum graph size of 1 lets the
# small loop bodies of a search be recorded too. graph_loops runs its points under them.
GRAPH_LOOP_FLAGS = ("--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL",
                    "--xla_gpu_graph_min_graph_size=1")
GRAPH_LOOP_POINTS = {"muzero_search": ("--roots=256", "--noatari_search", "--nomean_q_methods"),
                     "anakin_catch": ("--anakin_envs=4096",)}
# Sebulba's points, (actor threads, envs per thread, envpool threads per batch, batches per
# actor thread; 0 = derived from the machine), in the order they run until the cap: the derived
# sizes, then with each thread's environments in two batches stepped in turn, the Pong config's,
# then more threads with smaller batches at more envpool threads than the machine's rule gives
# them, and two batches at larger sizes.
SEBULBA_POINTS = {"derived from the machine": (0, 0, 0, 1),
                  "derived, two batches per thread": (0, 0, 0, 2),
                  "2 threads x 16 envs": (2, 16, 0, 1),
                  "4 threads x 64 envs, 3 envpool threads each": (4, 64, 3, 1),
                  "4 threads x 64 envs, 4 envpool threads each": (4, 64, 4, 1),
                  "2 threads x 128 envs in two batches, 8 envpool threads each": (2, 128, 8, 2)}
PARTS = tuple(CAPS_S)
ROW_KEYS = ("part", "setting", "figure", "unit", "against", "against_figure", "ratio")


def _row(part: str, setting: str, figure: float, unit: str, against: str = "",
         against_figure: float | None = None) -> dict[str, Any]:
    ratio = figure / against_figure if against_figure else None
    return {"part": part, "setting": setting, "figure": figure, "unit": unit,
            "against": against, "against_figure": against_figure, "ratio": ratio}


# ---------------------------------------------------------------------------------------------
# ANAKIN V-TRACE ON CATCH


def anakin_catch(budget: Budget, smoke: bool, envs: tuple[int, ...] = ANAKIN_ENVS,
                 ) -> tuple[list[dict], list[str]]:
    config = vtrace_catch.get_config()
    rollout_length, updates, repeats = (2, 1, 1) if smoke else (20, 50, 3)
    env = envs_jax.wrap_for_training(envs_jax.make(config.env.name))
    agent = agents.make(config.agent, env.spec())
    num_devices = jax.device_count()
    mesh = replication.make_mesh(jax.devices())
    rows, skipped = [], []
    for n in (8,) if smoke else envs:  # in smoke a second point compiles the same programs
        if not budget.next_point():
            skipped.append(f"{n} envs per device: time cap")
            continue
        env_s = env_ceiling_seconds(env, mesh, envs_per_device=n, rollout_length=rollout_length,
                                    updates_per_chunk=updates, repeats=repeats)
        init, chunk = anakin.make_programs(agent, env, envs_per_device=n,
                                           rollout_length=rollout_length,
                                           updates_per_chunk=updates)
        env_keys = replication.from_global(
            jax.random.split(jax.random.PRNGKey(1), num_devices), mesh)
        params_keys = replication.from_global(
            jnp.broadcast_to(jax.random.PRNGKey(2), (num_devices, 2)), mesh)
        state = replication.replicate(init, mesh)(env_keys, params_keys)
        seconds = best_time(replication.replicate(chunk, mesh, donate_argnums=0), state, repeats)
        steps = updates * rollout_length * n * num_devices
        rows.append(_row("anakin_catch", f"{n} envs/device x {num_devices} device(s), "
                         f"T={rollout_length}", steps / seconds, "env steps/s",
                         "environment alone", steps / env_s))
    return rows, skipped


# ---------------------------------------------------------------------------------------------
# MUZERO: SEARCH, MUZERO-ANAKIN AND THE LEARNER


def muzero_search(budget: Budget, smoke: bool, roots: tuple[int, ...] = SEARCH_ROOTS,
                  atari: bool = True, mean_q_methods: bool = True,
                  ) -> tuple[list[dict], list[str]]:
    config = muzero_catch.get_config()
    env = envs_jax.wrap_for_training(envs_jax.make(config.env.name))
    spec = env.spec()
    sims, repeats = (2, 1) if smoke else (16, 3)
    agent_config = config.agent.copy_and_resolve_references()
    agent_config.num_simulations = sims
    network = muzero.make_network(agent_config, spec)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1,) + spec.observation.shape),
                          jnp.zeros((1,), jnp.int32))

    forward_only = muzero_passes(network, sims)

    acts = {}
    # PUCT and Gumbel with the Catch config's value term (mctx's), then PUCT with the agent's
    # default one (EfficientZero's: the tree's Q range, unvisited at the parent's mean).
    default = muzero.default_config()
    catch_term = (agent_config.q_transform, agent_config.unvisited_q)
    default_term = (default.q_transform, default.unvisited_q)
    for name, search, (q_transform, unvisited) in (("muzero", "muzero", catch_term),
                                                   ("gumbel", "gumbel", catch_term),
                                                   ("muzero_ez", "muzero", default_term)):
        agent_config.search = search
        agent_config.q_transform, agent_config.unvisited_q = q_transform, unvisited
        agent = agents.make(agent_config, spec)
        state = agent.init(jax.random.PRNGKey(0), spec)
        acts[name] = (jax.jit(lambda p, t, k, agent=agent: agent.actor_step(p, (), t, k)[0]),
                      agent.actor_params(state), muzero.search_config(agent_config))
    rows, skipped = [], []
    # More roots per search: does the share of the time in network passes grow with the batch?
    for i, n in enumerate((4,) if smoke else roots):
        if not budget.next_point():
            skipped.append(f"{n} roots: time cap")
            continue
        timestep = jax.vmap(lambda k: env.reset(k)[1])(
            jax.random.split(jax.random.PRNGKey(1), n))
        forward_s = best_call_time(forward_only, params, timestep.observation, repeats=repeats)
        for search, (act, actor_params, search_config) in acts.items():
            seconds = best_call_time(act, actor_params, timestep, jax.random.PRNGKey(2),
                                     repeats=repeats)
            row = _search_row(f"{search} ({n} roots x {sims} simulations)", n * sims,
                              seconds, forward_s)
            # At the first size only (each size compiles the search again); in smoke, for the
            # first search only.
            if i == 0 and not (smoke and rows):
                parents = jax.jit(lambda p, o, k, c=search_config: muzero.run_search(
                    network, p["network"], o, k, c, evaluation=False,
                    temperature=p["temperature"]).search_tree.parents)(
                        actor_params, timestep.observation, jax.random.PRNGKey(2))
                iterations = tree_loop_iterations(jax.device_get(parents))
                row["tree_loop_iterations"] = iterations
                # The search's time outside the network passes, per loop iteration: an upper
                # bound on one iteration's cost (the expansions' and backups' other work is in
                # it too).
                row["tree_us_per_loop_iteration"] = 1e6 * (seconds - forward_s) / iterations
            rows.append(row)
        if i == 0 and mean_q_methods:
            rows.extend(_mean_q_rows(network, params, timestep.observation, acts["muzero_ez"][2],
                                     n, sims, forward_s, repeats))
    # The Atari config's search with its residual network on Pong's frames, at the first size:
    # the share in network passes where the passes are convolutions, not Catch's small MLP.
    if atari and not budget.next_point():
        skipped.append("muzero_atari.py's search: time cap")
    elif atari and atari_missing() is None:
        rows.append(_atari_search_row(4 if smoke else roots[0], sims, repeats))
    return rows, skipped


def _mean_q_rows(network, params, observation, search_config, n: int, sims: int,
                 forward_s: float, repeats: int) -> list[dict[str, Any]]:
    """`muzero_ez`'s search alone (no actor step around it) with its parents' mean Q computed
    each way (`muzero.mean_q`): walking up the tree in a loop, or by pointer jumps with no
    loop. Which is faster where: on CPU the walk; on a GPU, where the walk's every iteration
    waits for the host at every step down, is the question."""
    rows = []
    for method, search in mean_q_searches(network, search_config).items():
        seconds = best_call_time(search, params, observation, jax.random.PRNGKey(2),
                                 repeats=repeats)
        rows.append(_search_row(f"muzero_ez search alone, mean Q by {method} ({n} roots x "
                                f"{sims} simulations)", n * sims, seconds, forward_s))
    return rows


def _search_row(setting: str, simulations: int, seconds: float,
                passes_seconds: float) -> dict[str, Any]:
    """A search's row: figure / against = the share of its time spent in the network passes."""
    return _row("muzero_search", setting, simulations / seconds, "simulations/s",
                "network passes alone (ratio: share of time in them)",
                simulations / passes_seconds)


def _atari_search_row(n: int, sims: int, repeats: int) -> dict[str, Any]:
    """`muzero_atari.py`'s search from `n` copies of a Pong reset."""
    config = muzero_atari.get_config()
    agent_config = config.agent.copy_and_resolve_references()
    agent_config.num_simulations = sims
    options = envpool_env.make_options(config.env.task, config.env.protocol, config.env.kwargs)
    spec = envpool_env.env_spec(config.env.task, options)
    env = envpool_env.EnvpoolEnv(config.env.task, 1, seed=0, options=options)
    timestep = env.reset()
    env.close()
    timestep = jax.tree.map(lambda x: jnp.repeat(jnp.asarray(x), n, axis=0), timestep.replace(
        observation=envpool_env.to_agent_layout(timestep.observation)))
    network = muzero.make_network(agent_config, spec)
    params = network.init(jax.random.PRNGKey(0), timestep.observation[:1],
                          jnp.zeros((1,), jnp.int32))
    forward_s = best_call_time(muzero_passes(network, sims), params, timestep.observation,
                               repeats=repeats)
    agent = agents.make(agent_config, spec)
    actor_params = agent.actor_params(agent.init(jax.random.PRNGKey(0), spec))
    act = jax.jit(lambda p, t, k: agent.actor_step(p, (), t, k)[0])
    seconds = best_call_time(act, actor_params, timestep, jax.random.PRNGKey(2),
                             repeats=repeats)
    return _search_row(f"muzero_atari.py: {agent_config.search}, {agent_config.network} with "
                       f"{agent_config.channels} channels on {config.env.task} frames ({n} roots "
                       f"x {sims} simulations)", n * sims, seconds, forward_s)


def muzero_learner(budget: Budget, smoke: bool) -> tuple[list[dict], list[str]]:
    config = muzero_catch.get_config()
    repeats, learner_updates = (1, 2) if smoke else (3, 20)
    if smoke:
        config.num_envs, config.rollout_length, config.updates_per_chunk = 4, 4, 2
        config.agent.num_simulations, config.agent.batch_size = 2, 4
        config.agent.min_replay_items = 8
        # K = 1 and n = 1: the unrolled model and the value targets are the smallest programs
        # that still take every path of an update.
        config.agent.unroll_steps, config.agent.td_steps, config.agent.updates_per_step = 1, 1, 1
    env = envs_jax.wrap_for_training(envs_jax.make(config.env.name))
    spec = env.spec()
    agent = agents.make(config.agent, spec)
    n = config.num_envs
    chunk, state, steps = anakin_replay_chunk(agent, env, config)
    seconds = best_time(chunk, state, repeats)
    rows = [_row("muzero_learner", f"MuZero-Anakin on Catch ({n} envs, "
                 f"{config.agent.num_simulations} simulations)", steps / seconds,
                 "env steps/s")]
    if budget.spent():
        return rows, ["learner updates alone: time cap"]
    learner_config = config.agent.copy_and_resolve_references()
    network = muzero.make_network(learner_config, spec)
    replay, _, history = muzero.make_replay(learner_config, spec)
    optimizer = muzero.make_optimizer(learner_config)
    learn = muzero.learn_config(learner_config)

    @jax.jit
    def updates(learner_state, key):
        def one(learner_state, key):
            return muzero.learner_update(network, optimizer, replay, learn, learner_state, key,
                                         history=history, axis_name=None)
        return jax.lax.scan(one, learner_state, jax.random.split(key, learner_updates))[1]["loss"]

    seconds = best_call_time(updates, state.learner_state, jax.random.PRNGKey(3),
                             repeats=repeats)
    rows.append(_row("muzero_learner", f"learner updates alone (batch "
                     f"{learner_config.batch_size}, K={learner_config.unroll_steps})",
                     learner_updates / seconds, "updates/s"))
    return rows, []


# ---------------------------------------------------------------------------------------------
# MAX-POOLING'S GRADIENT

# The IMPALA ResNet's max-pools: (height = width, channels) of each one's input on 84 x 84 frames.
RESNET_POOLS = ((84, 16), (42, 32), (21, 32))


def maxpool_grad(budget: Budget, smoke: bool) -> tuple[list[dict], list[str]]:
    """Frames/s of the three pools' forward and backward pass with `agents.layers`' gradient,
    against the same with XLA's select-and-scatter: on the CPU it was written for, and on the
    device, whether the learner would be faster with XLA's (as the convolutions' kernel
    gradient keeps XLA's off the CPU)."""
    del budget  # one measurement
    # The Pong config's learner batch: 32 trajectories x T = 20 frames.
    frames, repeats = (2, 1) if smoke else (640, 3)
    inputs = [jax.random.normal(jax.random.PRNGKey(i), (frames, size, size, channels))
              for i, (size, channels) in enumerate(RESNET_POOLS)]

    def forward_backward(pool):
        def loss(xs):
            return sum(jnp.sum(jnp.square(pool(x))) for x in xs)
        return jax.jit(jax.grad(loss))

    ours = best_call_time(forward_backward(layers.max_pool_3x3_stride_2), inputs,
                          repeats=repeats)
    xla_pool = functools.partial(nn.max_pool, window_shape=(3, 3), strides=(2, 2),
                                 padding="SAME")  # the same maths, XLA's own gradient
    xla = best_call_time(forward_backward(xla_pool), inputs, repeats=repeats)
    return [_row("maxpool_grad", f"agents.layers' gradient, {frames} frames through the IMPALA "
                 f"ResNet's three pools", frames / ours, "frames/s",
                 "XLA's select-and-scatter (ratio above 100%: ours is faster)", frames / xla)], []


# ---------------------------------------------------------------------------------------------
# SEBULBA V-TRACE ON PONG


def atari_missing() -> str | None:
    """Why envpool's Pong cannot be made here, or None."""
    try:
        env = envpool_env.EnvpoolEnv("Pong-v5", 1, seed=0,
                                     options=envpool_env.make_options("Pong-v5", "impala"))
        env.reset()
        env.close()
    except Exception as e:  # noqa: BLE001 - any failure to make the game is the reason
        return f"envpool cannot make Pong-v5 ({type(e).__name__}: {e})"
    return None


def sebulba_pong(budget: Budget, smoke: bool) -> tuple[list[dict], list[str]]:
    reason = atari_missing()
    if reason is not None:
        raise _Skip(reason)
    base = sebulba_vtrace_atari.get_config()
    # In smoke, the shallow torso, T = 2 and the fewest updates that leave one steady-state
    # record (`end_to_end_shares`), at one point: a second would compile the same programs.
    seconds, e2e_updates = (0.5, 3) if smoke else (5.0, 8)
    if smoke:
        base.agent.torso = "conv"
        base.rollout_length = 2
    variants = {"2 threads x 2 envs": (2, 2, 0, 2)} if smoke else SEBULBA_POINTS
    options = envpool_env.make_options(base.env.task, base.env.protocol, base.env.kwargs)
    rows, skipped = [], []
    for name, (threads, envs, env_threads, batches) in variants.items():
        if not budget.next_point():
            skipped.append(f"{name}: time cap")
            continue
        config = base.copy_and_resolve_references()
        config.actor_threads_per_device, config.envs_per_actor_thread = threads, envs
        config.env.num_threads, config.env.batches = env_threads, batches
        config, sizes = sebulba_config.resolved(config)
        in_batches = f" in {batches} batches" if batches > 1 else ""
        setting = (f"{name}: {sizes.actor_threads_per_device} x {sizes.envs_per_actor_thread} "
                   f"envs{in_batches}, {sizes.env_threads} envpool threads each, actors "
                   f"{list(sizes.actor_device_ids)}, learners {list(sizes.learner_device_ids)}")
        alone = sebulba_bench.envpool_alone(config, options, seconds)
        frame_skip = options.get("frame_skip", 1)
        # An actor thread's calls of `act` are on B / batches environments each; n threads.
        n = sizes.actor_threads_per_device * len(sizes.actor_device_ids)
        per_call = sizes.envs_per_actor_thread // batches
        inference = inference_ms = None
        if smoke or name.startswith("derived"):
            # The actor threads' inference with no learner or envpool beside it: whether the
            # inference end to end costs more than alone (sharing the device, or the host).
            spec = envpool_env.env_spec(config.env.task, options)
            agent = agents.make(config.agent, spec)
            params = agent.actor_params(agent.init(jax.random.PRNGKey(0), spec))
            steps = sebulba_bench.actor_alone(config, options, agent, spec, params,
                                              seconds).steps_per_second
            inference, inference_ms = steps * frame_skip, 1000 * n * per_call / steps
        rate, shares = sebulba_bench.end_to_end_shares(config, e2e_updates)
        row = _row("sebulba_pong", setting, rate.steps_per_second * frame_skip, "frames/s",
                   "envpool alone, same batches and threads",
                   alone.steps_per_second * frame_skip)
        row["shares"] = shares
        row["actor_inference_alone"] = inference  # frames/s, or None where not measured
        # Milliseconds per call of `act`: end to end, a thread's share of time in inference
        # over its calls per second (n x B/batches / the agent steps per second); alone, the
        # same calls with nothing beside them.
        row["inference_ms_per_call"] = (1000 * shares["inference"] * n * per_call
                                        / rate.steps_per_second)
        row["inference_ms_per_call_alone"] = inference_ms
        # The learner's busy time per update (an update takes every thread's rollout of
        # B x T steps): set beside the inference calls, whether an actor's call waiting
        # behind an update on a shared device could make up the difference.
        per_update = n * sizes.envs_per_actor_thread * config.rollout_length
        row["learner_ms_per_update"] = (1000 * (1 - shares["learner waiting for rollouts"])
                                        * per_update / rate.steps_per_second)
        rows.append(row)
    return rows, skipped


# ---------------------------------------------------------------------------------------------
# THE SEARCH AND ANAKIN WITH THEIR LOOPS IN CUDA GRAPHS


def graph_loops(budget: Budget, smoke: bool, xla_flags: tuple[str, ...] = GRAPH_LOOP_FLAGS,
                ) -> tuple[list[dict], list[str]]:
    """`GRAPH_LOOP_POINTS` in a process of their own with `xla_flags` added to XLA_FLAGS (XLA
    reads its flags once, when its backend starts, and ends the process on one it cannot
    parse): its rows, each setting prefixed with the part it repeats, and its parts that did
    not finish among the skipped points."""
    # In smoke, the search only: XLA parses the flags at start-up, whatever the programs.
    points = ({"muzero_search": GRAPH_LOOP_POINTS["muzero_search"]} if smoke
              else GRAPH_LOOP_POINTS)
    if not smoke and budget.left() <= STARTUP_S:
        return [], [f"{name}: time cap (its process would not start in time)" for name in points]
    command = [sys.executable, "-m", "experiments.benchmarks.device_check",
               f"--parts={','.join(points)}"]
    command += [flag for point in points.values() for flag in point]
    command += ["--smoke"] if smoke else [f"--check_s={child_check_s(budget.left()):.1f}"]
    # This process already holds most of a GPU's memory (JAX reserves 75% of it when its
    # backend starts): the second allocates what it uses as it goes.
    env = {**os.environ, "XLA_FLAGS": " ".join(
        [os.environ.get("XLA_FLAGS", ""), *xla_flags]).strip(),
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    stopped = ""
    with tempfile.TemporaryDirectory(prefix="graph_loops_") as out:
        try:
            # In smoke the cap is not a limit: a loaded CI machine may take longer.
            proc = subprocess.run(command + [f"--out={out}"], env=env, capture_output=True,
                                  text=True, timeout=None if smoke else budget.left(),
                                  check=False)
        except subprocess.TimeoutExpired:
            # Its files hold the parts it finished (it writes them after each).
            stopped = (f"its process ran past the part's {budget.cap_s:.0f} s cap and was "
                       f"stopped")
        else:
            if proc.returncode != 0:
                raise RuntimeError(f"its process exited with status {proc.returncode}: "
                                   + _last_errors(proc.stderr))
        child, unfinished = child_results(out, list(points), stopped)
    rows, skipped = [], []
    for name, part in child["parts"].items():
        for row in part["rows"]:
            rows.append({**row, "part": "graph_loops", "setting": f"{name}: {row['setting']}",
                         "xla_flags": child["xla_flags"], "memory": child["memory"]})
        skipped += [f"{name}: {point}" for point in part["capped"]]
        if part["status"] != "ok":
            skipped.append(f"{name}: {part['status']}: {part['reason']}")
    return rows, skipped + unfinished


def _last_errors(stderr: str) -> str:
    """The last lines of `stderr` that report an error (XLA's `E`/`F` log lines, Python's
    exception), else its last lines: XLA follows a flag it cannot parse with its flags' help."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines
              if (line[0] in "EF" and line[1:5].isdigit()) or "Error" in line.split(" ")[0]]
    return " / ".join((errors or lines)[-3:])


class _Skip(Exception):
    """A part that cannot run here, with the reason."""


# ---------------------------------------------------------------------------------------------
# THE CHECK


PART_FUNCTIONS: dict[str, Callable[..., tuple[list[dict], list[str]]]] = {
    "anakin_catch": anakin_catch, "muzero_search": muzero_search,
    "muzero_learner": muzero_learner, "maxpool_grad": maxpool_grad,
    "sebulba_pong": sebulba_pong, "graph_loops": graph_loops}


def run_part(name: str, smoke: bool, cap_s: float | None = None, **points) -> dict[str, Any]:
    """One part's record: status ("ok", "skipped" or "failed"), reason, seconds, its time cap
    (`cap_s`, default its own in `CAPS_S`), rows and the points the cap skipped. `points`: the
    part's own keyword arguments (`roots=`, `atari=`, `envs=`, `xla_flags=`)."""
    start = time.perf_counter()
    cap_s = CAPS_S[name] if cap_s is None else cap_s
    record: dict[str, Any] = {"status": "ok", "reason": "", "cap_s": cap_s, "rows": [],
                              "capped": []}
    try:
        record["rows"], record["capped"] = PART_FUNCTIONS[name](Budget(cap_s), smoke, **points)
    except _Skip as e:
        record.update(status="skipped", reason=str(e))
    except Exception as e:  # noqa: BLE001 - one part's failure must not lose the others
        record.update(status="failed", reason=f"{type(e).__name__}: {e}",
                      traceback=traceback.format_exc())
    record["seconds"] = time.perf_counter() - start
    return record


def table(results: dict[str, Any]) -> str:
    """The markdown table of a check's results: one row per figure, one per part not run."""
    lines = ["| part | setting | figure | against | ratio | status |",
             "|---|---|---:|---|---:|---|"]
    for name, part in results["parts"].items():
        for row in part["rows"]:
            against = (f"{row['against']}: {row['against_figure']:,.0f}"
                       if row["against_figure"] else "")
            ratio = f"{100 * row['ratio']:.0f}%" if row["ratio"] is not None else ""
            lines.append(f"| {name} | {row['setting']} | {row['figure']:,.0f} {row['unit']} | "
                         f"{against} | {ratio} | {part['status']} |")
        for point in part["capped"]:
            lines.append(f"| {name} | {point} | | | | skipped |")
        if part["status"] != "ok":
            reason = part["reason"].replace("|", "/")
            lines.append(f"| {name} | | | | | {part['status']}: {reason} |")
    trees = [row for part in results["parts"].values() for row in part["rows"]
             if row.get("tree_loop_iterations")]
    if trees:
        lines += ["", "Search trees: while-loop iterations a search, and the search's time "
                      "outside the network passes per iteration", "",
                  "| part | setting | loop iterations | µs an iteration |", "|---|---|---:|---:|"]
        lines += [f"| {row['part']} | {row['setting']} | {row['tree_loop_iterations']} | "
                  f"{row['tree_us_per_loop_iteration']:.1f} |" for row in trees]
    for row in results["parts"].get("sebulba_pong", {}).get("rows", []):
        if "shares" not in row:
            continue
        lines += ["", f"Sebulba end to end, {row['setting']}: shares of its threads' time", "",
                  "| part | share |", "|---|---:|"]
        lines += [f"| {part} | {100 * share:.0f}% |" for part, share in row["shares"].items()]
        alone = (f"; alone (no learner, no envpool) {row['inference_ms_per_call_alone']:.2f} ms "
                 f"a call, {row['actor_inference_alone']:,.0f} frames/s"
                 if row.get("actor_inference_alone") else "")
        lines += ["", f"Inference: {row['inference_ms_per_call']:.2f} ms a call end to end"
                      f"{alone}. Learner: {row['learner_ms_per_update']:.2f} ms of work an "
                      f"update."]
    return "\n".join(lines)


def versions() -> dict[str, str]:
    """The installed versions of the packages the figures depend on (and Python's)."""
    found = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "flax", "optax", "chex", "mctx", "rlax", "numpy", "envpool"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def run(out: str, smoke: bool, parts: tuple[str, ...] = PARTS,
        points: dict[str, dict[str, Any]] | None = None,
        check_s: float | None = None) -> dict[str, Any]:
    """Runs `parts` (with `points[part]`, a part's own sizes, where given) within `check_s`
    seconds (`_schedule.run_parts`; None: each part's own cap), writes `out`/device_check.json
    and device_check.md after each (`write`); returns the results."""
    start = time.perf_counter()
    points = points or {}
    if smoke:
        # The smoke run checks that every part's code runs, not its speed: XLA's cheapest
        # compilation (most of its time is compiling).
        jax.config.update("jax_disable_most_optimizations", True)
    machine = machine_lib.detect()
    devices = jax.devices()
    results = {
        "smoke": smoke,
        "check_s": check_s,
        "machine": {"cores": machine.cores, "platform": machine.platform,
                    "local_devices": machine.num_devices,
                    "device_kind": devices[0].device_kind,
                    "processor": platform.processor() or platform.machine(),
                    "load_average": os.getloadavg()[0]},
        "versions": versions(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "memory": {name: os.environ.get(name, "") for name in (
            "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
            "XLA_PYTHON_CLIENT_ALLOCATOR")},
        "derived_sizes": {
            "sebulba": sebulba_config.derive_sizes(machine).fields(),
            "anakin_num_envs": anakin.config.derive_num_envs(machine, len(devices))},
        "parts": {},
    }
    os.makedirs(out, exist_ok=True)

    def one(name, cap_s):
        print(f"# {name} ...", flush=True)
        return run_part(name, smoke, cap_s, **points.get(name, {}))

    def after(name, part):
        print(f"# {name}: {part['status']} in {part['seconds']:.1f}s {part['reason']}",
              flush=True)
        results["parts"][name] = part
        results["seconds"] = time.perf_counter() - start
        write(out, results)  # after every part: a check stopped from outside keeps what ran

    run_parts(parts, CAPS_S, one, check_s, after)
    return results


def write(out: str, results: dict[str, Any]) -> None:
    """`out`/device_check.json and device_check.md, as far as the check has got; each written
    whole and then renamed into place, so that a check stopped while it writes leaves the
    files of its previous part."""
    for name, text in (("device_check.json", json.dumps(results, indent=2, default=str)),
                       ("device_check.md", table(results) + "\n")):
        path = os.path.join(out, name)
        with open(path + ".partial", "w") as f:
            f.write(text)
        os.replace(path + ".partial", path)


def _sizes(flag: flags.FlagHolder) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in flag.value)
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise app.UsageError(f"--{flag.name}={','.join(flag.value)}: give positive integers, "
                             f"comma-separated (e.g. --{flag.name}=256,1024)")
    return sizes


def main(argv):
    del argv
    parts = tuple(_PARTS.value) or PARTS
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise app.UsageError(f"--parts: {', '.join(unknown)} not a part; choose from "
                             f"{', '.join(PARTS)}")
    points = {}
    points["muzero_search"] = {"atari": _ATARI_SEARCH.value,
                               "mean_q_methods": _MEAN_Q_METHODS.value}
    if _ROOTS.value:
        points["muzero_search"]["roots"] = _sizes(_ROOTS)
    if _ANAKIN_ENVS.value:
        points["anakin_catch"] = {"envs": _sizes(_ANAKIN_ENVS)}
    if _GRAPH_LOOP_XLA_FLAGS.value:
        points["graph_loops"] = {"xla_flags": tuple(_GRAPH_LOOP_XLA_FLAGS.value.split())}
    if _CHECK_S.value < 0:
        raise app.UsageError(f"--check_s={_CHECK_S.value:g}: give the check's seconds, or 0 "
                             f"for each part's own cap only")
    check_s = None if _SMOKE.value or not _CHECK_S.value else _CHECK_S.value
    out = _OUT.value or tempfile.mkdtemp(prefix="device_check_")
    results = run(out, _SMOKE.value, tuple(p for p in PARTS if p in parts), points, check_s)
    print("\n" + table(results))
    print(f"\nWritten: {os.path.join(out, 'device_check.json')} and "
          f"{os.path.join(out, 'device_check.md')}", flush=True)


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
