"""The Sebulba runner (Hessel et al., 2021, section 4): environments on the host, acting on
actor devices, learning replicated over learner devices, in every process of a run.

Data flow in one process (A actor devices, N threads each, L learner devices here, L_all in
the whole run):

    actor thread (A x N of them; each owns an envpool batch of B environments):
        timestep = env.reset()
        for rollout k = 1, 2, ...:
            params = store.version(rollout_version(k))       # staleness: sebulba.params
            repeat T times:
                on the actor device: action, extras = actor_step(params, timestep)
                                     # only its observation and step type cross each step
                on the host:         timestep = env.step(action)   # envpool's C++ threads
            on the actor device: stack the T+1 timesteps, T actions and extras -> [T+1, B]
                                 (rewards and discounts sent once per rollout)
                                 and split along B into L shards [T+1, B/L]
            shard l -> learner device l                       # device to device, no host copy
            queue[thread].put(shards)                         # bounded: back-pressure

    learner thread:
        for update u = 1 .. U:
            batch = rollout u of every actor thread           # queue[i].get() for each i
            state = learner_step(state, batch)                # replicated over the L_all
                                                              # learner devices; pmean'd grads;
                                                              # dispatched, not awaited
            params_store.publish(u, actor_params(state))      # onto every actor device

    main thread: validates, compiles, starts the threads, then waits until the learner is done,
    a thread fails, or Ctrl-C; then stops every thread and closes every environment.

Parts: `sebulba.actor` (an actor thread's loop), `sebulba.learner` (the learner state, the
replicated update and the learner thread's loop), `sebulba.params` (the parameter store and the
staleness protocol: which version rollout k acts with), `sebulba.evaluation` (greedy
evaluation), `sebulba.threads` (the supervisor, the errors, the bounded waits). This module
only wires them together.

Replicas: under `jax.distributed` every process runs this same program on its own devices and
environments; the learner mesh holds the learner devices of all processes, so the update's
`pmean` averages gradients over all of them, and all processes apply identical updates.

Checkpoints (with a workdir): the learner thread saves, after update u and its publication,
the whole learner state stacked over the learner devices (parameters, optimiser state, target
parameters, MuZero's replay buffer: whatever the agent's state holds), the learner devices'
RNG keys and the counters (updates, env steps, wall time), every `checkpoint_every_updates`,
at the end and on SIGTERM, into `<workdir>/checkpoints` (the newest `checkpoint_keep` kept).
Starting again with the same workdir resumes from the newest good one: the learner continues
at update u + 1, the parameter store starts at version u (the first rollouts act with the
restored parameters, as the first ones of a fresh run act with version 0), and env steps count
on from the checkpoint's. What an actor thread holds is not saved: envpool cannot save its
environments' states, so a resumed run resets every environment, seeded from (seed, process,
thread, u), and starts each actor's RNG key and actor state afresh from the same figures.
A resumed run is therefore a pure function of (config, seed, device count, checkpoint) but,
unlike an Anakin run, NOT bit-identical to an uninterrupted one: the episodes in flight at the
checkpoint are restarted, so the trajectories after it differ.

Pre-emption: SIGTERM sets a flag (`podracer.checkpoint.Preemption`) that the learner looks at
after every update, or every `PREEMPTION_CHECK_EVERY` updates in a run of several processes
(every process at the same update, so that they stop together); it then
logs, saves a checkpoint, and the run stops every thread and closes every environment.

Faults: every thread runs inside `sebulba.threads.Supervisor`; a failure anywhere sets the stop
flag that every blocking wait polls, and `train` re-raises the original exception.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import queue
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

import agents
from podracer import distributed, replication
from podracer import metrics as metrics_lib
from podracer import workdir as workdir_lib
from podracer.checkpoint import Checkpointer, Preemption, state_layout
from podracer.config import run_option
from podracer.session import EVAL_STREAM
from podracer.types import Trajectory
from sebulba import envpool_env
from sebulba.actor import Actor, ActorCounters, make_actor_functions
from sebulba.config import validate
from sebulba.evaluation import make_evaluator
from sebulba.learner import (
    PREEMPTION_CHECK_EVERY,
    Learner,
    abstract_batch,
    abstract_learner,
    init_learner,
    make_local_actor_params,
    make_update,
    set_learner_hparams,
)
from sebulba.params import ParamsStore, versions_to_keep
from sebulba.threads import JOIN_S, ProgressClock, StallError, Supervisor, ThreadFailure

__all__ = [  # the parts' names that code imported from here before the split, too
    "ParamsStore", "ProgressClock", "StallError", "ThreadFailure", "TrainResult",
    "abstract_batch", "abstract_learner", "init_learner", "make_actor_functions",
    "make_evaluator", "make_update", "save_params", "set_learner_hparams", "train",
]


# ---------------------------------------------------------------------------------------------
# RESULTS


@dataclasses.dataclass
class TrainResult:
    learner_state: Any  # stacked over every learner device of the run
    learner_keys: jax.Array  # [learner devices, ...] each learner device's RNG key
    final_metrics: dict[str, Any]  # the last log record
    history: list[dict[str, Any]]  # every log record (a resumed run: earlier ones included)
    policy_lags: list[int]  # one per update of this call: (u - 1) - oldest version in batch u
    actor_params: list[tuple[int, Any]]  # (version, params) newest on each actor device
    last_batch: tuple[Trajectory, ...]  # the last update's input, global arrays
    run_info: dict[str, Any]  # what was run: envpool version and protocol, devices, config
    compile_seconds: float
    run_seconds: float
    interrupted: bool = False  # stopped by SIGTERM (after saving a checkpoint, with a workdir)
    resumed_from_updates: int | None = None  # the checkpoint this run started from
    checkpoint_seconds: float = 0.0  # time the learner spent handing checkpoints to orbax
    eval_seconds: float = 0.0  # time the learner spent evaluating (compilation included)

    @property
    def params(self) -> Any:
        """The learner parameters of this process's first learner device."""
        return replication.unreplicate(self.learner_state.params)


# ---------------------------------------------------------------------------------------------
# THE RUN


def _devices_of_process(process_index: int) -> list[jax.Device]:
    return sorted((d for d in jax.devices() if d.process_index == process_index),
                  key=lambda d: d.id)


# Fields that may change between an interrupted run and its resumption: those of
# `podracer.workdir.RESUMABLE_CHANGES`, and how often and how patiently the run logs.
RESUMABLE_CHANGES = workdir_lib.RESUMABLE_CHANGES + ("log_every_updates", "timeout_s",
                                                        "save_final_params")


def _env_seed(*entropy: int) -> int:
    """An envpool seed (a non-negative int32) from a tuple of integers."""
    return int(np.random.SeedSequence(list(entropy)).generate_state(1)[0] % (2**31 - 1))


def train(config: ml_collections.ConfigDict, workdir: str | None = None, *,
          log_fn: Callable[[dict], None] | None = None) -> TrainResult:
    """Runs a Sebulba experiment to `config.total_env_steps` and returns its final state.

    Joins a `jax.distributed` run first if launched as one (see `podracer.distributed`).
    Without a workdir it only prints progress. With one, process 0 writes run_info.json,
    config.json/config.yaml, metrics.jsonl and TensorBoard event files, and every process
    writes its shards of the checkpoints in `<workdir>/checkpoints`, from which a later call
    with the same workdir resumes (see the module docstring: a resumed run restarts its
    environments, so it is not bit-identical to an uninterrupted one). SIGTERM stops the run
    after the update in flight, with a checkpoint saved, and returns a result with
    `interrupted=True`. `log_fn` gets every record.
    """
    distributed.initialize_from_env()
    topology = validate(config)
    if workdir is not None:
        workdir = workdir_lib.check_writable(workdir)
    process = jax.process_index()
    is_main = process == 0
    local = jax.local_devices()
    actor_devices = [local[i] for i in topology.actor_device_ids]
    learner_devices_here = [local[i] for i in topology.learner_device_ids]
    learner_mesh = replication.make_mesh([
        _devices_of_process(p)[i]
        for p in range(jax.process_count()) for i in topology.learner_device_ids
    ])
    assert replication.local_devices(learner_mesh) == learner_devices_here

    task, protocol = config.env.task, config.env.protocol
    options = envpool_env.make_options(task, protocol, config.env.get("kwargs", {}))
    # Evaluation may play under other options, e.g. whole games without episodic life.
    eval_options = envpool_env.make_options(task, protocol, {
        **config.env.get("kwargs", {}), **config.env.get("eval_kwargs", {})})
    spec = envpool_env.env_spec(task, options)
    agent = agents.make(config.agent, spec)
    frame_skip = int(options.get("frame_skip", 1))

    num_threads = topology.num_actor_threads
    envs_per_thread = config.envs_per_actor_thread
    rollout_length = config.rollout_length
    steps_per_update = jax.process_count() * num_threads * envs_per_thread * rollout_length
    num_updates = max(1, math.ceil(config.total_env_steps / steps_per_update))
    fixed = config.staleness == "fixed"
    checkpoint_every = run_option(config, "checkpoint_every_updates")
    eval_every = run_option(config, "eval_every_updates")
    config_dict = metrics_lib.config_to_dict(config)

    run_info = {
        "architecture": "sebulba",
        "environment": envpool_env.run_description(task, protocol, options),
        "evaluation_environment": envpool_env.run_description(task, protocol, eval_options),
        "agent": config.agent.name,
        "platform": local[0].platform,
        "num_processes": jax.process_count(),
        "actor_devices": [str(d) for d in actor_devices],
        "learner_devices": [str(d) for d in learner_mesh.devices.flat],
        "actor_threads": num_threads,
        "learner_batch": [rollout_length, steps_per_update // rollout_length],
        "num_updates": num_updates,
        "jax_version": jax.__version__,
        "config": config_dict,
    }

    # May this run resume the workdir's checkpoint? Decided from metadata alone, before
    # anything compiles: a refused run fails here and changes nothing in the workdir.
    params_key, learner_key, actor_key = jax.random.split(jax.random.PRNGKey(config.seed), 3)
    checkpoint_dir = None if workdir is None else os.path.join(workdir, "checkpoints")
    run_shape = {"num_processes": jax.process_count(),
                 "num_learner_devices": int(learner_mesh.devices.size)}
    resume_args = {
        "config": config_dict, "run_shape": run_shape, "resumable": RESUMABLE_CHANGES,
        "layout": state_layout(abstract_learner(agent, spec, learner_mesh, params_key,
                                                learner_key)),
    }
    point = (None if checkpoint_dir is None
             else workdir_lib.find_resume_point(checkpoint_dir, **resume_args))

    # THE LEARNER STATE, then (below) its compiled update, before any thread starts
    start = time.perf_counter()
    learner_state, learner_keys = init_learner(agent, spec, learner_mesh, params_key, learner_key)
    init_seconds = time.perf_counter() - start

    # RESUME from the checkpoint found above (or, if it proves damaged, an older one).
    checkpointer = None
    start_update, wall_offset, resumed_from = 0, 0.0, None
    if checkpoint_dir is not None:
        # Asynchronous: the files are written while the learner goes on.
        checkpointer = Checkpointer(checkpoint_dir,
                                    max_to_keep=run_option(config, "checkpoint_keep"),
                                    asynchronous=True)
        try:
            restored, point = workdir_lib.restore(
                checkpointer, point,
                {"learner_state": learner_state, "learner_keys": learner_keys}, **resume_args)
        except BaseException:
            checkpointer.close()
            raise
        if restored is not None:
            learner_state = restored.state["learner_state"]
            learner_keys = restored.state["learner_keys"]
            held = {f"agent.{n}" for n in agent.sweepable}
            if agent.set_hparams is not None and held & set(point.changes):
                # Continuing with changed values (`resume_allow_changes`) that the restored
                # state holds as the checkpoint's.
                learner_state = set_learner_hparams(agent, learner_mesh, learner_state,
                                                    config.agent)
            start_update = resumed_from = int(restored.metadata["updates"])
            wall_offset = float(restored.metadata["wall_time"])

    if start_update >= num_updates:
        return _already_done(config, workdir, checkpointer, learner_state, learner_keys,
                             run_info, start_update, num_updates, init_seconds)

    # COMPILE THE LEARNER
    start = time.perf_counter()
    act, pack = make_actor_functions(agent, len(learner_devices_here))
    example_batch = abstract_batch(agent, spec, learner_mesh, rollout_length=rollout_length,
                                   shard_batch=envs_per_thread // len(learner_devices_here),
                                   num_rollouts=num_threads)
    update_fn = replication.replicate(make_update(agent), learner_mesh, donate_argnums=(0, 1))
    update_fn = update_fn.lower(learner_state, learner_keys, example_batch).compile()
    local_actor_params = make_local_actor_params(agent)
    compile_seconds = init_seconds + time.perf_counter() - start
    run_info["resumed_from_updates"] = resumed_from

    # Version `start_update` (0, or the checkpoint's) is what the first rollouts act with.
    store = ParamsStore(actor_devices, keep=versions_to_keep(config.staleness, config.policy_lag))
    store.publish(start_update, local_actor_params(learner_state))

    # THREADS
    supervisor = Supervisor()
    stop = supervisor.stop
    counters = ActorCounters()
    learner_clock = ProgressClock()  # ticks after every update
    actor_clock = ProgressClock()  # ticks after every environment step of any actor thread
    queues = [queue.Queue(maxsize=config.queue_size) for _ in range(num_threads)]
    envs: list[envpool_env.EnvpoolEnv] = []
    # Resumed: the environments and actor keys start afresh, seeded by the resumed update.
    resume_entropy = (start_update,) if resumed_from is not None else ()

    # OUTPUTS (process 0); a resumed run drops what its predecessor logged after the checkpoint
    records = workdir_lib.Records.open(
        workdir, [workdir], config=config_dict, enabled=is_main, resumed_from=resumed_from,
        total_env_steps=num_updates * steps_per_update,
        resume_env_steps=None if resumed_from is None else resumed_from * steps_per_update,
        changes=None if point is None else point.changes)
    history = records.histories[0]
    if is_main and workdir:
        with open(os.path.join(workdir, "run_info.json"), "w") as f:
            json.dump(run_info, f, indent=2, default=str)
    preemption = Preemption()

    def log(record: dict) -> None:
        record = records.write(0, record)
        if log_fn is not None:
            log_fn(record)

    learner = Learner(
        update_fn=update_fn, local_actor_params=local_actor_params, state=learner_state,
        keys=learner_keys, mesh=learner_mesh, queues=queues, store=store, counters=counters,
        num_updates=num_updates, steps_per_update=steps_per_update, timeout_s=config.timeout_s,
        seed=config.seed, start_update=start_update, log_every=config.log_every_updates,
        frame_skip=frame_skip, log=log,
        eval_every=eval_every,  # `evaluate` is set below, with process 0's environments
        checkpointer=checkpointer, checkpoint_every=checkpoint_every,
        checkpoint_metadata={"num_processes": jax.process_count(),
                             "num_learner_devices": int(learner_mesh.devices.size),
                             "config": config_dict},
        should_stop=preemption.requested,
        stop_check_every=1 if jax.process_count() == 1 else PREEMPTION_CHECK_EVERY,
        learner_clock=learner_clock, actor_clock=actor_clock,
        wall_offset=compile_seconds + wall_offset)
    learner.saved_update = resumed_from

    if is_main:
        print(f"Sebulba: {config.agent.name} on {task} (protocol {protocol or 'none'}, envpool "
              f"{run_info['environment']['envpool_version']}); {jax.process_count()} "
              f"process(es); actors {run_info['actor_devices']} x {config.actor_threads_per_device}"
              f" thread(s) x {envs_per_thread} envs; learners {run_info['learner_devices']}; "
              f"T={rollout_length}, {num_updates} updates, staleness={config.staleness}"
              f"{f' (lag {config.policy_lag})' if fixed else ''}; compiled in "
              f"{compile_seconds:.1f}s", flush=True)
        if resumed_from is not None:
            print(f"Resuming from the checkpoint at update {resumed_from:,} ({resumed_from} of "
                  f"{num_updates} updates done) in {checkpointer.directory}; the environments "
                  "start afresh", flush=True)

    run_start = time.perf_counter()
    close_seconds = 0.0
    try:
        with preemption:
            for device_index in range(len(actor_devices)):
                for j in range(config.actor_threads_per_device):
                    thread_id = device_index * config.actor_threads_per_device + j
                    env = envpool_env.EnvpoolEnv(
                        task, envs_per_thread,
                        seed=_env_seed(config.seed, process, thread_id, *resume_entropy),
                        num_threads=config.env.num_threads, options=options)
                    envs.append(env)
                    key = jax.random.fold_in(jax.random.fold_in(actor_key, process), thread_id)
                    for entropy in resume_entropy:
                        key = jax.random.fold_in(key, entropy)
                    actor = Actor(
                        agent=agent, env=env, act=act, pack=pack, store=store,
                        device_index=device_index, learner_devices=learner_devices_here,
                        out=queues[thread_id], key=key, rollout_length=rollout_length,
                        policy_lag=config.policy_lag if fixed else None,
                        timeout_s=config.timeout_s, start_update=start_update,
                        name=f"actor thread {thread_id}", counters=counters,
                        learner_clock=learner_clock, actor_clock=actor_clock)
                    supervisor.start(f"actor-{process}.{device_index}.{j}",
                                     lambda a=actor: a.run(stop))
            if eval_every > 0 and is_main:
                # Its own environments, created once, seeded apart from the training ones.
                eval_env = envpool_env.EnvpoolEnv(
                    task, run_option(config, "eval_episodes"),
                    seed=_env_seed(config.seed, EVAL_STREAM), num_threads=config.env.num_threads,
                    options=eval_options)
                envs.append(eval_env)
                learner.evaluate = make_evaluator(agent, eval_env, actor_devices[0],
                                                  max_steps=run_option(config, "eval_max_steps"))
            supervisor.start(f"learner-{process}", lambda: learner.run(stop, run_start))
            # The main thread only watches, so that Ctrl-C (and SIGTERM's handler) land here.
            while not learner.done.is_set() and not stop.is_set():
                stop.wait(0.1)
    finally:
        stuck = supervisor.join()
        if not stuck:  # a thread still inside env.step must not find its environment freed
            for env in envs:
                env.close()
        records.close()
        if checkpointer is not None and not stuck:
            close_start = time.perf_counter()
            checkpointer.close()  # waits for the last save
            close_seconds = time.perf_counter() - close_start
    supervisor.raise_first_error()
    if stuck and not learner.done.is_set():
        raise StallError(f"threads did not stop within {JOIN_S:.0f}s: {stuck}")
    run_seconds = time.perf_counter() - run_start
    checkpoint_seconds = learner.checkpoint_seconds + close_seconds

    final = history[-1] if history else {}
    if is_main:
        metrics_lib.print_end_of_run(
            final, interrupted=learner.interrupted, signal_received=preemption.received,
            checkpoint_directory=None if checkpointer is None else checkpointer.directory,
            saved_update=learner.saved_update, run_seconds=run_seconds,
            compile_seconds=compile_seconds, checkpoint_seconds=checkpoint_seconds,
            eval_seconds=learner.eval_seconds)
    result = TrainResult(
        learner_state=learner.state,
        learner_keys=learner.keys,
        final_metrics=final,
        history=history,
        policy_lags=learner.policy_lags,
        actor_params=[store.newest(i) for i in range(len(actor_devices))],
        last_batch=learner.last_batch,
        run_info=run_info,
        compile_seconds=compile_seconds,
        run_seconds=run_seconds,
        interrupted=learner.interrupted,
        resumed_from_updates=resumed_from,
        checkpoint_seconds=checkpoint_seconds,
        eval_seconds=learner.eval_seconds,
    )
    if workdir and config.get("save_final_params", False) and not learner.interrupted:
        save_params(result.params, os.path.join(workdir, f"final_params.process{process}.npz"))
    return result


def _already_done(config: ml_collections.ConfigDict, workdir: str, checkpointer: Checkpointer,
                  learner_state: Any, learner_keys: jax.Array, run_info: dict[str, Any],
                  resumed_from: int, num_updates: int, init_seconds: float) -> TrainResult:
    """The result of rerunning a run whose checkpoint is at or past its end: the restored
    state and the log, with nothing compiled, started or written."""
    checkpointer.close()
    run_info["resumed_from_updates"] = resumed_from
    history = []
    if jax.process_index() == 0:
        history = [r for r in metrics_lib.read_records(workdir)
                   if r.get("updates", 0) <= resumed_from]
        print(f"Sebulba: nothing to do: the checkpoint at update {resumed_from:,} in "
              f"{checkpointer.directory} is at or past the run's end ({num_updates:,} updates "
              f"of {config.agent.name} on {config.env.task}).", flush=True)
    return TrainResult(
        learner_state=learner_state, learner_keys=learner_keys,
        final_metrics=history[-1] if history else {}, history=history, policy_lags=[],
        actor_params=[], last_batch=(), run_info=run_info, compile_seconds=init_seconds,
        run_seconds=0.0, resumed_from_updates=resumed_from)


def save_params(params: Any, path: str) -> None:
    """Writes a params pytree as an .npz keyed by each leaf's path."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    np.savez(path, **{jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves})


