"""The Sebulba learner: its state on the learner mesh, the replicated update, and the loop that
consumes the actors' rollouts.

    for update u = start + 1 .. U:
        wait until update u - 2 is computed               # at most two updates in flight
        batch = rollout u of every actor thread           # queue[i].get() for each i
        state = learner_step(state, batch)                # dispatched, not awaited; replicated
                                                          # over the L_all learner devices of
                                                          # the run; pmean'd grads
        store.publish(u, actor_params(state))             # onto every actor device; actors
                                                          # use it once it is computed
        log, evaluate, checkpoint as configured

The learner thread never waits for the update it has just dispatched: while update u
computes, it fetches rollout u + 1 and dispatches update u + 1 behind it, so the learner
devices go from one update to the next without a gap. Pre-emption (`should_stop`) is checked
after every update in a single process (a local flag) and every `PREEMPTION_CHECK_EVERY`
updates when several processes must agree (a gather across processes).

`Learner` takes everything it uses when it is built (the compiled update, its schedule, the
`Wiring` it shares with the actors: queues, parameter store, counters and clocks; callbacks for
logging and evaluation; the checkpointer), so it can run alone on hand-made rollouts, and `run`
returns what it produced (a `LearnerOutcome`: the state, the policy lags, the last batch, the
newest checkpoint, the time spent).

Checkpoints: after update u and its publication, the whole learner state stacked over the
learner devices (parameters, optimiser state, target parameters, MuZero's replay buffer:
whatever the agent's state holds), the learner devices' RNG keys and the counters (updates, env
steps, wall time), every `checkpoint_every` updates, at the end and when `should_stop` says so
(SIGTERM: every process at the same update, so that they stop together).
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from podracer import faults, replication
from podracer.agent import Agent
from podracer.session import eval_key
from podracer.types import DEVICE_AXIS, TimeStep, Trajectory
from sebulba.actor import ActorCounters
from sebulba.params import ParamsStore
from sebulba.threads import ProgressClock, get

if TYPE_CHECKING:
    from podracer.checkpoint import Checkpointer

# Updates between pre-emption checks in a run of several processes, where each check gathers a
# flag from every process: it stops the update stream while it waits for the slowest.
PREEMPTION_CHECK_EVERY = 10


# ---------------------------------------------------------------------------------------------
# THE LEARNER STATE AND ITS UPDATE


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


def make_update(agent: Agent) -> Callable:
    """The per-learner-device `update(state, key, trajectories) -> (state, key, metrics)`, to be
    replicated over the learner mesh; `trajectories` is one `[T+1, B/L]` shard per actor
    thread, concatenated along the batch."""

    def update(state, key, trajectories):
        trajectory = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *trajectories)
        key, step_key = jax.random.split(key)
        state, metrics = agent.learner_step(state, trajectory, step_key, axis_name=DEVICE_AXIS)
        finite = faults.all_finite(metrics, agent.actor_params(state))
        metrics = {**metrics, faults.FINITE: finite}
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


def _global_batch(shards: Sequence[Trajectory], mesh: jax.sharding.Mesh) -> Trajectory:
    """This process's per-learner-device shards -> global arrays stacked over all learners."""
    sharding = replication.stacked_sharding(mesh)
    num_global = mesh.devices.size

    def assemble(*pieces):
        return jax.make_array_from_single_device_arrays(
            (num_global,) + pieces[0].shape[1:], sharding, list(pieces))

    return jax.tree.map(assemble, *shards)



def make_local_actor_params(agent: Agent) -> Callable[[Any], Any]:
    """`local_actor_params(state)`: the actor parameters of this process's first learner
    device's slice of `state`, as fresh buffers, so that donating the learner state to the next
    update cannot free what the actors hold."""
    first_slice_actor_params = jax.jit(
        lambda s: agent.actor_params(jax.tree.map(lambda x: x[0], s)))

    def local_actor_params(state):
        return first_slice_actor_params(
            jax.tree.map(lambda x: x.addressable_shards[0].data, state))

    return local_actor_params


# ---------------------------------------------------------------------------------------------
# THE LEARNER LOOP


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


@dataclasses.dataclass(frozen=True)
class LearnerRun:
    """The learner's device state, stacked over the learner mesh: the agent's learner state
    and one RNG key per learner device (what a checkpoint holds; `TrainResult.state`)."""

    learner_state: Any
    learner_keys: jax.Array


@dataclasses.dataclass(frozen=True)
class LearnerSchedule:
    """Which updates the learner makes, and after which of them it logs, evaluates, saves a
    checkpoint and looks for a pre-emption."""

    num_updates: int  # the run's last update
    steps_per_update: int  # env steps of one update, over every process
    timeout_s: float  # the longest wait for rollouts while no actor steps
    seed: int  # keys the evaluations (with the update); named by a non-finite error
    start_update: int = 0  # updates already made (a resumed run's checkpoint)
    log_every: int = 1
    eval_every: int = 0  # with an `evaluate`
    checkpoint_every: int = 0  # with a checkpointer; also after the last update and on a stop
    stop_check_every: int = 1  # updates between calls of `should_stop` (a collective if
    # several processes: `PREEMPTION_CHECK_EVERY`)
    frame_skip: int = 1  # env frames per env step, for the records' `env_frames`


@dataclasses.dataclass(frozen=True)
class Wiring:
    """What the learner shares with the actor threads of its process."""

    queues: Sequence[queue.Queue]  # one per actor thread, its rollouts in order
    store: ParamsStore  # the versions the learner publishes and the actors act with
    counters: ActorCounters = dataclasses.field(default_factory=ActorCounters)  # the actors'
    # figures, taken at each record
    learner_clock: ProgressClock = dataclasses.field(default_factory=ProgressClock)  # ticked
    # after every update
    actor_clock: ProgressClock = dataclasses.field(default_factory=ProgressClock)  # the actors'
    # progress, for the learner's waits


@dataclasses.dataclass(frozen=True)
class LearnerOutcome:
    """What `Learner.run` produced."""

    state: Any  # the learner state after the last update made, computed
    keys: jax.Array
    policy_lags: list[int]  # one per update: (u - 1) - the oldest version in batch u
    last_batch: tuple[Trajectory, ...]  # the last update's input, global arrays
    completed: bool  # every update made, or stopped by `should_stop` (not by the stop flag)
    interrupted: bool  # stopped by `should_stop`, after saving a checkpoint
    saved_update: int | None  # the newest checkpoint: saved by this run, or resumed from
    checkpoint_seconds: float  # handing checkpoints to the checkpointer
    eval_seconds: float  # evaluating (compilation included)


@dataclasses.dataclass(frozen=True)
class _Due:
    """What falls after an update."""

    stop: bool  # a pre-emption: save a checkpoint and stop
    last: bool
    checkpoint: bool
    evaluate: bool
    log: bool


@dataclasses.dataclass
class _Window:
    """What the learner gathered since its last log record."""

    start_time: float  # perf_counter at the last record (or when the run began)
    start_update: int
    metrics: list[Any] = dataclasses.field(default_factory=list)  # per update, on the device
    lags: list[int] = dataclasses.field(default_factory=list)
    waited: float = 0.0  # seconds spent waiting for rollouts


@dataclasses.dataclass
class _Progress:
    """The running state of one `Learner.run`."""

    state: Any
    keys: jax.Array
    window: _Window
    saved_update: int | None
    in_flight: collections.deque = dataclasses.field(default_factory=collections.deque)
    policy_lags: list[int] = dataclasses.field(default_factory=list)
    last_batch: tuple[Trajectory, ...] = ()
    checkpoint_seconds: float = 0.0
    eval_seconds: float = 0.0

    def outcome(self, *, completed: bool, interrupted: bool = False) -> LearnerOutcome:
        return LearnerOutcome(
            state=self.state, keys=self.keys, policy_lags=self.policy_lags,
            last_batch=self.last_batch, completed=completed, interrupted=interrupted,
            saved_update=self.saved_update, checkpoint_seconds=self.checkpoint_seconds,
            eval_seconds=self.eval_seconds)


@dataclasses.dataclass(frozen=True)
class Learner:
    """The learner thread's loop (`run`), with its inputs explicit; `run` returns what it
    produced (`LearnerOutcome`).

    Update u (u = `schedule.start_update` + 1 .. `schedule.num_updates`) takes one `Rollout`
    from each of `wiring.queues`, applies `update_fn` to their shards assembled over `mesh`,
    publishes version u to `wiring.store`, and then, as scheduled, writes a log record through
    `log`, evaluates with `evaluate` (keyed by the seed and u) and saves a checkpoint with
    `checkpointer`.
    """

    update_fn: Callable  # replicated `make_update(agent)`: (state, keys, batch) -> ...
    local_actor_params: Callable  # `make_local_actor_params(agent)`
    mesh: jax.sharding.Mesh
    schedule: LearnerSchedule
    wiring: Wiring
    log: Callable[[dict], None] | None = None  # gets every record
    evaluate: Callable[[Any, jax.Array], dict] | None = None  # (params, key) -> figures
    checkpointer: Checkpointer | None = None
    checkpoint_metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    should_stop: Callable[[], bool] = lambda: False  # a pre-emption: checkpoint and stop
    saved_update: int | None = None  # the checkpoint the run resumed from, if any
    wall_offset: float = 0.0  # added to the wall time since `run` began (compilation, resume)

    def run(self, stop: threading.Event, state: Any, keys: jax.Array,
            run_start: float | None = None) -> LearnerOutcome:
        """Updates `state` and `keys` (stacked over `mesh`; donated) until the last update, a
        pre-emption, or `stop` (then it returns early, `completed=False`)."""
        run_start = time.perf_counter() if run_start is None else run_start
        start = self.schedule.start_update
        progress = _Progress(state=state, keys=keys, saved_update=self.saved_update,
                             window=_Window(start_time=run_start, start_update=start))
        for u in range(start + 1, self.schedule.num_updates + 1):
            # At most two updates in flight: u - 1 computing and u queued behind it, so that
            # the devices never wait for this thread and dispatched work stays bounded. Rollout
            # u is taken once version u - 2 is on every actor device (this bounds the policy
            # lag under "latest" staleness: sebulba.params).
            while len(progress.in_flight) >= 2:
                jax.block_until_ready(progress.in_flight.popleft())
            rollouts = self._take_rollouts(stop, progress.window)
            if rollouts is None:
                return progress.outcome(completed=False)
            self._update(u, rollouts, progress)
            due = self._due(u)
            wall_time = time.perf_counter() - run_start + self.wall_offset
            if due.log:
                self._log(u, due, wall_time, progress)
            if due.checkpoint:
                self._save(u, wall_time, progress, wait=due.stop)
            if due.stop:
                return self._settle(progress, interrupted=True)
        return self._settle(progress, interrupted=False)

    def _take_rollouts(self, stop: threading.Event, window: _Window) -> list[Any] | None:
        """Rollout u of every actor thread, in order; None if `stop` was set meanwhile."""
        wait_start = time.perf_counter()
        rollouts = []
        for i, q in enumerate(self.wiring.queues):
            rollout = get(q, stop, self.schedule.timeout_s,
                          f"learner waiting for actor thread {i}", self.wiring.actor_clock)
            if rollout is None:
                return None
            rollouts.append(rollout)
        window.waited += time.perf_counter() - wait_start
        return rollouts

    def _update(self, u: int, rollouts: list[Any], progress: _Progress) -> None:
        """Update u, replicated over every learner device of every process, and version u
        published. Dispatched, not awaited: the loop goes on to fetch rollout u + 1 while
        update u computes; the store hands actors only computed versions."""
        lag = (u - 1) - min(r.oldest_version for r in rollouts)
        progress.policy_lags.append(lag)
        progress.window.lags.append(lag)
        batch = tuple(_global_batch(r.shards, self.mesh) for r in rollouts)
        progress.state, progress.keys, metrics = self.update_fn(progress.state, progress.keys,
                                                                batch)
        progress.in_flight.append(
            self.wiring.store.publish(u, self.local_actor_params(progress.state)))
        self.wiring.learner_clock.tick()
        progress.window.metrics.append(
            jax.tree.map(lambda x: x.addressable_shards[0].data, metrics))
        progress.last_batch = batch

    def _due(self, u: int) -> _Due:
        """What falls after update u. Every process takes the same decisions here (a signal to
        any one stops all), so that they call the checkpointer together; across processes the
        stop check is a collective, so it is made every `stop_check_every` updates only."""
        schedule = self.schedule
        stop = ((u - schedule.start_update) % schedule.stop_check_every == 0
                and self.should_stop())
        last = u == schedule.num_updates
        checkpoint = self.checkpointer is not None and (
            stop or last or (schedule.checkpoint_every > 0 and u % schedule.checkpoint_every == 0))
        evaluate = self.evaluate is not None and u % schedule.eval_every == 0
        # A record also where a checkpoint or an evaluation falls, so that the records of a
        # resumed run continue exactly after its checkpoint's.
        log = u % schedule.log_every == 0 or last or stop or checkpoint or evaluate
        return _Due(stop=stop, last=last, checkpoint=checkpoint, evaluate=evaluate, log=log)

    def _log(self, u: int, due: _Due, wall_time: float, progress: _Progress) -> None:
        """The record after update u (raising if an update since the last one was not finite),
        with an evaluation if one is due; it starts the next window."""
        window = progress.window
        learner_metrics = jax.device_get(window.metrics)
        finite = [bool(m.pop(faults.FINITE)) for m in learner_metrics]
        if not all(finite):
            # Raised before this update's state can reach a checkpoint.
            raise faults.NonFiniteError(faults.nonfinite_message(
                window.start_update + 1 + finite.index(False), f"seed {self.schedule.seed}",
                None if self.checkpointer is None else self.checkpointer.directory))
        now = time.perf_counter()
        record = self._record(u, learner_metrics, window, now - window.start_time, wall_time)
        if due.evaluate:
            eval_start = time.perf_counter()
            with self.wiring.learner_clock.busy():  # the actors wait meanwhile, however long
                record.update(self.evaluate(self.wiring.store.get(u, 0),
                                            eval_key(self.schedule.seed, u)))
            progress.eval_seconds += time.perf_counter() - eval_start
        if self.log is not None:
            self.log(record)
        progress.window = _Window(start_time=now, start_update=u)

    def _record(self, u: int, learner_metrics: list[dict[str, Any]], window: _Window,
                elapsed: float, wall_time: float) -> dict[str, Any]:
        actor = self.wiring.counters.take()
        done_updates = u - window.start_update
        steps_per_update = self.schedule.steps_per_update
        env_steps = u * steps_per_update
        return {
            "env_steps": env_steps,
            "env_frames": env_steps * self.schedule.frame_skip,
            "updates": u,
            "episode_return": _mean(actor.episode_returns),
            "episode_length": _mean(actor.episode_lengths),
            "episodes": len(actor.episode_returns),
            "steps_per_second": done_updates * steps_per_update / elapsed,
            "actor_steps_per_second": actor.env_steps / elapsed,
            "learner_updates_per_second": done_updates / elapsed,
            "learner_wait_fraction": window.waited / elapsed,
            "actor_put_wait_s": actor.put_wait_s / max(actor.rollouts, 1),
            "actor_params_wait_s": actor.params_wait_s / max(actor.rollouts, 1),
            "actor_inference_s": actor.inference_s / max(actor.rollouts, 1),
            "actor_env_s": actor.env_s / max(actor.rollouts, 1),
            "actor_transfer_s": actor.transfer_s / max(actor.rollouts, 1),
            "policy_lag": float(np.mean(window.lags)),
            "policy_lag_max": int(max(window.lags)),
            "policy_lags": list(window.lags),
            "wall_time": wall_time,
            **{k: float(np.mean([m[k] for m in learner_metrics])) for k in learner_metrics[0]},
        }

    def _save(self, u: int, wall_time: float, progress: _Progress, *, wait: bool) -> None:
        """A checkpoint of the state after update u (the actors may already act with it); with
        `wait`, on disk before this returns (the process may exit next)."""
        save_start = time.perf_counter()
        with self.wiring.learner_clock.busy():
            self.checkpointer.save(
                u, {"learner_state": progress.state, "learner_keys": progress.keys},
                {"updates": u, "env_steps": u * self.schedule.steps_per_update,
                 "wall_time": wall_time, **self.checkpoint_metadata})
            if wait:
                self.checkpointer.wait()
        progress.checkpoint_seconds += time.perf_counter() - save_start
        progress.saved_update = u

    def _settle(self, progress: _Progress, *, interrupted: bool) -> LearnerOutcome:
        """The outcome once the state is computed and every actor device holds its version."""
        store = self.wiring.store
        jax.block_until_ready((progress.state, progress.keys, [
            store.get(store.newest_version, i) for i in range(len(store.devices))]))
        return progress.outcome(completed=True, interrupted=interrupted)
