"""The Anakin runner (Hessel et al., 2021, section 3): acting, environment stepping and
learning in one XLA program per device.

The compiled core (the rollout, the `init` and `chunk` programs, greedy evaluation) lives in
`anakin.programs` (its docstring shows the per-device program); this module is the host
loop around it.

The per-device program is replicated over every device (of every process) by
`podracer.replication.replicate`. A thin host loop calls the compiled chunk repeatedly, logs
(metrics.jsonl, TensorBoard, progress), evaluates the greedy policy on separate environments,
and checkpoints; compile time is measured separately from run time.

The host loop is pipelined, one chunk deep, so that the devices never wait for the host:

    dispatch chunk 0, then its evaluation and checkpoint copy, if due
    for k = 0, 1, ...:
        dispatch chunk k + 1
        fetch chunk k's metrics (and evaluation) -> log; raise if not finite
        hand chunk k's checkpoint copy to the (asynchronous) checkpointer
        dispatch chunk k + 1's evaluation and checkpoint copy, if due
        on SIGTERM: finish chunk k + 1 the same way, checkpoint it, stop

What is due on chunk k's result (its evaluation, a copy of its state for a checkpoint) is
dispatched before chunk k + 1, which donates that state; an evaluation therefore delays
training by its own compute only. The host sees chunk k's metrics while chunk k + 1 runs: a
NaN in chunk k is reported (and chunk k + 1's work dropped) before chunk k reaches a
checkpoint, exactly as without the pipeline, and a SIGTERM stops the run one chunk later than
an unpipelined loop would (after the chunk in flight when the signal is seen), so the
platform's grace period must cover two chunks.

Sweeps: `config.sweep` lists R independent runs (seeds, and scalar agent hyperparameters that
the agent keeps in its learner state). The per-device programs are then `vmap`ped over a run
axis, so all R runs advance inside the same compiled call, each logged in `<workdir>/run_<i>`.

Checkpoints (with a workdir): the whole stacked `RunnerState` (parameters, optimiser state,
environment states, RNG keys) plus the host's counters, every `checkpoint_every_updates`, at
the end and on SIGTERM, in `<workdir>/checkpoints`. Starting again with the same workdir
resumes from the newest good one; the resumed run ends bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import agents
import envs_jax
from anakin.config import Run
from anakin.plan import RunPlan, make_plan
from anakin.programs import (
    FIRST_NONFINITE,
    RunnerState,
    make_evaluator,
    make_programs,
)
from podracer import config as cfg
from podracer import distributed, faults, machine, replication
from podracer import metrics as metrics_lib
from podracer import workdir as workdir_lib
from podracer.agent import Agent, parameter_count
from podracer.checkpoint import Preemption, Snapshot, snapshot, state_layout
from podracer.session import RunSession, TrainResult, eval_key, print_end_of_run

# Fields that may change between an interrupted run and its resumption (shared with Sebulba).
RESUMABLE_CHANGES = workdir_lib.RESUMABLE_CHANGES


# ---------------------------------------------------------------------------------------------
# THE RUN


def train(config: ml_collections.ConfigDict, workdir: str | None = None, *,
          log_fn: Callable[[dict], None] | None = None) -> TrainResult:
    """Runs an Anakin experiment to `config.total_env_steps` and returns its final state.

    Joins a `jax.distributed` run first if launched as one (see `podracer.distributed`): the
    program is then replicated over the devices of every process, gradients are averaged
    across all of them, and only process 0 writes records. Without a workdir it only prints
    progress. With one: metrics.jsonl and TensorBoard event files (per run, in `run_<i>/`, for
    a sweep), config.json/config.yaml, and checkpoints in `<workdir>/checkpoints`, from which
    a later call with the same workdir resumes (see `podracer.workdir`: a workdir holding a
    checkpoint of a different run is refused before anything compiles, and left untouched).
    The workdir is locked while the run lives (`podracer.session`): a second run on it is
    refused before compiling, naming this one. SIGTERM or Ctrl-C stops the run after the chunk
    in flight when it is seen (at most two chunks), with a checkpoint saved, and returns a
    result with `interrupted=True`. A NaN or inf loss or parameter raises
    `podracer.faults.NonFiniteError` naming the update, before it could be checkpointed.
    `log_fn` gets every record (a sweep's carry their `run` index).
    """
    distributed.initialize_from_env()
    machine.set_cpu_worker_threads(cfg.cpu_worker_threads(config))
    plan = make_plan(config, jax.device_count())
    session = RunSession.open(workdir)
    try:
        started = time.perf_counter()
        programs = _programs(plan)
        init_args = _init_args(plan, programs)
        session.find_resume_point(
            config=plan.config, resumable=RESUMABLE_CHANGES,
            layout=state_layout(jax.eval_shape(programs.init_fn, *init_args)),
            run_shape={"num_devices": plan.num_devices, "num_runs": plan.num_runs},
            introduced=workdir_lib.introduced_fields(agents.introduced(plan.agent_name)))
        state = programs.init_fn(*init_args)
        restore_started = time.perf_counter()
        state, start = _resume(session, plan, programs, state, init_args[2])
        restore_seconds = time.perf_counter() - restore_started
        # A run whose checkpoint holds every chunk has nothing left to compute: its chunk is
        # not compiled (minutes for a large agent) only to find that out.
        chunk_fn = (_compile(programs, plan, state,
                             checkpoints=session.checkpoint_dir is not None)
                    if start.chunks < plan.num_chunks else None)
        session.start_checkpointer()
        compile_seconds = time.perf_counter() - started - restore_seconds
        records = _open_records(session, plan, start)
        run_info = _run_info(plan, programs, start)
        if plan.is_main:
            _write_run_info(session, run_info)
            _print_banner(plan, session, start, compile_seconds)
        loop = _HostLoop(plan, programs, chunk_fn, session, records, log_fn,
                         time_offset=compile_seconds + start.wall_time)
        state, outcome = loop.run(state, start)
    finally:
        session.close()
    return _finish_run(plan, session, records, state, outcome, start, compile_seconds,
                       run_info)


@dataclasses.dataclass(frozen=True)
class _Start:
    """Where the host loop starts: from scratch, or from a checkpoint."""

    chunks: int = 0  # chunks already done
    wall_time: float = 0.0  # the wall time recorded with them
    resumed_from: int | None = None  # the checkpoint's update, when resumed


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """What the host loop did."""

    run_start: float  # perf_counter when it started
    interrupted: bool  # stopped by SIGTERM
    signal_received: int | None
    saved_chunks: int | None  # chunks in the newest checkpoint written
    checkpoint_seconds: float
    eval_seconds: float


def _init_args(plan: RunPlan, programs: _Programs) -> list[Any]:
    """The init program's inputs, global arrays: environment and parameter keys, and the
    agent's hyperparameters (per run, for a sweep). Every process derives the same global keys
    and places its own devices' slices."""
    env_keys, params_keys = _initial_keys(plan.seeds, plan.num_devices, plan.sweep)
    hparams = {}
    for name in programs.hparam_names:
        values = [r.hparams.get(name, plan.config["agent"][name]) for r in plan.runs]
        shape = (plan.num_devices, plan.num_runs) if plan.sweep else (plan.num_devices,)
        hparams[name] = np.broadcast_to(
            np.asarray(values if plan.sweep else values[0], np.float32), shape)
    return [replication.from_global(env_keys, programs.mesh),
            replication.from_global(params_keys, programs.mesh),
            replication.from_global(hparams, programs.mesh)]


def _compile(programs: _Programs, plan: RunPlan, state: RunnerState, *,
             checkpoints: bool) -> Callable:
    """The chunk, compiled for `state`; and, so that the first of them does not hold the loop,
    the checkpoints' copy program and the evaluator."""
    if programs.chunk_fn is None:
        programs.chunk_fn = programs.chunk.lower(state).compile()
    if checkpoints:
        jax.block_until_ready(snapshot(state).state)
    if plan.eval_every > 0:
        params = programs.eval_params(state.learner_state)
        keys = np.zeros((plan.num_runs, 2) if plan.sweep else (2,), np.uint32)
        programs.evaluator(plan.eval_episodes, plan.eval_max_steps, params, keys)
    return programs.chunk_fn


def _resume(session: RunSession, plan: RunPlan, programs: _Programs, state: RunnerState,
            hparams: Any) -> tuple[RunnerState, _Start]:
    """Restores the checkpoint found before compiling (or, if it proves damaged, an older one);
    `state` and a fresh start when there is none."""
    restored = session.restore(state, checkpoint_keep=plan.checkpoint_keep)
    if restored is None:
        return state, _Start()
    state = restored.state
    if programs.hparam_names and session.changes_hparams(programs.hparam_names):
        # Continuing with changed values (`resume_allow_changes`): the restored state holds the
        # checkpoint's.
        state = programs.set_hparams_fn(state, hparams)
    chunks = int(restored.metadata["chunks"])
    return state, _Start(chunks=chunks, wall_time=float(restored.metadata["wall_time"]),
                         resumed_from=chunks * plan.updates_per_chunk)


def _open_records(session: RunSession, plan: RunPlan, start: _Start) -> workdir_lib.Records:
    """The records of every run: `<workdir>/` for a single run, `<workdir>/run_<i>/` for a
    sweep's."""
    run_dirs: list[str | None] = [None] * plan.num_runs
    if session.workdir is not None:
        run_dirs = ([f"{session.workdir}/run_{i}" for i in range(plan.num_runs)] if plan.sweep
                    else [session.workdir])
    resumed = start.resumed_from is not None
    return session.open_records(
        run_dirs, config=plan.config,
        run_configs=[_run_config(plan.config, r) for r in plan.runs] if plan.sweep else None,
        enabled=plan.is_main, resumed_from=start.resumed_from,
        total_env_steps=plan.total_env_steps,
        resume_env_steps=start.chunks * plan.steps_per_chunk if resumed else None,
        progress=not plan.sweep)


def _run_info(plan: RunPlan, programs: _Programs, start: _Start) -> dict[str, Any]:
    """What was run (run_info.json, `TrainResult.run_info`): the environment and the library
    behind it with its version, the agent, the devices and machine, the sizes and the config."""
    host = machine.detect()
    return {
        "architecture": "anakin",
        "environment": {**envs_jax.describe(plan.env_name),
                        "kwargs": dict(plan.config["env"].get("kwargs") or {})},
        "agent": plan.agent_name,
        "parameters": parameter_count(plan.agent, plan.env.spec()),
        "platform": jax.devices()[0].platform,
        "num_processes": jax.process_count(),
        "devices": [str(d) for d in programs.mesh.devices.flat],
        "num_envs": plan.num_envs,
        "rollout_length": plan.rollout_length,
        "updates_per_chunk": plan.updates_per_chunk,
        "num_chunks": plan.num_chunks,
        "num_runs": plan.num_runs,
        "machine": {**dataclasses.asdict(host), "cpu": machine.cpu_model()},
        "derived_sizes": ["num_envs"] if plan.machine is not None else [],
        "jax_version": jax.__version__,
        "config": plan.config,
        "resumed_from_updates": start.resumed_from,
    }


def _write_run_info(session: RunSession, run_info: dict[str, Any]) -> None:
    if session.workdir is not None:
        with open(f"{session.workdir}/run_info.json", "w") as f:
            json.dump(run_info, f, indent=2, default=str)


def _derived(plan: RunPlan) -> str:
    """' (derived from the machine: ...)' where num_envs was left to it."""
    if plan.machine is None:
        return ""
    return f" (derived from the machine: {plan.machine.describe()})"


def _print_banner(plan: RunPlan, session: RunSession, start: _Start,
                  compile_seconds: float) -> None:
    processes = f" in {jax.process_count()} processes" if jax.process_count() > 1 else ""
    platform = jax.devices()[0].platform
    pool = machine.describe_cpu_pool() if platform == "cpu" else ""
    print(f"Anakin: {plan.agent_name} on {plan.env_name}, {plan.describe()}, "
          f"{plan.num_devices} device(s){processes} ({platform}{', ' + pool if pool else ''}), "
          f"{plan.num_envs} envs{_derived(plan)}, T={plan.rollout_length}, "
          f"{plan.updates_per_chunk} "
          f"updates/chunk, {plan.num_chunks} chunks; acting with "
          f"{parameter_count(plan.agent, plan.env.spec()):,} parameters; compiled in "
          f"{compile_seconds:.1f}s", flush=True)
    if start.resumed_from is not None:
        session.print_resume(start.resumed_from,
                             f"{start.chunks} of {plan.num_chunks} chunks done")


def _finish_run(plan: RunPlan, session: RunSession, records: workdir_lib.Records,
                state: RunnerState, outcome: _Outcome, start: _Start,
                compile_seconds: float, run_info: dict[str, Any]) -> TrainResult:
    """The end-of-run summary (process 0) and the result."""
    run_seconds = time.perf_counter() - outcome.run_start
    checkpoint_seconds = outcome.checkpoint_seconds + session.checkpoint_close_seconds
    histories = records.histories
    history = ([_mean_record(list(rs)) for rs in zip(*histories)] if plan.sweep
               else histories[0])
    final = history[-1] if history else {}
    if plan.is_main:
        print_end_of_run(
            history, interrupted=outcome.interrupted, signal_received=outcome.signal_received,
            checkpoint_directory=session.checkpoint_dir,
            saved_update=(None if outcome.saved_chunks is None
                          else outcome.saved_chunks * plan.updates_per_chunk),
            run_seconds=run_seconds, compile_seconds=compile_seconds,
            checkpoint_seconds=checkpoint_seconds, eval_seconds=outcome.eval_seconds)
    return TrainResult(state=state, final_metrics=final, history=history,
                       compile_seconds=compile_seconds, run_seconds=run_seconds,
                       run_histories=histories, interrupted=outcome.interrupted,
                       signal_received=outcome.signal_received if outcome.interrupted else None,
                       resumed_from_updates=start.resumed_from,
                       checkpoint_seconds=checkpoint_seconds, eval_seconds=outcome.eval_seconds,
                       run_info=run_info)


# ---------------------------------------------------------------------------------------------
# THE HOST LOOP


@dataclasses.dataclass
class _InFlight:
    """A dispatched chunk and what was dispatched on its result, none of it fetched yet."""

    chunk: int  # 0-based index of the chunk
    metrics: Any  # the chunk's metrics, on the devices
    eval_out: Any | None  # its evaluation's results, on the device, when one was due
    snapshot: Snapshot | None  # a copy of the state after it, when a checkpoint was due


class _HostLoop:
    """The pipelined loop of the module docstring, from a start to the last chunk or SIGTERM."""

    def __init__(self, plan: RunPlan, programs: _Programs, chunk_fn: Callable | None,
                 session: RunSession, records: workdir_lib.Records,
                 log_fn: Callable[[dict], None] | None, *, time_offset: float):
        self.plan = plan
        self.programs = programs
        self.chunk_fn = chunk_fn  # None when the start is the last chunk: nothing to run
        self.checkpointer = session.checkpointer
        self.records = records
        self.log_fn = log_fn
        self.time_offset = time_offset  # compile time + the checkpoint's wall time
        self.checkpoint_seconds = 0.0
        self.eval_seconds = 0.0
        self.run_start = self.last_fetch = 0.0

    def run(self, state: RunnerState, start: _Start) -> tuple[RunnerState, _Outcome]:
        plan = self.plan
        progress = None
        if plan.sweep and plan.is_main:
            progress = metrics_lib.Progress(plan.total_env_steps,
                                            start_env_steps=start.chunks * plan.steps_per_chunk,
                                            runs=plan.num_runs)
        saved = start.chunks if start.resumed_from is not None else None
        interrupted = False
        self.run_start = self.last_fetch = time.perf_counter()
        try:
            with Preemption() as preemption:
                # PIPELINE: chunk i + 1 is dispatched before chunk i's metrics are fetched, so
                # the devices never wait for the host's logging, evaluation fetch or checkpoint
                # hand-off. A checkpoint is written only after its chunk's metrics proved finite.
                # What is due on chunk i + 1's result (evaluation, checkpoint copy) is
                # dispatched after chunk i's record, before chunk i + 2 donates the state:
                # dispatching it can wait for chunk i + 1 (XLA:CPU does), and that wait
                # belongs to chunk i + 1's record, not to chunk i's.
                pending = None
                if start.chunks < plan.num_chunks:
                    state, pending = self._dispatch(start.chunks, state)
                    pending = self._dispatch_due(pending, state)
                while pending is not None:
                    following = None
                    if pending.chunk + 1 < plan.num_chunks:
                        state, following = self._dispatch(pending.chunk + 1, state)
                    saved = self._finish(pending, progress) or saved
                    if following is not None:
                        following = self._dispatch_due(following, state)
                    # Polled after the save: in a multi-process run the poll is a collective,
                    # which waits for the chunk in flight; the save's hand-off overlaps it.
                    if preemption.requested():
                        saved = self._stop(following, state, progress) or saved
                        interrupted = True
                        break
                    pending = following
        finally:
            if progress is not None:
                progress.close()
        return state, _Outcome(run_start=self.run_start, interrupted=interrupted,
                               signal_received=preemption.received, saved_chunks=saved,
                               checkpoint_seconds=self.checkpoint_seconds,
                               eval_seconds=self.eval_seconds)

    def _dispatch(self, i: int, state: RunnerState) -> tuple[RunnerState, _InFlight]:
        """Dispatches chunk i (not waited for here)."""
        state, metrics = self.chunk_fn(state)
        return state, _InFlight(chunk=i, metrics=metrics, eval_out=None, snapshot=None)

    def _dispatch_due(self, job: _InFlight, state: RunnerState) -> _InFlight:
        """`job` with what is due on its chunk's result `state`, dispatched before the next
        chunk donates it: the evaluation and a copy for the checkpoint."""
        plan, i = self.plan, job.chunk
        updates = (i + 1) * plan.updates_per_chunk
        if _crossed(updates, plan.updates_per_chunk, plan.eval_every):
            job = dataclasses.replace(job, eval_out=self._dispatch_eval(state, updates))
        if self.checkpointer is not None and (
                i + 1 == plan.num_chunks
                or _crossed(updates, plan.updates_per_chunk, plan.checkpoint_every)):
            job = dataclasses.replace(job, snapshot=snapshot(state))
        return job

    def _dispatch_eval(self, state: RunnerState, updates: int) -> Any:
        """Dispatches the greedy evaluation of `state`'s parameters (fetched with its chunk).
        Its inputs are computed on the devices, so nothing here waits for the chunk."""
        plan = self.plan
        keys = jnp.stack([eval_key(seed, updates) for seed in plan.seeds])
        params = self.programs.eval_params(state.learner_state)
        args = (params, keys if plan.sweep else keys[0])
        return self.programs.evaluator(plan.eval_episodes, plan.eval_max_steps, *args)(*args)

    def _finish(self, job: _InFlight, progress: metrics_lib.Progress | None) -> int | None:
        """Logs chunk `job.chunk` (raising if it was not finite) and hands its checkpoint copy,
        if any, to the checkpointer; returns the chunks saved, or None."""
        wall_time = self._log(job, progress)
        if job.snapshot is None:
            return None
        self._save(job.snapshot, job.chunk + 1, wall_time)
        return job.chunk + 1

    def _stop(self, following: _InFlight | None, state: RunnerState,
              progress: metrics_lib.Progress | None) -> int | None:
        """On SIGTERM: finishes, logs and saves the chunk in flight (the run stops one chunk
        after the one during which the signal came), and waits until it is on disk."""
        saved = None
        if following is not None:
            wall_time = self._log(following, progress)
            if self.checkpointer is not None:
                self._save(following.snapshot or snapshot(state), following.chunk + 1, wall_time)
                saved = following.chunk + 1
        if self.checkpointer is not None:
            started = time.perf_counter()
            self.checkpointer.wait()  # on disk before the process may exit
            self.checkpoint_seconds += time.perf_counter() - started
        return saved

    def _log(self, job: _InFlight, progress: metrics_lib.Progress | None) -> float:
        """Fetches chunk `job.chunk`'s metrics (waiting for it, not for the chunk after it),
        logs them with its evaluation, and raises if it was not finite; returns the wall time
        recorded."""
        plan = self.plan
        metrics = jax.tree.map(_first_slice_on_host, job.metrics)
        first_bad = np.atleast_1d(metrics.pop(FIRST_NONFINITE))
        now = time.perf_counter()
        wall_time = now - self.run_start + self.time_offset
        records_now = [
            _record(jax.tree.map(lambda x, r=r: x[r] if plan.sweep else x, metrics),
                    chunk=job.chunk, steps_per_chunk=plan.steps_per_chunk,
                    updates_per_chunk=plan.updates_per_chunk,
                    seconds=now - self.last_fetch, wall_time=wall_time)
            for r in range(plan.num_runs)
        ]
        self.last_fetch = now
        healthy = bool(np.all(first_bad >= plan.updates_per_chunk))
        if healthy and job.eval_out is not None:
            eval_start = time.perf_counter()
            for record, result in zip(records_now, self._fetch_eval(job.eval_out)):
                record.update(result)
            self.eval_seconds += time.perf_counter() - eval_start
        for r, record in enumerate(records_now):
            record = self.records.write(r, record)
            if self.log_fn is not None:
                self.log_fn({**record, "run": r} if plan.sweep else record)
        if progress is not None:
            progress.update(_mean_record(records_now))
        if not healthy:
            bad_run = int(np.argmin(first_bad))
            where = (f"run {bad_run} of the sweep" if plan.sweep
                     else f"seed {plan.runs[0].seed}")
            raise faults.NonFiniteError(faults.nonfinite_message(
                job.chunk * plan.updates_per_chunk + int(first_bad[bad_run]) + 1, where,
                None if self.checkpointer is None else self.checkpointer.directory))
        return wall_time

    def _fetch_eval(self, out: Any) -> list[dict[str, float]]:
        out = jax.device_get(out)
        return [{k: float(np.asarray(v)[i] if self.plan.sweep else v) for k, v in out.items()}
                for i in range(self.plan.num_runs)]

    def _save(self, taken: Snapshot, chunks: int, wall_time: float) -> None:
        plan = self.plan
        started = time.perf_counter()
        self.checkpointer.save(chunks * plan.updates_per_chunk, taken, {
            "chunks": chunks,
            "updates": chunks * plan.updates_per_chunk,
            "env_steps": chunks * plan.steps_per_chunk,
            "wall_time": wall_time,
            "num_devices": plan.num_devices,
            "num_processes": jax.process_count(),
            "num_runs": plan.num_runs,
            "seeds": plan.seeds,
            "config": plan.config,
        })
        self.checkpoint_seconds += time.perf_counter() - started


# ---------------------------------------------------------------------------------------------
# RECORDS


def _run_config(config: dict[str, Any], run: Run) -> dict[str, Any]:
    """One sweep run's resolved config: its seed and hyperparameters, no sweep."""
    plain = copy.deepcopy(config)
    plain["seed"] = run.seed
    plain["agent"].update(run.hparams)
    plain["sweep"] = {"seeds": [], "agent": {}}
    return plain


def _initial_keys(seeds: list[int], num_devices: int, sweep: bool) -> tuple[np.ndarray, ...]:
    """Per-device environment and parameter keys, `[D, 2]` (or `[D, R, 2]` for a sweep).

    A sweep's run r gets exactly the keys a single run with seed `seeds[r]` gets."""
    env_keys, params_keys = [], []
    for seed in seeds:
        env_key, params_key = jax.random.split(jax.random.PRNGKey(seed))
        env_keys.append(np.asarray(jax.random.split(env_key, num_devices)))
        params_keys.append(np.broadcast_to(np.asarray(params_key), (num_devices, 2)))
    if not sweep:
        return env_keys[0], params_keys[0]
    return np.stack(env_keys, axis=1), np.stack(params_keys, axis=1)


def _record(metrics: dict[str, Any], *, chunk: int, steps_per_chunk: int,
            updates_per_chunk: int, seconds: float, wall_time: float) -> dict[str, Any]:
    metrics = dict(metrics)
    episodes = float(metrics.pop("episodes"))
    return_sum = float(metrics.pop("episode_return_sum"))
    length_sum = float(metrics.pop("episode_length_sum"))
    return {
        "env_steps": (chunk + 1) * steps_per_chunk,
        "updates": (chunk + 1) * updates_per_chunk,
        "episode_return": return_sum / episodes if episodes else float("nan"),
        "episode_length": length_sum / episodes if episodes else float("nan"),
        "episodes": int(episodes),
        "steps_per_second": steps_per_chunk / seconds,
        "wall_time": wall_time,
        **{k: float(v) for k, v in metrics.items()},
    }


def _first_slice_on_host(x: jax.Array) -> np.ndarray:
    """This process's first device's slice of a stacked array, copied to the host without
    dispatching any computation: a computation (even a slice) dispatched now would run only
    after the chunk in flight, which the pipelined loop must not wait for."""
    return np.asarray(x.addressable_shards[0].data)[0]


def _mean_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' records averaged (counters kept; the sweep's throughput summed)."""
    mean = dict(records[0])
    for key, value in records[0].items():
        if isinstance(value, float):
            mean[key] = float(np.mean([r[key] for r in records]))
    mean["steps_per_second"] = float(sum(r["steps_per_second"] for r in records))
    return mean


def _crossed(updates: int, step: int, every: int) -> bool:
    """Whether the updates `(updates - step, updates]` include a multiple of `every`."""
    return every > 0 and updates // every > (updates - step) // every


# ---------------------------------------------------------------------------------------------
# THE COMPILED PROGRAMS, CACHED


@dataclasses.dataclass
class _Programs:
    """What `train` builds and compiles for a config, kept for the next call with one that
    differs only in what the programs take as inputs (seeds, length, logging)."""

    agent: Agent
    env: envs_jax.Environment
    mesh: Any
    init_fn: Callable
    set_hparams_fn: Callable  # (state, hparams) -> state with the agent's hparams replaced
    chunk: Callable  # the replicated chunk, jitted
    sweep: bool
    hparam_names: tuple[str, ...]  # the agent's hyperparameters that `init_fn` takes as inputs
    chunk_fn: Callable | None = None  # compiled for the state `init_fn` returns
    evaluators: dict[tuple[int, int], Callable] = dataclasses.field(default_factory=dict)
    stacked_actor_params: Callable | None = None

    def eval_params(self, learner_state: Any) -> Any:
        """The actor parameters of this process's first device, for the evaluator: the
        agent's `actor_params` mapped over the devices (and a sweep's runs) as the chunk maps
        it, so that it always sees one learner state, never the stacked ones (an accessor
        that returns a constant, e.g. a fixed acting temperature, gives that constant once
        per device and run)."""
        if self.stacked_actor_params is None:
            fn = jax.vmap(self.agent.actor_params)
            self.stacked_actor_params = jax.jit(jax.vmap(fn) if self.sweep else fn)
        return replication.unreplicate(self.stacked_actor_params(learner_state))

    def evaluator(self, num_episodes: int, max_steps: int, params: Any, keys: Any) -> Callable:
        """The evaluator, compiled ahead for arguments like `params` and `keys` (compiling
        at the first call would hold the host loop while the devices run dry)."""
        key = (num_episodes, max_steps)
        if key not in self.evaluators:
            fn = make_evaluator(self.agent, self.env, num_episodes=num_episodes,
                                max_steps=max_steps)
            jitted = jax.jit(jax.vmap(fn) if self.sweep else fn)
            self.evaluators[key] = jitted.lower(params, keys).compile()
        return self.evaluators[key]


# Fields that only reach the compiled programs as inputs, or not at all.
_NOT_COMPILED = ("seed", "total_env_steps", "checkpoint_every_updates", "checkpoint_keep",
                 "eval_every_updates", "eval_episodes", "eval_max_steps",
                 "resume_allow_changes")
_PROGRAMS: dict[str, _Programs] = {}
_PROGRAMS_KEPT = 4


def _run_by_run(fn: Callable) -> Callable:
    """`jax.vmap(fn)` over a sweep's runs written as one call per run, stacked: nothing in it
    is batched linear algebra. jaxlib 0.10.2's CPU QR decomposition (behind flax's orthogonal
    initialisers: PPO's layers, an LSTM's recurrent kernel) splits a batch over the intra-op
    thread pool and waits for the parts; two batched QRs running at once on a 2-thread pool
    each wait for a thread the other holds. Seen: an EfficientZero sweep's initialisation
    asleep for good, both pool threads inside `lapack_sgeqrf_ffi`'s `ParallelBatchMap`."""

    def by_run(*args):
        runs = jax.tree.leaves(args)[0].shape[0]
        outs = [fn(*jax.tree.map(lambda x, r=r: x[r], args)) for r in range(runs)]
        return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)

    return by_run


def _programs(plan: RunPlan) -> _Programs:
    """The programs for the plan's config: from the cache when an earlier call built the same
    ones (other seeds, or other values of the agent's `sweepable` hyperparameters, recompile
    nothing: they are inputs), else built now from the plan's environment and agent."""
    env, agent = plan.env, plan.agent
    hparam_names = agent.sweepable if agent.set_hparams is not None else ()

    plain = copy.deepcopy(plan.config)
    for field in _NOT_COMPILED:
        plain.pop(field, None)
    for field in hparam_names:
        plain["agent"].pop(field, None)
    plain.pop("sweep", None)
    devices = [d.id for d in jax.devices()[:plan.num_devices]]
    # A re-registered agent or environment (a notebook cell rerun after an edit) compiles anew.
    registrations = [agents.registration_id(plan.agent_name),
                     envs_jax.registration_id(plan.env_name)]
    key = json.dumps([plain, devices, plan.num_runs, plan.sweep, registrations], sort_keys=True)
    if key in _PROGRAMS:
        _PROGRAMS[key] = _PROGRAMS.pop(key)  # most recently used last
        return _PROGRAMS[key]

    mesh = replication.make_mesh(jax.devices()[:plan.num_devices])
    one_init, chunk = make_programs(
        agent, env,
        envs_per_device=plan.num_envs // plan.num_devices,
        rollout_length=plan.rollout_length,
        updates_per_chunk=plan.updates_per_chunk,
    )

    def init(env_key, params_key, hparams):
        # The agent's hyperparameters arrive as inputs, so that one compiled program serves
        # every value of them: a sweep's runs, or a run with another learning rate.
        state = one_init(env_key, params_key)
        if hparams:
            state = state.replace(learner_state=agent.set_hparams(state.learner_state, hparams))
        return state

    def set_hparams(state, hparams):
        # A resumed run continuing with changed values (`resume_allow_changes`): the
        # restored state holds the checkpoint's.
        return state.replace(learner_state=agent.set_hparams(state.learner_state, hparams))

    if plan.sweep:
        init, chunk, set_hparams = _run_by_run(init), jax.vmap(chunk), jax.vmap(set_hparams)
    programs = _Programs(
        agent=agent, env=env, mesh=mesh,
        init_fn=replication.replicate(init, mesh),
        set_hparams_fn=replication.replicate(set_hparams, mesh),
        chunk=replication.replicate(chunk, mesh, donate_argnums=0),
        sweep=plan.sweep,
        hparam_names=hparam_names,
    )
    _PROGRAMS[key] = programs
    while len(_PROGRAMS) > _PROGRAMS_KEPT:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    return programs
