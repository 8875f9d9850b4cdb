"""The Sebulba runner (Hessel et al., 2021, section 4): environments on the host, acting on
actor devices, learning replicated over learner devices, in every process of a run.

Data flow in one process (A actor devices, N threads each, L learner devices here, L_all in
the whole run):

    actor thread (A x N of them; each owns B host environments in env.batches batches:
                  envpool's, gymnasium's or envs_jax's, see `sebulba.host_env`):
        timestep = env.reset()                               # each batch
        for rollout k = 1, 2, ...:
            params = store.wait_for(rollout_version(k))      # "latest": store.newest()
            repeat T times, for each batch in turn (sebulba.actor):
                on the host:         timestep = env.recv()   # the step sent before
                on the actor device: action, extras = actor_step(params, timestep)
                                     # only its observation and step type cross each step
                on the host:         env.send(action)        # steps on envpool's threads
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

Parts: `sebulba.plan` (the run worked out once from the validated config: devices, sizes,
intervals, the environment and the agent), `sebulba.actor` (an actor thread's loop),
`sebulba.learner` (the learner state, the replicated update and the learner thread's loop),
`sebulba.params` (the parameter store and the staleness protocol: which version rollout k acts
with), `sebulba.evaluation` (greedy evaluation), `sebulba.threads` (the supervisor, the errors,
the bounded waits), and `podracer.session` (the workdir's lock, resumption, checkpointer and
records, as for Anakin). This module only wires them together.

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
on from the checkpoint's. What an actor thread holds is not saved: envpool (like gymnasium) cannot save
its environments' states, so a resumed run resets every environment, seeded from (seed, process,
thread, u), and starts each actor's RNG key and actor state afresh from the same figures.
A resumed run is therefore a pure function of (config, seed, device count, checkpoint) but,
unlike an Anakin run, NOT bit-identical to an uninterrupted one: the episodes in flight at the
checkpoint are restarted, so the trajectories after it differ.

Pre-emption: SIGTERM sets a flag (`podracer.checkpoint.Preemption`) that the learner looks at
after every update, or every `PREEMPTION_CHECK_EVERY` updates in a run of several processes
(every process at the same update, so that they stop together); it then
logs, saves a checkpoint, and the run stops every thread and closes every environment.

Faults: every thread runs inside `sebulba.threads.Supervisor`; a failure anywhere sets the stop
flag that every blocking wait polls, and `train` raises `sebulba.ThreadFailure`, whose
`__cause__` is the original exception (a `NonFiniteError` is raised as it is).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import jax
import ml_collections
import numpy as np

import agents
from podracer import config as cfg
from podracer import distributed, machine, replication
from podracer import metrics as metrics_lib
from podracer import workdir as workdir_lib
from podracer.agent import parameter_count
from podracer.checkpoint import Preemption, state_layout
from podracer.session import EVAL_STREAM, RunSession, TrainResult, print_end_of_run
from sebulba import host_env
from sebulba.actor import Actor, ActorCounters, make_actor_functions
from sebulba.evaluation import make_evaluator
from sebulba.learner import (
    PREEMPTION_CHECK_EVERY,
    Learner,
    LearnerOutcome,
    LearnerRun,
    LearnerSchedule,
    Wiring,
    abstract_batch,
    abstract_learner,
    init_learner,
    make_local_actor_params,
    make_update,
    set_learner_hparams,
)
from sebulba.params import ParamsStore, versions_to_keep
from sebulba.plan import SebulbaPlan, make_plan
from sebulba.threads import JOIN_S, ProgressClock, StallError, Supervisor, ThreadFailure

__all__ = [  # the parts' names that code imported from here before the split, too
    "ParamsStore", "ProgressClock", "StallError", "ThreadFailure", "TrainResult",
    "abstract_batch", "abstract_learner", "init_learner", "make_actor_functions",
    "make_evaluator", "make_update", "save_params", "set_learner_hparams", "train",
]

# Fields that may change between an interrupted run and its resumption: those of
# `podracer.workdir.RESUMABLE_CHANGES`, how often and how patiently the run logs, and how the
# actor threads step their environments (envpool's threads, derived from the machine, and the
# batches; a resumed run's environments start afresh either way).
RESUMABLE_CHANGES = workdir_lib.RESUMABLE_CHANGES + ("log_every_updates", "timeout_s",
                                                        "save_final_params", "env.num_threads",
                                                        "env.batches")


# ---------------------------------------------------------------------------------------------
# THE RUN


def train(config: ml_collections.ConfigDict, workdir: str | None = None, *,
          log_fn: Callable[[dict], None] | None = None) -> TrainResult:
    """Runs a Sebulba experiment to `config.total_env_steps` and returns its final state.

    Joins a `jax.distributed` run first if launched as one (see `podracer.distributed`).
    Without a workdir it only prints progress. With one, process 0 writes run_info.json,
    config.json/config.yaml, metrics.jsonl and TensorBoard event files, and every process
    writes its shards of the checkpoints in `<workdir>/checkpoints`, from which a later call
    with the same workdir resumes (see the module docstring: a resumed run restarts its
    environments, so it is not bit-identical to an uninterrupted one). The workdir is locked
    while the run lives (`podracer.session`): a second run on it is refused before compiling,
    naming this one. SIGTERM stops the run after the update in flight, with a checkpoint
    saved, and returns a result with `interrupted=True`. `log_fn` gets every record.
    `TrainResult.state` is a `sebulba.learner.LearnerRun`.
    """
    distributed.initialize_from_env()
    machine.set_cpu_worker_threads(cfg.cpu_worker_threads(config))
    plan = make_plan(config)
    session = RunSession.open(workdir)
    threads = _Threads(plan)
    try:
        mesh = _learner_mesh(plan)
        keys = _Keys.from_seed(plan.seed)
        session.find_resume_point(**_resume_args(plan, mesh, keys))
        run, init_seconds = _init_learner(plan, mesh, keys)
        run, start = _resume(session, plan, mesh, run)
        run_info = _run_info(plan, mesh, start)
        if start.updates >= plan.num_updates:
            return _already_done(plan, session, run, start, run_info, init_seconds)
        compiled = _compile(plan, mesh, run)
        session.start_checkpointer()
        compile_seconds = init_seconds + compiled.seconds
        records = _open_records(session, plan, start, run_info)
        if plan.is_main:
            _print_banner(plan, session, start, run_info, compile_seconds)
        wiring = _wiring(plan, compiled, run, start)
        preemption = Preemption()
        learner = _make_learner(
            plan, mesh, compiled, wiring, session, start, log=_log_to(records, log_fn),
            evaluate=threads.evaluator(), should_stop=preemption.requested,
            wall_offset=compile_seconds + start.wall_time)
        watched = threads.run(learner, run, compiled, wiring, keys.actor, start, preemption)
    finally:
        stuck = threads.join()
        session.close(checkpoints=not stuck)
    outcome = threads.learner_outcome(watched, stuck)
    return _finish_run(plan, session, records, watched, outcome, run_info, start,
                       compile_seconds)


@dataclasses.dataclass(frozen=True)
class _Keys:
    """The run's root keys, split from its seed: the learner state's parameters, the learner
    devices' keys, and the actors' (folded with the process and the thread)."""

    params: jax.Array
    learner: jax.Array
    actor: jax.Array

    @classmethod
    def from_seed(cls, seed: int) -> _Keys:
        params, learner, actor = jax.random.split(jax.random.PRNGKey(seed), 3)
        return cls(params=params, learner=learner, actor=actor)


@dataclasses.dataclass(frozen=True)
class _Start:
    """Where the learner starts: from scratch, or from a checkpoint."""

    updates: int = 0  # updates already done
    wall_time: float = 0.0  # the wall time recorded with them
    resumed_from: int | None = None  # the checkpoint's update, when resumed

    @property
    def entropy(self) -> tuple[int, ...]:
        """What a resumed run folds into its environments' seeds and actors' keys, so that
        they start afresh (nothing for a fresh run)."""
        return (self.updates,) if self.resumed_from is not None else ()


@dataclasses.dataclass(frozen=True)
class _Compiled:
    """The learner's compiled update and the actors' jitted functions."""

    update_fn: Callable  # (state, keys, batch) -> (state, keys, metrics), on the learner mesh
    local_actor_params: Callable  # `make_local_actor_params(agent)`
    act: Callable
    pack: Callable
    seconds: float  # spent compiling


@dataclasses.dataclass(frozen=True)
class _Watched:
    """What the main thread saw by the time it stopped watching the threads."""

    learner: Future  # of the `LearnerOutcome`: set when the learner thread returns
    run_start: float  # perf_counter when the threads started
    signal_received: int | None  # SIGTERM or SIGINT, in this process
    actor_params: list[tuple[int, Any]]  # (version, params) newest on each actor device


def _learner_mesh(plan: SebulbaPlan) -> jax.sharding.Mesh:
    """The mesh of the learner devices of every process (gradients are averaged over all)."""
    mesh = replication.make_mesh(list(plan.learner_devices))
    assert replication.local_devices(mesh) == list(plan.local_learner_devices)
    return mesh


def _resume_args(plan: SebulbaPlan, mesh: jax.sharding.Mesh, keys: _Keys) -> dict[str, Any]:
    """What decides whether this run may resume a checkpoint, from metadata alone: a refused run
    fails before anything compiles and changes nothing in the workdir."""
    return {"config": plan.config, "resumable": RESUMABLE_CHANGES,
            "layout": state_layout(abstract_learner(plan.agent, plan.env.spec, mesh,
                                                    keys.params, keys.learner)),
            "run_shape": {"num_processes": plan.num_processes,
                          "num_learner_devices": int(mesh.devices.size)},
            "introduced": workdir_lib.introduced_fields(agents.introduced(plan.agent_name))}


def _init_learner(plan: SebulbaPlan, mesh: jax.sharding.Mesh,
                  keys: _Keys) -> tuple[LearnerRun, float]:
    """The fresh learner state and keys, and the seconds they took (counted as compilation)."""
    started = time.perf_counter()
    state, learner_keys = init_learner(plan.agent, plan.env.spec, mesh, keys.params,
                                       keys.learner)
    return LearnerRun(state, learner_keys), time.perf_counter() - started


def _resume(session: RunSession, plan: SebulbaPlan, mesh: jax.sharding.Mesh,
            run: LearnerRun) -> tuple[LearnerRun, _Start]:
    """Restores the checkpoint found before (or, if it proves damaged, an older one); `run` and
    a fresh start when there is none."""
    restored = session.restore({"learner_state": run.learner_state,
                                "learner_keys": run.learner_keys},
                               checkpoint_keep=plan.checkpoint_keep)
    if restored is None:
        return run, _Start()
    state = restored.state["learner_state"]
    if plan.agent.set_hparams is not None and session.changes_hparams(plan.agent.sweepable):
        # Continuing with changed values (`resume_allow_changes`) that the restored state
        # holds as the checkpoint's.
        state = set_learner_hparams(plan.agent, mesh, state, plan.agent_hparams)
    updates = int(restored.metadata["updates"])
    return (LearnerRun(state, restored.state["learner_keys"]),
            _Start(updates=updates, wall_time=float(restored.metadata["wall_time"]),
                   resumed_from=updates))


def _compile(plan: SebulbaPlan, mesh: jax.sharding.Mesh, run: LearnerRun) -> _Compiled:
    """The learner's update, compiled before any thread starts, and the actors' functions."""
    started = time.perf_counter()
    num_shards = len(plan.local_learner_devices)
    act, pack = make_actor_functions(plan.agent, num_shards,
                                     host_env.agent_layout(plan.env.kind))
    example_batch = abstract_batch(plan.agent, plan.env.spec, mesh,
                                   rollout_length=plan.rollout_length,
                                   shard_batch=plan.envs_per_thread // num_shards,
                                   num_rollouts=plan.num_actor_threads)
    update_fn = replication.replicate(make_update(plan.agent), mesh, donate_argnums=(0, 1))
    update_fn = update_fn.lower(run.learner_state, run.learner_keys, example_batch).compile()
    local_actor_params = make_local_actor_params(plan.agent)
    return _Compiled(update_fn=update_fn, local_actor_params=local_actor_params, act=act,
                     pack=pack, seconds=time.perf_counter() - started)


def _run_info(plan: SebulbaPlan, mesh: jax.sharding.Mesh, start: _Start) -> dict[str, Any]:
    """What was run (run_info.json, `TrainResult.run_info`)."""
    env = plan.env
    return {
        "architecture": "sebulba",
        "environment": host_env.run_description(env.kind, env.name, env.protocol, env.options,
                                                env.stepping),
        "evaluation_environment": host_env.run_description(env.kind, env.name, env.protocol,
                                                           env.eval_options, env.stepping),
        "agent": plan.agent_name,
        "parameters": parameter_count(plan.agent, env.spec),
        "platform": jax.local_devices()[0].platform,
        "num_processes": plan.num_processes,
        "actor_devices": [str(d) for d in plan.actor_devices],
        "learner_devices": [str(d) for d in mesh.devices.flat],
        "actor_threads": plan.num_actor_threads,
        "learner_batch": [plan.rollout_length, plan.steps_per_update // plan.rollout_length],
        "num_updates": plan.num_updates,
        "machine": {**dataclasses.asdict(plan.machine), "cpu": machine.cpu_model()},
        "derived_sizes": list(plan.sizes.derived),
        "jax_version": jax.__version__,
        "config": plan.config,
        "resumed_from_updates": start.resumed_from,
    }


def _open_records(session: RunSession, plan: SebulbaPlan, start: _Start,
                  run_info: dict[str, Any]) -> workdir_lib.Records:
    """The run's records (process 0; a resumed run drops what its predecessor logged after the
    checkpoint), and run_info.json."""
    resumed = start.resumed_from is not None
    records = session.open_records(
        [session.workdir], config=plan.config, enabled=plan.is_main,
        resumed_from=start.resumed_from, total_env_steps=plan.total_env_steps,
        resume_env_steps=start.updates * plan.steps_per_update if resumed else None)
    if plan.is_main and session.workdir:
        with open(os.path.join(session.workdir, "run_info.json"), "w") as f:
            json.dump(run_info, f, indent=2, default=str)
    return records


def _print_banner(plan: SebulbaPlan, session: RunSession, start: _Start,
                  run_info: dict[str, Any], compile_seconds: float) -> None:
    env = plan.env
    lag = f" (lag {plan.policy_lag})" if plan.fixed else ""
    print(f"Sebulba: {plan.agent_name} on {env.task} ({_env_banner(run_info['environment'])}); "
          f"{plan.num_processes} process(es); "
          f"actors {run_info['actor_devices']} x {plan.topology.actor_threads_per_device} "
          f"thread(s) x {plan.envs_per_thread} envs; learners {run_info['learner_devices']}; "
          f"T={plan.rollout_length}, {plan.num_updates} updates, staleness={plan.staleness}"
          f"{lag}; acting with {run_info['parameters']:,} parameters; compiled in "
          f"{compile_seconds:.1f}s", flush=True)
    print(_sizes_banner(plan), flush=True)
    if start.resumed_from is not None:
        session.print_resume(start.resumed_from,
                             f"{start.resumed_from} of {plan.num_updates} updates done",
                             "; the environments start afresh")


def _sizes_banner(plan: SebulbaPlan) -> str:
    """The sizes the run uses, and which of them were derived from which machine."""
    sizes = plan.sizes
    listed = ", ".join(f"{field}={value}" for field, value in
                       {**sizes.fields(), "env.batches": plan.env_batches}.items())
    derived = (f"derived from the machine ({plan.machine.describe()}): "
               f"{', '.join(sizes.derived)}" if sizes.derived else "none derived")
    pool = machine.describe_cpu_pool() if jax.devices()[0].platform == "cpu" else ""
    return f"Sebulba sizes: {listed}; {derived}{'; ' + pool if pool else ''}"


def _env_banner(description: dict[str, Any]) -> str:
    """The environment's kind and version, for the banner."""
    kind = description["kind"]
    if kind == "envpool":
        return f"protocol {description['protocol']}, envpool {description['envpool_version']}"
    if kind == "gymnasium":
        workers = description["num_workers"]
        return (f"gymnasium {description['gymnasium_version']}, "
                f"{f'{workers} worker process(es)' if workers else 'in the actor thread'}, "
                f"autoreset {description['autoreset_mode']}")
    return f"envs_jax on {description['device']}"


def _wiring(plan: SebulbaPlan, compiled: _Compiled, run: LearnerRun, start: _Start) -> Wiring:
    """The queues, parameter store, counters and clocks the threads share. The store holds
    version `start.updates` (0, or the checkpoint's): what the first rollouts act with."""
    store = ParamsStore(list(plan.actor_devices),
                        keep=versions_to_keep(plan.staleness, plan.policy_lag))
    store.publish(start.updates, compiled.local_actor_params(run.learner_state))
    return Wiring(queues=[queue.Queue(maxsize=plan.queue_size)
                          for _ in range(plan.num_actor_threads)],
                  store=store, counters=ActorCounters(),
                  learner_clock=ProgressClock(),  # ticks after every update
                  actor_clock=ProgressClock())  # ticks after every step of any actor thread


def _log_to(records: workdir_lib.Records,
            log_fn: Callable[[dict], None] | None) -> Callable[[dict], None]:
    def log(record: dict) -> None:
        record = records.write(0, record)
        if log_fn is not None:
            log_fn(record)

    return log


def _make_learner(plan: SebulbaPlan, mesh: jax.sharding.Mesh, compiled: _Compiled,
                  wiring: Wiring, session: RunSession, start: _Start, *,
                  log: Callable[[dict], None], evaluate: Callable | None,
                  should_stop: Callable[[], bool], wall_offset: float) -> Learner:
    schedule = LearnerSchedule(
        num_updates=plan.num_updates, steps_per_update=plan.steps_per_update,
        timeout_s=plan.timeout_s, seed=plan.seed, start_update=start.updates,
        log_every=plan.log_every, eval_every=plan.eval_every,
        checkpoint_every=plan.checkpoint_every,
        stop_check_every=1 if plan.num_processes == 1 else PREEMPTION_CHECK_EVERY,
        frame_skip=plan.frame_skip)
    return Learner(
        update_fn=compiled.update_fn, local_actor_params=compiled.local_actor_params,
        mesh=mesh, schedule=schedule, wiring=wiring, log=log, evaluate=evaluate,
        checkpointer=session.checkpointer,
        checkpoint_metadata={"num_processes": plan.num_processes,
                             "num_learner_devices": int(mesh.devices.size),
                             "config": plan.config},
        should_stop=should_stop, saved_update=start.resumed_from, wall_offset=wall_offset)


def _already_done(plan: SebulbaPlan, session: RunSession, run: LearnerRun, start: _Start,
                  run_info: dict[str, Any], init_seconds: float) -> TrainResult:
    """The result of rerunning a run whose checkpoint is at or past its end: the restored
    state and the log, with nothing compiled, started or written."""
    history = []
    if plan.is_main:
        history = [r for r in metrics_lib.read_records(session.workdir)
                   if r.get("updates", 0) <= start.updates]
        print(f"Sebulba: nothing to do: the checkpoint at update {start.updates:,} in "
              f"{session.checkpoint_dir} is at or past the run's end ({plan.num_updates:,} "
              f"updates of {plan.agent_name} on {plan.env.task}).", flush=True)
    return TrainResult(state=run, final_metrics=history[-1] if history else {},
                       history=history, run_info=run_info, compile_seconds=init_seconds,
                       run_seconds=0.0, resumed_from_updates=start.resumed_from)


def _finish_run(plan: SebulbaPlan, session: RunSession, records: workdir_lib.Records,
                watched: _Watched, learner: LearnerOutcome, run_info: dict[str, Any],
                start: _Start, compile_seconds: float) -> TrainResult:
    """The end-of-run summary (process 0), the final parameters if asked for, and the
    result."""
    run_seconds = time.perf_counter() - watched.run_start
    checkpoint_seconds = learner.checkpoint_seconds + session.checkpoint_close_seconds
    history = records.histories[0]
    final = history[-1] if history else {}
    if plan.is_main:
        print_end_of_run(
            history, interrupted=learner.interrupted, signal_received=watched.signal_received,
            checkpoint_directory=session.checkpoint_dir, saved_update=learner.saved_update,
            run_seconds=run_seconds, compile_seconds=compile_seconds,
            checkpoint_seconds=checkpoint_seconds, eval_seconds=learner.eval_seconds)
    result = TrainResult(
        state=LearnerRun(learner.state, learner.keys), final_metrics=final, history=history,
        compile_seconds=compile_seconds, run_seconds=run_seconds,
        interrupted=learner.interrupted, resumed_from_updates=start.resumed_from,
        signal_received=watched.signal_received if learner.interrupted else None,
        checkpoint_seconds=checkpoint_seconds, eval_seconds=learner.eval_seconds,
        policy_lags=learner.policy_lags,
        actor_params=watched.actor_params,
        last_batch=learner.last_batch, run_info=run_info)
    if session.workdir and plan.save_final_params and not learner.interrupted:
        save_params(result.params, os.path.join(
            session.workdir, f"final_params.process{plan.process_index}.npz"))
    return result


def _env_seed(*entropy: int) -> int:
    """An environment seed (a non-negative int32) from a tuple of integers."""
    return int(np.random.SeedSequence(list(entropy)).generate_state(1)[0] % (2**31 - 1))


def save_params(params: Any, path: str) -> None:
    """Writes a params pytree as an .npz keyed by each leaf's path."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    np.savez(path, **{jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves})


# ---------------------------------------------------------------------------------------------
# THE THREADS


class _Threads:
    """This process's threads (its actor threads and the learner's) under one supervisor, and
    the environments they own: started, watched from the main thread, and joined."""

    def __init__(self, plan: SebulbaPlan):
        self._plan = plan
        self._supervisor = Supervisor()
        self._envs: list[host_env.HostEnv] = []  # closed by `join`

    def _env(self, num_envs: int, seed: int, options: dict[str, Any]) -> host_env.HostEnv:
        env = host_env.make(self._plan.env.kind, self._plan.env.name, num_envs, seed=seed,
                            options=options, stepping=self._plan.env.stepping)
        self._envs.append(env)
        return env

    def evaluator(self) -> Callable[[Any, jax.Array], dict] | None:
        """Process 0's greedy evaluation, on environments of its own, created once and seeded
        apart from the training ones; None when the run does not evaluate (or elsewhere)."""
        plan = self._plan
        if plan.eval_every == 0 or not plan.is_main:
            return None
        env = self._env(plan.eval_episodes, _env_seed(plan.seed, EVAL_STREAM),
                        plan.env.eval_options)
        return make_evaluator(plan.agent, env, plan.actor_devices[0],
                              max_steps=plan.eval_max_steps,
                              to_agent_layout=host_env.agent_layout(plan.env.kind))

    def run(self, learner: Learner, run: LearnerRun, compiled: _Compiled, wiring: Wiring,
            actor_key: jax.Array, start: _Start, preemption: Preemption) -> _Watched:
        """Starts the actor threads and the learner's (which returns its `LearnerOutcome` into a
        future), then watches until the learner is done or a thread fails. The main thread
        only watches, so that Ctrl-C and SIGTERM's handler (`preemption`) land here."""
        run_start = time.perf_counter()
        stop = self._supervisor.stop
        outcome: Future = Future()
        finished = threading.Event()

        def learn() -> None:
            try:
                outcome.set_result(
                    learner.run(stop, run.learner_state, run.learner_keys, run_start))
            finally:
                finished.set()

        with preemption:
            self._start_actors(compiled, wiring, actor_key, start)
            self._supervisor.start(f"learner-{self._plan.process_index}", learn)
            # Flags read without taking a lock, and a plain sleep: a KeyboardInterrupt landing
            # here can never leave a lock held that the other threads need to stop.
            while not finished.is_set() and not stop.is_set():
                time.sleep(0.05)
        return _Watched(learner=outcome, run_start=run_start,
                        signal_received=preemption.received,
                        actor_params=[wiring.store.newest(i)
                                      for i in range(len(wiring.store.devices))])

    def _start_actors(self, compiled: _Compiled, wiring: Wiring, actor_key: jax.Array,
                      start: _Start) -> None:
        """One actor thread per (actor device, thread), each on host-environment batches of
        its own (`config.env.batches`; the first seeded as a thread with one batch is).
        A resumed run's environments and actor keys start afresh, seeded by its update."""
        plan = self._plan
        process, per_device = plan.process_index, plan.topology.actor_threads_per_device
        for device_index in range(len(plan.actor_devices)):
            for j in range(per_device):
                thread_id = device_index * per_device + j
                batch = plan.envs_per_thread // plan.env_batches
                env = [self._env(batch, _env_seed(plan.seed, process, thread_id,
                                                  *start.entropy, *((i,) if i else ())),
                                 plan.env.options) for i in range(plan.env_batches)]
                key = jax.random.fold_in(jax.random.fold_in(actor_key, process), thread_id)
                for entropy in start.entropy:
                    key = jax.random.fold_in(key, entropy)
                actor = Actor(
                    agent=plan.agent, env=env, act=compiled.act, pack=compiled.pack,
                    store=wiring.store, device_index=device_index,
                    learner_devices=list(plan.local_learner_devices),
                    out=wiring.queues[thread_id], key=key, rollout_length=plan.rollout_length,
                    policy_lag=plan.policy_lag if plan.fixed else None,
                    timeout_s=plan.timeout_s, start_update=start.updates,
                    name=f"actor thread {thread_id}", counters=wiring.counters,
                    learner_clock=wiring.learner_clock, actor_clock=wiring.actor_clock)
                self._supervisor.start(f"actor-{process}.{device_index}.{j}",
                                      functools.partial(actor.run, self._supervisor.stop))

    def join(self) -> list[str]:
        """Stops and joins every thread, then closes the environments unless a thread is still
        running (it may be inside `env.step`); returns the names of those still running."""
        stuck = self._supervisor.join()
        if not stuck:
            for env in self._envs:
                env.close()
            self._envs.clear()
        return stuck

    def learner_outcome(self, watched: _Watched, stuck: list[str]) -> LearnerOutcome:
        """What the learner returned, once the threads are joined; raises the first thread's
        failure instead, or `StallError` if the learner did not finish and would not stop."""
        self._supervisor.raise_first_error()
        finished = watched.learner.done() and watched.learner.result().completed
        if stuck and not finished:
            raise StallError(f"threads did not stop within {JOIN_S:.0f}s: {stuck}")
        return watched.learner.result(timeout=0)
