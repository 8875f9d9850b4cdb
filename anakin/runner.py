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

    dispatch chunk 0 (+ its evaluation and checkpoint copy, if due)
    for k = 0, 1, ...:
        dispatch chunk k + 1 (+ its evaluation and checkpoint copy, if due)
        fetch chunk k's metrics (and evaluation) -> log; raise if not finite
        hand chunk k's checkpoint copy to the (asynchronous) checkpointer
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

import dataclasses
import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import agents
import envs_jax
from anakin.config import Run, option, sweep_runs, validate
from anakin.programs import (
    FIRST_NONFINITE,
    RunnerState,
    make_evaluator,
    make_programs,
)
from podracer import distributed, faults, replication
from podracer import metrics as metrics_lib
from podracer import workdir as workdir_lib
from podracer.agent import Agent
from podracer.checkpoint import Checkpointer, Preemption, Snapshot, snapshot, state_layout


@dataclasses.dataclass
class TrainResult:
    """What `train` returns. For a sweep, the state's leaves are `[devices, runs, ...]`,
    `params` is `[runs, ...]`, and `history` averages the runs (each run's own records are in
    `run_histories`)."""

    state: RunnerState  # stacked over devices
    final_metrics: dict[str, float]  # the last log record
    history: list[dict[str, float]]  # every log record (a resumed run: earlier ones included)
    compile_seconds: float
    run_seconds: float
    run_histories: list[list[dict[str, float]]] = dataclasses.field(default_factory=list)
    interrupted: bool = False  # stopped by SIGTERM after saving a checkpoint
    resumed_from_updates: int | None = None  # the checkpoint this run started from
    checkpoint_seconds: float = 0.0  # time spent writing checkpoints
    eval_seconds: float = 0.0  # time spent evaluating (compilation included)

    @property
    def params(self) -> Any:
        """The learner parameters of this process's first device."""
        return replication.unreplicate(self.state.learner_state.params)


@dataclasses.dataclass
class _InFlight:
    """A dispatched chunk and what was dispatched on its result, none of it fetched yet."""

    chunk: int  # 0-based index of the chunk
    metrics: Any  # the chunk's metrics, on the devices
    eval_out: Any | None  # its evaluation's results, on the device, when one was due
    snapshot: Snapshot | None  # a copy of the state after it, when a checkpoint was due


# Fields that may change between an interrupted run and its resumption (shared with Sebulba).
RESUMABLE_CHANGES = workdir_lib.RESUMABLE_CHANGES
_EVAL_STREAM = 0x5EED  # folded into a run's seed for its evaluation keys, apart from training's


def _run_config(config: ml_collections.ConfigDict, run: Run) -> dict[str, Any]:
    """One sweep run's resolved config: its seed and hyperparameters, no sweep."""
    plain = metrics_lib.config_to_dict(config)
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


def _changes_hparams(changes: dict[str, Any], names: tuple[str, ...]) -> bool:
    """Whether opted-in config changes touch hyperparameters the learner state holds."""
    held = {f"agent.{n}" for n in names} | {f"sweep.agent.{n}" for n in names}
    return bool(held & set(changes))


def _crossed(updates: int, step: int, every: int) -> bool:
    """Whether the updates `(updates - step, updates]` include a multiple of `every`."""
    return every > 0 and updates // every > (updates - step) // every


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


def _programs(config: ml_collections.ConfigDict, num_devices: int, num_runs: int,
              sweep: bool) -> _Programs:
    """The programs for `config`: from the cache when an earlier call built the same ones
    (other seeds, or other values of the agent's `sweepable` hyperparameters, recompile
    nothing: they are inputs), else built now."""
    env = envs_jax.make(config.env.name, **config.env.get("kwargs", {}))
    env = envs_jax.wrap_for_training(env, config.env.max_episode_steps or None)
    agent = agents.make(config.agent, env.spec())
    hparam_names = agent.sweepable if agent.set_hparams is not None else ()

    plain = metrics_lib.config_to_dict(config)
    for field in _NOT_COMPILED:
        plain.pop(field, None)
    for field in hparam_names:
        plain["agent"].pop(field, None)
    plain.pop("sweep", None)
    devices = [d.id for d in jax.devices()[:num_devices]]
    key = json.dumps([plain, devices, num_runs, sweep], sort_keys=True)
    if key in _PROGRAMS:
        _PROGRAMS[key] = _PROGRAMS.pop(key)  # most recently used last
        return _PROGRAMS[key]

    mesh = replication.make_mesh(jax.devices()[:num_devices])
    one_init, chunk = make_programs(
        agent, env,
        envs_per_device=config.num_envs // num_devices,
        rollout_length=config.rollout_length,
        updates_per_chunk=config.updates_per_chunk,
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

    if sweep:
        init, chunk, set_hparams = _run_by_run(init), jax.vmap(chunk), jax.vmap(set_hparams)
    programs = _Programs(
        agent=agent, env=env, mesh=mesh,
        init_fn=replication.replicate(init, mesh),
        set_hparams_fn=replication.replicate(set_hparams, mesh),
        chunk=replication.replicate(chunk, mesh, donate_argnums=0),
        sweep=sweep,
        hparam_names=hparam_names,
    )
    _PROGRAMS[key] = programs
    while len(_PROGRAMS) > _PROGRAMS_KEPT:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    return programs


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
    SIGTERM stops the run after the chunk in flight when it is seen (at most two chunks),
    with a checkpoint saved, and returns a result with `interrupted=True`. A NaN or inf loss or parameter raises
    `podracer.faults.NonFiniteError` naming the update, before it could be checkpointed.
    `log_fn` gets every record (a sweep's carry their `run` index).
    """
    distributed.initialize_from_env()
    num_devices = validate(config, jax.device_count())
    if workdir is not None:
        workdir = workdir_lib.check_writable(workdir)
    runs = sweep_runs(config)
    sweep = runs is not None
    runs = runs or [Run(seed=config.seed, hparams={})]
    num_runs = len(runs)
    start = time.perf_counter()
    programs = _programs(config, num_devices, num_runs, sweep)
    agent, mesh = programs.agent, programs.mesh

    # Every process derives the same global keys and places its own devices' slices.
    env_keys, params_keys = _initial_keys([r.seed for r in runs], num_devices, sweep)
    hparams = {}
    for name in programs.hparam_names:
        values = [r.hparams.get(name, config.agent[name]) for r in runs]
        shape = (num_devices, num_runs) if sweep else (num_devices,)
        hparams[name] = np.broadcast_to(np.asarray(values if sweep else values[0], np.float32),
                                        shape)
    init_args = [replication.from_global(env_keys, mesh),
                 replication.from_global(params_keys, mesh),
                 replication.from_global(hparams, mesh)]

    # May this run resume the workdir's checkpoint? Decided from metadata alone, before
    # compiling: a refused run fails here and changes nothing in the workdir.
    config_dict = metrics_lib.config_to_dict(config)
    run_shape = {"num_devices": num_devices, "num_runs": num_runs}
    checkpoint_dir = None if workdir is None else os.path.join(workdir, "checkpoints")
    layout = state_layout(jax.eval_shape(programs.init_fn, *init_args))
    resume_args = {"config": config_dict, "layout": layout, "run_shape": run_shape,
                   "resumable": RESUMABLE_CHANGES}
    point = (None if checkpoint_dir is None
             else workdir_lib.find_resume_point(checkpoint_dir, **resume_args))

    state = programs.init_fn(*init_args)
    if programs.chunk_fn is None:
        programs.chunk_fn = programs.chunk.lower(state).compile()
    chunk_fn = programs.chunk_fn
    if checkpoint_dir is not None:
        # The checkpoints' copy-and-fingerprint program, compiled here, not at the first save.
        jax.block_until_ready(snapshot(state).digest)
    if option(config, "eval_every_updates") > 0:
        # And the evaluator, not at the first evaluation (arguments shaped as it will get).
        params = replication.unreplicate(agent.actor_params(state.learner_state))
        keys = np.zeros((num_runs, 2) if sweep else (2,), np.uint32)
        programs.evaluator(option(config, "eval_episodes"), option(config, "eval_max_steps"),
                           params, keys)
    compile_seconds = time.perf_counter() - start

    steps_per_chunk = config.updates_per_chunk * config.rollout_length * config.num_envs
    num_chunks = -(-config.total_env_steps // steps_per_chunk)
    is_main = jax.process_index() == 0
    run_dirs: list[str | None] = [None] * num_runs
    if workdir is not None:
        run_dirs = ([os.path.join(workdir, f"run_{i}") for i in range(num_runs)] if sweep
                    else [workdir])

    # RESUME from the checkpoint found above (or, if it proves damaged, an older one).
    checkpointer = None
    done_chunks, wall_offset, resumed_from = 0, 0.0, None
    if checkpoint_dir is not None:
        # Asynchronous: the files are written while the next chunks run.
        checkpointer = Checkpointer(checkpoint_dir, max_to_keep=option(config, "checkpoint_keep"),
                                    asynchronous=True)
        restored, point = workdir_lib.restore(checkpointer, point, state, **resume_args)
        if restored is not None:
            state = restored.state
            if hparams and _changes_hparams(point.changes, programs.hparam_names):
                state = programs.set_hparams_fn(state, init_args[2])
            done_chunks = int(restored.metadata["chunks"])
            wall_offset = float(restored.metadata["wall_time"])
            resumed_from = done_chunks * config.updates_per_chunk

    total_steps = num_chunks * steps_per_chunk
    resume_steps = done_chunks * steps_per_chunk if resumed_from is not None else None
    records = workdir_lib.Records.open(
        workdir, run_dirs, config=config_dict,
        run_configs=[_run_config(config, r) for r in runs] if sweep else None,
        enabled=is_main, resumed_from=resumed_from, total_env_steps=total_steps,
        resume_env_steps=resume_steps, changes=None if point is None else point.changes,
        progress=not sweep)
    histories = records.histories
    progress = None
    if sweep and is_main:
        progress = metrics_lib.Progress(total_steps, start_env_steps=resume_steps or 0)
    if is_main:
        what = f"a sweep of {num_runs} runs" if sweep else f"seed {config.seed}"
        processes = (f" in {jax.process_count()} processes" if jax.process_count() > 1 else "")
        print(f"Anakin: {config.agent.name} on {config.env.name}, {what}, {num_devices} "
              f"device(s){processes} ({jax.devices()[0].platform}), {config.num_envs} envs, "
              f"T={config.rollout_length}, {config.updates_per_chunk} updates/chunk, "
              f"{num_chunks} chunks; compiled in {compile_seconds:.1f}s", flush=True)
        if resumed_from is not None:
            print(f"Resuming from the checkpoint at update {resumed_from:,} "
                  f"({done_chunks} of {num_chunks} chunks done) in {checkpointer.directory}",
                  flush=True)
            if point.changes:
                changed = ", ".join(f"{f}: {a!r} -> {b!r}" for f, (a, b) in point.changes.items())
                print(f"Continuing with changed config values (resume_allow_changes): {changed}",
                      flush=True)

    eval_every = option(config, "eval_every_updates")
    checkpoint_every = option(config, "checkpoint_every_updates")

    def eval_args(state: RunnerState, updates: int) -> tuple[Any, Any]:
        # Computed on the devices, so that nothing here waits for the chunk whose parameters
        # are evaluated.
        keys = jnp.stack([
            jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(r.seed), _EVAL_STREAM),
                               updates)
            for r in runs])
        params = replication.unreplicate(agent.actor_params(state.learner_state))
        return params, keys if sweep else keys[0]

    def dispatch_eval(state: RunnerState, updates: int) -> Any:
        """Dispatches the evaluation of `state`'s parameters; fetched later (`fetch_eval`)."""
        args = eval_args(state, updates)
        evaluator = programs.evaluator(option(config, "eval_episodes"),
                                       option(config, "eval_max_steps"), *args)
        return evaluator(*args)

    def fetch_eval(out: Any) -> list[dict[str, float]]:
        out = jax.device_get(out)
        return [{k: float(np.asarray(v)[i] if sweep else v) for k, v in out.items()}
                for i in range(num_runs)]

    def save(taken: Snapshot, chunks: int, wall_time: float) -> float:
        started = time.perf_counter()
        checkpointer.save(chunks * config.updates_per_chunk, taken, {
            "chunks": chunks,
            "updates": chunks * config.updates_per_chunk,
            "env_steps": chunks * steps_per_chunk,
            "wall_time": wall_time,
            "num_devices": num_devices,
            "num_processes": jax.process_count(),
            "num_runs": num_runs,
            "seeds": [r.seed for r in runs],
            "config": config_dict,
        })
        return time.perf_counter() - started

    def dispatch(i: int, state: RunnerState) -> tuple[RunnerState, _InFlight]:
        """Dispatches chunk i, and what is due on its result before chunk i + 1 donates it:
        the evaluation and a copy for the checkpoint (none of it waited for here)."""
        state, metrics = chunk_fn(state)
        updates = (i + 1) * config.updates_per_chunk
        eval_out = snap = None
        if _crossed(updates, config.updates_per_chunk, eval_every):
            eval_out = dispatch_eval(state, updates)
        if checkpointer is not None and (
                i + 1 == num_chunks or _crossed(updates, config.updates_per_chunk,
                                                checkpoint_every)):
            snap = snapshot(state)
        return state, _InFlight(chunk=i, metrics=metrics, eval_out=eval_out, snapshot=snap)

    interrupted = False
    checkpoint_seconds = eval_seconds = 0.0
    saved_chunks = done_chunks if resumed_from is not None else None
    run_start = time.perf_counter()
    last_fetch = run_start

    def finish(job: _InFlight) -> float:
        """Fetches chunk `job.chunk`'s metrics (waiting for it, not for the chunk after it),
        logs them with its evaluation, and raises if it was not finite; returns the wall time
        to record."""
        nonlocal last_fetch, eval_seconds
        i = job.chunk
        metrics = jax.tree.map(_first_slice_on_host, job.metrics)
        first_bad = np.atleast_1d(metrics.pop(FIRST_NONFINITE))
        now = time.perf_counter()
        wall_time = now - run_start + compile_seconds + wall_offset
        records_now = [
            _record(jax.tree.map(lambda x, r=r: x[r] if sweep else x, metrics),
                    chunk=i, steps_per_chunk=steps_per_chunk,
                    updates_per_chunk=config.updates_per_chunk,
                    seconds=now - last_fetch, wall_time=wall_time)
            for r in range(num_runs)
        ]
        last_fetch = now
        healthy = bool(np.all(first_bad >= config.updates_per_chunk))
        if healthy and job.eval_out is not None:
            eval_start = time.perf_counter()
            for record, result in zip(records_now, fetch_eval(job.eval_out)):
                record.update(result)
            eval_seconds += time.perf_counter() - eval_start
        for r, record in enumerate(records_now):
            record = records.write(r, record)
            if log_fn is not None:
                log_fn({**record, "run": r} if sweep else record)
        if progress is not None:
            progress.update(_mean_record(records_now))
        if not healthy:
            bad_run = int(np.argmin(first_bad))
            where = f"run {bad_run} of the sweep" if sweep else f"seed {config.seed}"
            raise faults.NonFiniteError(faults.nonfinite_message(
                i * config.updates_per_chunk + int(first_bad[bad_run]) + 1, where,
                None if checkpointer is None else checkpointer.directory))
        return wall_time

    try:
        with Preemption() as preemption:
            # PIPELINE: chunk i + 1 is dispatched before chunk i's metrics are fetched, so the
            # devices never wait for the host's logging, evaluation fetch or checkpoint
            # hand-off. A checkpoint is written only after its chunk's metrics proved finite.
            pending = None
            if done_chunks < num_chunks:
                state, pending = dispatch(done_chunks, state)
            while pending is not None:
                following = None
                if pending.chunk + 1 < num_chunks:
                    state, following = dispatch(pending.chunk + 1, state)
                wall_time = finish(pending)
                if pending.snapshot is not None:
                    checkpoint_seconds += save(pending.snapshot, pending.chunk + 1, wall_time)
                    saved_chunks = pending.chunk + 1
                # Polled after the save: in a multi-process run the poll is a collective, which
                # waits for the chunk in flight; the save's hand-off overlaps that chunk.
                if preemption.requested():
                    if following is not None:
                        # The chunk in flight is finished, logged and saved: the run stops
                        # one chunk after the one during which the signal came.
                        wall_time = finish(following)
                        if checkpointer is not None:
                            taken = following.snapshot or snapshot(state)
                            checkpoint_seconds += save(taken, following.chunk + 1, wall_time)
                            saved_chunks = following.chunk + 1
                    if checkpointer is not None:
                        started = time.perf_counter()
                        checkpointer.wait()  # on disk before the process may exit
                        checkpoint_seconds += time.perf_counter() - started
                    interrupted = True
                    break
                pending = following
    finally:
        records.close()
        if progress is not None:
            progress.close()
        if checkpointer is not None:
            started = time.perf_counter()
            checkpointer.close()  # waits for the last save
            checkpoint_seconds += time.perf_counter() - started
    run_seconds = time.perf_counter() - run_start
    history = ([_mean_record(list(rs)) for rs in zip(*histories)] if sweep
               else histories[0])
    final = history[-1] if history else {}
    if is_main:
        metrics_lib.print_end_of_run(
            final, interrupted=interrupted, signal_received=preemption.received,
            checkpoint_directory=None if checkpointer is None else checkpointer.directory,
            saved_update=(None if saved_chunks is None
                          else saved_chunks * config.updates_per_chunk), run_seconds=run_seconds,
            compile_seconds=compile_seconds, checkpoint_seconds=checkpoint_seconds,
            eval_seconds=eval_seconds)
    return TrainResult(state=state, final_metrics=final, history=history,
                       compile_seconds=compile_seconds, run_seconds=run_seconds,
                       run_histories=histories, interrupted=interrupted,
                       resumed_from_updates=resumed_from, checkpoint_seconds=checkpoint_seconds,
                       eval_seconds=eval_seconds)
