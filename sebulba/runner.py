"""The Sebulba runner (Hessel et al., 2021, section 4): environments on the host, acting on
actor devices, learning replicated over learner devices, in every process of a run.

Data flow in one process (A actor devices, N threads each, L learner devices here, L_all in
the whole run):

    actor thread (A x N of them; each owns an envpool batch of B environments):
        timestep = env.reset()
        for rollout k = 1, 2, ...:
            params = params_store.for_rollout(k)             # the staleness protocol, below
            repeat T times:
                on the actor device: action, extras = actor_step(params, timestep)
                on the host:         timestep = env.step(action)   # envpool's C++ threads
            on the actor device: stack the T+1 timesteps, T actions and extras -> [T+1, B]
                                 and split along B into L shards [T+1, B/L]
            shard l -> learner device l                       # device to device, no host copy
            queue[thread].put(shards)                         # bounded: back-pressure

    learner thread:
        for update u = 1 .. U:
            batch = rollout u of every actor thread           # queue[i].get() for each i
            state = learner_step(state, batch)                # replicated over the L_all
                                                              # learner devices; pmean'd grads
            params_store.publish(u, actor_params(state))      # onto every actor device

    main thread: validates, compiles, starts the threads, then waits until the learner is done,
    a thread fails, or Ctrl-C; then stops every thread and closes every environment.

Staleness protocol. Parameters carry a version: the number of learner updates behind them.
Update u consumes rollout u of each thread; its policy lag is (u - 1) - (the oldest version
that acted in the batch), logged for every update.
  - "fixed" (default, reproducible): rollout k acts with exactly version max(k - 1 - lag, 0),
    waiting for it if the learner is behind. With lag = 1 the actors collect batch u + 1 while
    the learner computes update u, and the whole run is a pure function of (config, seed,
    device count). lag = 0 is synchronous, on-policy learning.
  - "latest": before every inference an actor switches to the newest published version; it
    never waits. The queue bounds the lag: at most queue_size + 1.

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
after every update (every process, at the same update, so that they stop together); it then
logs, saves a checkpoint, and the run stops every thread and closes every environment.

Evaluation: every `eval_every_updates`, process 0's learner thread, right after publishing,
plays the greedy policy (`actor_step(..., evaluation=True)`) on actor device 0 in its own
envpool batch of `eval_episodes` environments (created once, seeded apart from training's),
one game each of at most `eval_max_steps` steps (see `make_evaluator`); the learner waits
meanwhile, and the actors fill their queues.

Faults: every thread runs inside `_Supervisor`, which records the first exception with its
traceback and sets the stop flag. Every blocking wait (queues, parameter versions) polls that
flag and gives up after `timeout_s`, so a failure anywhere ends the run promptly, and `train`
re-raises the original exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import agents
from podracer import distributed, faults, replication
from podracer import metrics as metrics_lib
from podracer import workdir as workdir_lib
from podracer.agent import Agent
from podracer.checkpoint import Checkpointer, Preemption, state_layout
from podracer.config import run_option
from podracer.types import DEVICE_AXIS, TimeStep, Trajectory
from sebulba import envpool_env
from sebulba.config import validate

_POLL_S = 0.05  # how often a blocked wait looks at the stop flag
_JOIN_S = 10.0  # how long shutdown waits for all threads to stop


class StallError(TimeoutError):
    """A thread waited longer than `config.timeout_s` for another one."""


class ThreadFailure(RuntimeError):
    """A Sebulba thread raised; the original exception is the `__cause__`."""


# ---------------------------------------------------------------------------------------------
# THREADS, STOP FLAG AND ERRORS


class _Supervisor:
    """Runs named threads; the first exception in any of them stops all of them."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.errors: list[tuple[str, BaseException, str]] = []
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self, name: str, fn: Callable[[], None]) -> threading.Thread:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - every failure must reach the main thread
                with self._lock:
                    self.errors.append((name, e, traceback.format_exc()))
                self.stop.set()

        # Daemon: a thread stuck in a device call must not keep a failed process alive.
        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    def join(self, timeout_s: float = _JOIN_S) -> list[str]:
        """Stops and joins every thread; returns the names of those still running."""
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def raise_first_error(self) -> None:
        if self.errors:
            name, error, formatted = self.errors[0]
            if isinstance(error, faults.NonFiniteError):
                raise error  # its message says all; the entry point reports it as such
            raise ThreadFailure(f"Sebulba thread {name!r} failed:\n{formatted}") from error


class ProgressClock:
    """When one side (the learner, or the actors) last showed progress, for the other's waits.

    An actor waiting on the learner (for parameters, or for room in its queue) gives up only
    after `timeout_s` without progress from the learner; while the learner is busy with
    something other than consuming (an evaluation, however long), no wait expires. Likewise the
    learner waiting for rollouts gives up only after `timeout_s` in which no actor stepped,
    and not while an actor compiles its first inference.
    """

    def __init__(self) -> None:
        self._last = time.monotonic()
        self._busy = 0
        self._lock = threading.Lock()

    def tick(self) -> None:
        self._last = time.monotonic()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        with self._lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
            self.tick()

    def expired(self, started: float, timeout_s: float) -> bool:
        """Whether a wait begun at `started` has seen no learner progress for `timeout_s`."""
        if self._busy:
            return False
        return time.monotonic() - max(started, self._last) > timeout_s


def _put(q: queue.Queue, item: Any, stop: threading.Event, timeout_s: float, what: str,
         clock: ProgressClock | None = None) -> bool:
    """Blocking put that gives up when `stop` is set (False) or after `timeout_s` without
    learner progress (raises)."""
    started = time.monotonic()
    clock = clock or ProgressClock()
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            if clock.expired(started, timeout_s):
                raise StallError(f"{what}: queue still full after {timeout_s:.0f}s; "
                                 "the learner has stopped consuming") from None
    return False


def _get(q: queue.Queue, stop: threading.Event, timeout_s: float, what: str,
         clock: ProgressClock | None = None) -> Any:
    """Blocking get that returns None when `stop` is set, raises after `timeout_s` without
    actor progress."""
    started = time.monotonic()
    clock = clock or ProgressClock()
    while not stop.is_set():
        try:
            return q.get(timeout=_POLL_S)
        except queue.Empty:
            if clock.expired(started, timeout_s):
                raise StallError(f"{what}: nothing arrived in {timeout_s:.0f}s; an actor thread "
                                 "has stopped producing") from None
    return None


# ---------------------------------------------------------------------------------------------
# PARAMETERS ON THE ACTOR DEVICES


class ParamsStore:
    """Versioned actor parameters, one copy on every actor device.

    The learner publishes version u after update u; actor threads read either an exact version
    (fixed lag) or the newest. The last `keep` versions are kept, enough for the fixed-lag
    protocol: when rollout k asks for version k - 1 - lag, the learner is at most at k - 1.
    """

    def __init__(self, devices: Sequence[jax.Device], keep: int):
        self.devices = list(devices)
        self.keep = keep
        self._cond = threading.Condition()
        self._versions: dict[int, list[Any]] = {}
        self._newest = -1

    def publish(self, version: int, params: Any) -> None:
        copies = [jax.device_put(params, d) for d in self.devices]
        with self._cond:
            self._versions[version] = copies
            for old in [v for v in self._versions if v <= version - self.keep]:
                del self._versions[old]
            self._newest = version
            self._cond.notify_all()

    def newest(self, device_index: int) -> tuple[int, Any]:
        with self._cond:
            return self._newest, self._versions[self._newest][device_index]

    def wait_for(self, version: int, device_index: int, stop: threading.Event,
                 timeout_s: float, clock: ProgressClock | None = None) -> Any:
        """Exactly `version` on actor device `device_index`; None if stopped first. Raises
        after `timeout_s` without learner progress (see `ProgressClock`)."""
        started = time.monotonic()
        clock = clock or ProgressClock()
        with self._cond:
            while self._newest < version:
                if stop.is_set():
                    return None
                if clock.expired(started, timeout_s):
                    raise StallError(f"parameters version {version} not published after "
                                     f"{timeout_s:.0f}s (newest: {self._newest})")
                self._cond.wait(_POLL_S)
            if version not in self._versions:
                raise RuntimeError(f"parameters version {version} already dropped (keeping "
                                   f"{self.keep}, newest {self._newest}): staleness bug")
            return self._versions[version][device_index]


# ---------------------------------------------------------------------------------------------
# ACTORS


@dataclasses.dataclass
class _Rollout:
    """What an actor thread hands to the learner for one trajectory."""

    shards: list[Trajectory]  # one per local learner device, leaves [1, T+1, B/L, ...]
    oldest_version: int  # the oldest parameters version that chose an action in it
    newest_version: int


@dataclasses.dataclass
class _ActorFigures:
    """Actor-side figures since the last log record, summed over this process's threads."""

    env_steps: int = 0
    rollouts: int = 0
    put_wait_s: float = 0.0
    params_wait_s: float = 0.0
    episode_returns: list[float] = dataclasses.field(default_factory=list)
    episode_lengths: list[int] = dataclasses.field(default_factory=list)


class _ActorCounters:
    """Thread-safe accumulation of `_ActorFigures`; the learner takes them at each log."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._figures = _ActorFigures()

    def add(self, *, env_steps: int, put_wait_s: float, params_wait_s: float,
            episode_returns: list[float], episode_lengths: list[int]) -> None:
        with self._lock:
            f = self._figures
            f.env_steps += env_steps
            f.rollouts += 1
            f.put_wait_s += put_wait_s
            f.params_wait_s += params_wait_s
            f.episode_returns.extend(episode_returns)
            f.episode_lengths.extend(episode_lengths)

    def take(self) -> _ActorFigures:
        with self._lock:
            figures, self._figures = self._figures, _ActorFigures()
        return figures


def _strip_extras(timestep: TimeStep) -> TimeStep:
    # Episode statistics stay on the host; the learner does not need them.
    return timestep.replace(extras={})


def _make_act(agent: Agent, *, evaluation: bool) -> Callable:
    """`act(params, actor_state, timestep, key) -> (action, actor_state, extras, key)`, on the
    envpool layout of `timestep`'s observations."""

    def act(params, actor_state, timestep, key):
        key, act_key = jax.random.split(key)
        timestep = timestep.replace(observation=envpool_env.to_agent_layout(timestep.observation))
        action, actor_state, extras = agent.actor_step(params, actor_state, timestep, act_key,
                                                       evaluation=evaluation)
        return action, actor_state, extras, key

    return act


def make_actor_functions(agent: Agent, num_shards: int) -> tuple[Callable, Callable]:
    """The jitted `act(params, actor_state, timestep, key)` and
    `pack(timesteps, actions, extras) -> tuple of num_shards Trajectory shards`."""

    def pack(timesteps, actions, extras):
        timesteps = [t.replace(observation=envpool_env.to_agent_layout(t.observation))
                     for t in timesteps]
        stack = lambda *xs: jnp.stack(xs)
        trajectory = Trajectory(timestep=jax.tree.map(stack, *timesteps),
                                action=jnp.stack(actions),
                                extras=jax.tree.map(stack, *extras))
        b = trajectory.action.shape[1] // num_shards
        return tuple(
            jax.tree.map(lambda x, i=i: x[None, :, i * b:(i + 1) * b], trajectory)
            for i in range(num_shards)
        )

    return jax.jit(_make_act(agent, evaluation=False)), jax.jit(pack)


# ---------------------------------------------------------------------------------------------
# EVALUATION


def make_evaluator(agent: Agent, env: envpool_env.EnvpoolEnv, device: jax.Device, *,
                   max_steps: int) -> Callable[[Any, jax.Array], dict[str, float]]:
    """`evaluate(params, key)` -> greedy returns of one episode on each of `env`'s environments.

    The environments are reset, then play with `actor_step(..., evaluation=True)` on `device`
    until every one has ended a game (`extras["game_over"]`: the LAST step of a whole game;
    for Atari under episodic life, a life loss does not end it) or `max_steps` steps have
    passed. An episode's return is its game score up to its end (`extras["episode_return"]`:
    unclipped, as the logged `episode_return`; nothing after the end, when envpool has already
    started the next one, counts); an unfinished episode counts with its score so far. Returns
    `eval_return` (mean), `eval_return_std`, `eval_finished` (the fraction of episodes that
    ended) and `eval_length` (mean steps). `key` seeds the policy's sampling, if any; the
    environments continue their own random streams from one evaluation to the next.
    """
    act = jax.jit(_make_act(agent, evaluation=True))

    def evaluate(params: Any, key: jax.Array) -> dict[str, float]:
        n = env.num_envs
        key = jax.device_put(key, device)
        actor_state = jax.device_put(agent.init_actor_state(n), device)
        timestep = env.reset()
        returns = np.zeros(n, np.float64)
        lengths = np.zeros(n, np.int64)
        done = np.zeros(n, bool)
        for _ in range(max_steps):
            timestep_dev = jax.device_put(_strip_extras(timestep), device)
            action, actor_state, _, key = act(params, actor_state, timestep_dev, key)
            timestep = env.step(np.asarray(action))
            live = ~done
            returns[live] = timestep.extras["episode_return"][live]
            lengths[live] = timestep.extras["episode_length"][live]
            done |= timestep.extras["game_over"]
            if done.all():
                break
        return {"eval_return": float(np.mean(returns)), "eval_return_std": float(np.std(returns)),
                "eval_finished": float(np.mean(done)), "eval_length": float(np.mean(lengths))}

    return evaluate


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


def _global_batch(shards: Sequence[Trajectory], mesh: jax.sharding.Mesh) -> Trajectory:
    """This process's per-learner-device shards -> global arrays stacked over all learners."""
    sharding = replication.stacked_sharding(mesh)
    num_global = mesh.devices.size

    def assemble(*pieces):
        return jax.make_array_from_single_device_arrays(
            (num_global,) + pieces[0].shape[1:], sharding, list(pieces))

    return jax.tree.map(assemble, *shards)


# Fields that may change between an interrupted run and its resumption: those of
# `podracer.workdir.RESUMABLE_CHANGES`, and how often and how patiently the run logs.
RESUMABLE_CHANGES = workdir_lib.RESUMABLE_CHANGES + ("log_every_updates", "timeout_s",
                                                        "save_final_params")
_EVAL_STREAM = 0x5EED  # mixed into the evaluation's seeds, apart from training's


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

    # A jitted copy out of the first local learner device's slice: fresh buffers, so that
    # donating the learner state to the next update cannot free what the actors hold.
    first_slice_actor_params = jax.jit(
        lambda s: agent.actor_params(jax.tree.map(lambda x: x[0], s)))

    def local_actor_params(state):
        return first_slice_actor_params(
            jax.tree.map(lambda x: x.addressable_shards[0].data, state))

    compile_seconds = init_seconds + time.perf_counter() - start
    run_info["resumed_from_updates"] = resumed_from

    # Version `start_update` (0, or the checkpoint's) is what the first rollouts act with.
    store = ParamsStore(actor_devices, keep=(config.policy_lag + 2) if fixed else 1)
    store.publish(start_update, local_actor_params(learner_state))

    # THREADS
    supervisor = _Supervisor()
    stop = supervisor.stop
    counters = _ActorCounters()
    learner_clock = ProgressClock()  # ticks after every update
    actor_clock = ProgressClock()  # ticks after every environment step of any actor thread
    queues = [queue.Queue(maxsize=config.queue_size) for _ in range(num_threads)]
    envs: list[envpool_env.EnvpoolEnv] = []
    # Resumed: the environments and actor keys start afresh, seeded by the resumed update.
    resume_entropy = (start_update,) if resumed_from is not None else ()

    def actor_loop(device_index: int, thread_id: int, env: envpool_env.EnvpoolEnv) -> None:
        device = actor_devices[device_index]
        out = queues[thread_id]
        key = jax.random.fold_in(jax.random.fold_in(actor_key, process), thread_id)
        for entropy in resume_entropy:
            key = jax.random.fold_in(key, entropy)
        key = jax.device_put(key, device)
        actor_state = jax.device_put(agent.init_actor_state(envs_per_thread), device)
        timestep = env.reset()
        timestep_dev = jax.device_put(_strip_extras(timestep), device)
        first = True
        for k in itertools.count(start_update + 1):  # rollout k feeds update k
            # PARAMETERS FOR THIS ROLLOUT
            wait_start = time.perf_counter()
            if fixed:
                version = max(k - 1 - config.policy_lag, start_update)
                params = store.wait_for(version, device_index, stop, config.timeout_s,
                                        learner_clock)
                if params is None:
                    return
            else:
                version, params = store.newest(device_index)
            params_wait = time.perf_counter() - wait_start
            oldest = newest = version

            # ACT FOR T STEPS; the trajectory stays on the actor device
            timesteps, actions, extras = [timestep_dev], [], []
            returns, lengths = [], []
            for _ in range(rollout_length):
                if stop.is_set():
                    return
                if not fixed:
                    version, params = store.newest(device_index)
                    newest = version
                # The first call compiles: not a stall, however long it takes.
                with actor_clock.busy() if first else contextlib.nullcontext():
                    action, actor_state, extra, key = act(params, actor_state, timestep_dev, key)
                    first = False
                timestep = env.step(np.asarray(action))
                actor_clock.tick()
                timestep_dev = jax.device_put(_strip_extras(timestep), device)
                timesteps.append(timestep_dev)
                actions.append(action)
                extras.append(extra)
                done = timestep.extras["game_over"]
                if done.any():
                    returns.extend(timestep.extras["episode_return"][done].tolist())
                    lengths.extend(timestep.extras["episode_length"][done].tolist())

            # SPLIT ALONG B AND SEND EACH SHARD TO ITS LEARNER DEVICE
            with actor_clock.busy() if k == start_update + 1 else contextlib.nullcontext():
                shards = pack(timesteps, actions, extras)
            shards = [jax.device_put(s, d) for s, d in zip(shards, learner_devices_here)]
            put_start = time.perf_counter()
            if not _put(out, _Rollout(list(shards), oldest, newest), stop, config.timeout_s,
                        f"actor thread {thread_id}", learner_clock):
                return
            counters.add(env_steps=rollout_length * envs_per_thread,
                         put_wait_s=time.perf_counter() - put_start, params_wait_s=params_wait,
                         episode_returns=returns, episode_lengths=lengths)

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
    policy_lags: list[int] = []
    last_batch: list[Any] = [()]
    learner_done = threading.Event()
    preemption = Preemption()
    evaluator: Callable | None = None  # process 0's, made with its environments below
    interrupted = False
    saved_update = resumed_from
    checkpoint_seconds = eval_seconds = 0.0

    def save(u: int, wall_time: float) -> None:
        checkpointer.save(u, {"learner_state": learner_state, "learner_keys": learner_keys}, {
            "updates": u,
            "env_steps": u * steps_per_update,
            "wall_time": wall_time,
            "num_processes": jax.process_count(),
            "num_learner_devices": int(learner_mesh.devices.size),
            "config": config_dict,
        })

    def learner_loop() -> None:
        nonlocal learner_state, learner_keys, interrupted, saved_update
        nonlocal checkpoint_seconds, eval_seconds
        pending_metrics: list[Any] = []
        lags: list[int] = []
        waited = 0.0
        last_time = run_start
        last_update = start_update
        for u in range(start_update + 1, num_updates + 1):
            # ROLLOUT u OF EVERY ACTOR THREAD
            wait_start = time.perf_counter()
            rollouts = []
            for i, q in enumerate(queues):
                rollout = _get(q, stop, config.timeout_s, f"learner waiting for actor thread {i}",
                               actor_clock)
                if rollout is None:
                    return
                rollouts.append(rollout)
            waited += time.perf_counter() - wait_start
            lag = (u - 1) - min(r.oldest_version for r in rollouts)
            policy_lags.append(lag)
            lags.append(lag)

            # UPDATE, REPLICATED OVER EVERY LEARNER DEVICE OF EVERY PROCESS
            batch = tuple(_global_batch(r.shards, learner_mesh) for r in rollouts)
            learner_state, learner_keys, metrics = update_fn(learner_state, learner_keys, batch)
            # Publish only computed parameters: an actor switching to a version still being
            # computed would stall until the update ends instead of acting meanwhile.
            store.publish(u, jax.block_until_ready(local_actor_params(learner_state)))
            learner_clock.tick()
            pending_metrics.append(jax.tree.map(lambda x: x.addressable_shards[0].data,
                                                metrics))
            last_batch[0] = batch

            # Every process takes the same decisions here (a signal to any one stops all), so
            # that they call the checkpointer together.
            stop_now = preemption.requested()
            last = u == num_updates
            checkpoint_now = checkpointer is not None and (
                stop_now or last or (checkpoint_every > 0 and u % checkpoint_every == 0))
            eval_now = evaluator is not None and u % eval_every == 0

            # LOG (also where a checkpoint or an evaluation falls, so that the records of a
            # resumed run continue exactly after its checkpoint's)
            wall_time = time.perf_counter() - run_start + compile_seconds + wall_offset
            if (u % config.log_every_updates == 0 or last or stop_now or checkpoint_now
                    or eval_now):
                learner_metrics = jax.device_get(pending_metrics)
                finite = [bool(m.pop(_FINITE)) for m in learner_metrics]
                if not all(finite):
                    # Raised before this update's state can reach a checkpoint.
                    raise faults.NonFiniteError(faults.nonfinite_message(
                        last_update + 1 + finite.index(False), f"seed {config.seed}",
                        None if checkpointer is None else checkpointer.directory))
                now = time.perf_counter()
                actor = counters.take()
                elapsed = now - last_time
                done_updates = u - last_update
                env_steps = u * steps_per_update
                record = {
                    "env_steps": env_steps,
                    "env_frames": env_steps * frame_skip,
                    "updates": u,
                    "episode_return": _mean(actor.episode_returns),
                    "episode_length": _mean(actor.episode_lengths),
                    "episodes": len(actor.episode_returns),
                    "steps_per_second": done_updates * steps_per_update / elapsed,
                    "actor_steps_per_second": actor.env_steps / elapsed,
                    "learner_updates_per_second": done_updates / elapsed,
                    "learner_wait_fraction": waited / elapsed,
                    "actor_put_wait_s": actor.put_wait_s / max(actor.rollouts, 1),
                    "actor_params_wait_s": actor.params_wait_s / max(actor.rollouts, 1),
                    "policy_lag": float(np.mean(lags)),
                    "policy_lag_max": int(max(lags)),
                    "policy_lags": list(lags),
                    "wall_time": wall_time,
                    **{k: float(np.mean([m[k] for m in learner_metrics]))
                       for k in learner_metrics[0]},
                }
                if eval_now:
                    eval_start = time.perf_counter()
                    eval_key = jax.random.fold_in(
                        jax.random.fold_in(jax.random.PRNGKey(config.seed), _EVAL_STREAM), u)
                    with learner_clock.busy():  # the actors wait meanwhile, however long
                        record.update(evaluator(store.newest(0)[1], eval_key))
                    eval_seconds += time.perf_counter() - eval_start
                record = records.write(0, record)
                if log_fn is not None:
                    log_fn(record)
                pending_metrics, lags, waited = [], [], 0.0
                last_time, last_update = now, u

            # CHECKPOINT the state after update u (the actors may already act with it)
            if checkpoint_now:
                save_start = time.perf_counter()
                with learner_clock.busy():
                    save(u, wall_time)
                    if stop_now:
                        checkpointer.wait()  # on disk before the process may exit
                checkpoint_seconds += time.perf_counter() - save_start
                saved_update = u
            if stop_now:
                interrupted = True
                break
        learner_done.set()

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
                    supervisor.start(f"actor-{process}.{device_index}.{j}",
                                     lambda d=device_index, t=thread_id, e=env: actor_loop(d, t, e))
            if eval_every > 0 and is_main:
                # Its own environments, created once, seeded apart from the training ones.
                eval_env = envpool_env.EnvpoolEnv(
                    task, run_option(config, "eval_episodes"),
                    seed=_env_seed(config.seed, _EVAL_STREAM), num_threads=config.env.num_threads,
                    options=options)
                envs.append(eval_env)
                evaluator = make_evaluator(agent, eval_env, actor_devices[0],
                                           max_steps=run_option(config, "eval_max_steps"))
            supervisor.start(f"learner-{process}", learner_loop)
            # The main thread only watches, so that Ctrl-C (and SIGTERM's handler) land here.
            while not learner_done.is_set() and not stop.is_set():
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
            checkpoint_seconds += time.perf_counter() - close_start
    supervisor.raise_first_error()
    if stuck and not learner_done.is_set():
        raise StallError(f"threads did not stop within {_JOIN_S:.0f}s: {stuck}")
    run_seconds = time.perf_counter() - run_start

    final = history[-1] if history else {}
    if is_main:
        metrics_lib.print_end_of_run(
            final, interrupted=interrupted, signal_received=preemption.received,
            checkpoint_directory=None if checkpointer is None else checkpointer.directory,
            saved_update=saved_update, run_seconds=run_seconds, compile_seconds=compile_seconds,
            checkpoint_seconds=checkpoint_seconds, eval_seconds=eval_seconds)
    result = TrainResult(
        learner_state=learner_state,
        learner_keys=learner_keys,
        final_metrics=final,
        history=history,
        policy_lags=policy_lags,
        actor_params=[store.newest(i) for i in range(len(actor_devices))],
        last_batch=last_batch[0],
        run_info=run_info,
        compile_seconds=compile_seconds,
        run_seconds=run_seconds,
        interrupted=interrupted,
        resumed_from_updates=resumed_from,
        checkpoint_seconds=checkpoint_seconds,
        eval_seconds=eval_seconds,
    )
    if workdir and config.get("save_final_params", False) and not interrupted:
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


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def abstract_learner(agent: Agent, spec: Any, mesh: jax.sharding.Mesh, params_key: jax.Array,
                     learner_key: jax.Array) -> dict[str, Any]:
    """Shapes, dtypes and shardings of what a checkpoint holds (`init_learner`'s outputs),
    computed without compiling or allocating anything."""
    num = mesh.devices.size
    sharding = replication.stacked_sharding(mesh)
    init_fn = replication.replicate(lambda key: agent.init(key, spec), mesh)
    keys = jax.ShapeDtypeStruct((num,) + params_key.shape, params_key.dtype, sharding=sharding)
    return {"learner_state": jax.eval_shape(init_fn, keys),
            "learner_keys": jax.ShapeDtypeStruct((num,) + learner_key.shape, learner_key.dtype,
                                                 sharding=sharding)}


def set_learner_hparams(agent: Agent, mesh: jax.sharding.Mesh, learner_state: Any,
                        agent_config: ml_collections.ConfigDict) -> Any:
    """`learner_state` with the agent's hyperparameters set to `agent_config`'s values."""
    num = mesh.devices.size
    hparams = {name: np.full((num,), agent_config[name], np.float32)
               for name in agent.sweepable}
    fn = replication.replicate(agent.set_hparams, mesh)
    return fn(learner_state, replication.from_global(hparams, mesh))


def init_learner(agent: Agent, spec: Any, mesh: jax.sharding.Mesh, params_key: jax.Array,
                 learner_key: jax.Array) -> tuple[Any, jax.Array]:
    """The learner state (identical on every learner device: one params key for all) and one
    RNG key per learner device, both stacked over `mesh`."""
    num = mesh.devices.size
    init_fn = replication.replicate(lambda key: agent.init(key, spec), mesh)
    state = init_fn(replication.from_global(
        np.broadcast_to(np.asarray(params_key), (num,) + params_key.shape), mesh))
    keys = replication.from_global(np.asarray(jax.random.split(learner_key, num)), mesh)
    return state, keys


_FINITE = "_finite"  # an update's metric: its loss, metrics and parameters are all finite


def make_update(agent: Agent) -> Callable:
    """The per-learner-device `update(state, key, trajectories) -> (state, key, metrics)`, to be
    replicated over the learner mesh; `trajectories` is one `[T+1, B/L]` shard per actor
    thread, concatenated along the batch."""

    def update(state, key, trajectories):
        trajectory = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *trajectories)
        key, step_key = jax.random.split(key)
        state, metrics = agent.learner_step(state, trajectory, step_key, axis_name=DEVICE_AXIS)
        metrics = {**metrics, _FINITE: faults.all_finite(metrics, agent.actor_params(state))}
        return state, key, metrics

    return update


def abstract_batch(agent: Agent, spec: Any, mesh: jax.sharding.Mesh, *, rollout_length: int,
                   shard_batch: int, num_rollouts: int) -> tuple[Trajectory, ...]:
    """Shape, dtype and sharding stand-ins for one update's input (for compiling ahead)."""
    params = jax.eval_shape(lambda k: agent.actor_params(agent.init(k, spec)),
                            jax.random.PRNGKey(0))
    obs = jax.ShapeDtypeStruct((shard_batch,) + tuple(spec.observation.shape),
                               spec.observation.dtype)
    timestep = TimeStep(step_type=jax.ShapeDtypeStruct((shard_batch,), jnp.int32),
                        reward=jax.ShapeDtypeStruct((shard_batch,), jnp.float32),
                        discount=jax.ShapeDtypeStruct((shard_batch,), jnp.float32),
                        observation=obs, extras={})
    action, _, extras = jax.eval_shape(
        lambda p, t, k: agent.actor_step(p, agent.init_actor_state(shard_batch), t, k),
        params, timestep, jax.random.PRNGKey(0))
    sharding = replication.stacked_sharding(mesh)
    num = mesh.devices.size

    def lead(length):
        return lambda x: jax.ShapeDtypeStruct((num, length) + tuple(x.shape), x.dtype,
                                              sharding=sharding)

    trajectory = Trajectory(timestep=jax.tree.map(lead(rollout_length + 1), timestep),
                            action=lead(rollout_length)(action),
                            extras=jax.tree.map(lead(rollout_length), extras))
    return (trajectory,) * num_rollouts
