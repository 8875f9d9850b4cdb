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

`Learner` takes everything it uses as arguments (the compiled update, the queues, the
parameter store, the clocks, and callbacks for logging and evaluation), so it can run alone on
hand-made rollouts.

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
from sebulba.params import ParamsStore
from sebulba.threads import ProgressClock, get

if TYPE_CHECKING:
    from podracer.checkpoint import Checkpointer
    from sebulba.actor import ActorCounters

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


@dataclasses.dataclass
class Learner:
    """The learner thread's loop (`run`), with its inputs explicit; what it produced (the
    state, the policy lags, the last batch, the time spent) is left in its attributes.

    Update u (u = `start_update` + 1 .. `num_updates`) takes one `Rollout` from each queue,
    applies `update_fn` to their shards assembled over `mesh`, publishes version u to `store`,
    and then, as configured, writes a log record through `log`, evaluates with `evaluate`
    (keyed by `seed` and u) and saves a checkpoint with `checkpointer`.
    """

    update_fn: Callable  # replicated `make_update(agent)`: (state, keys, batch) -> ...
    local_actor_params: Callable  # `make_local_actor_params(agent)`
    state: Any  # the learner state, stacked over `mesh`; updated in place by `run`
    keys: jax.Array  # one RNG key per learner device, stacked over `mesh`
    mesh: jax.sharding.Mesh
    queues: Sequence[queue.Queue]  # one per actor thread of this process
    store: ParamsStore
    counters: ActorCounters  # the actors' figures, taken at each record
    num_updates: int
    steps_per_update: int  # env steps of one update, over every process
    timeout_s: float
    seed: int
    start_update: int = 0
    log_every: int = 1
    frame_skip: int = 1
    log: Callable[[dict], None] | None = None  # gets every record
    evaluate: Callable[[Any, jax.Array], dict] | None = None  # (params, key) -> figures
    eval_every: int = 0
    checkpointer: Checkpointer | None = None
    checkpoint_every: int = 0
    checkpoint_metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    should_stop: Callable[[], bool] = lambda: False  # a pre-emption: checkpoint and stop
    stop_check_every: int = 1  # updates between calls of `should_stop` (a collective if
    # several processes: `PREEMPTION_CHECK_EVERY`)
    learner_clock: ProgressClock | None = None  # ticked after every update
    actor_clock: ProgressClock | None = None  # the actors' progress, for the learner's waits
    wall_offset: float = 0.0  # added to the wall time since `run` began (compilation, resume)

    def __post_init__(self) -> None:
        self.policy_lags: list[int] = []  # one per update: (u - 1) - oldest version in batch u
        self.last_batch: tuple[Trajectory, ...] = ()
        self.done = threading.Event()  # set when every update is done or it was pre-empted
        self.interrupted = False
        self.saved_update: int | None = None
        self.checkpoint_seconds = 0.0
        self.eval_seconds = 0.0

    def save(self, u: int, wall_time: float) -> None:
        self.checkpointer.save(u, {"learner_state": self.state, "learner_keys": self.keys}, {
            "updates": u,
            "env_steps": u * self.steps_per_update,
            "wall_time": wall_time,
            **self.checkpoint_metadata,
        })

    def run(self, stop: threading.Event, run_start: float | None = None) -> None:
        """Updates until `num_updates`, a pre-emption, or `stop` (then it returns early)."""
        run_start = time.perf_counter() if run_start is None else run_start
        learner_clock = self.learner_clock or ProgressClock()
        actor_clock = self.actor_clock or ProgressClock()
        pending_metrics: list[Any] = []
        in_flight: collections.deque = collections.deque()  # updates maybe not yet computed
        lags: list[int] = []
        waited = 0.0
        last_time = run_start
        last_update = self.start_update
        for u in range(self.start_update + 1, self.num_updates + 1):
            # At most two updates in flight: u - 1 computing and u queued behind it, so that
            # the devices never wait for this thread and dispatched work stays bounded. Rollout
            # u is taken once version u - 2 is on every actor device (this bounds the policy
            # lag under "latest" staleness: sebulba.params).
            while len(in_flight) >= 2:
                jax.block_until_ready(in_flight.popleft())

            # ROLLOUT u OF EVERY ACTOR THREAD
            wait_start = time.perf_counter()
            rollouts = []
            for i, q in enumerate(self.queues):
                rollout = get(q, stop, self.timeout_s, f"learner waiting for actor thread {i}",
                              actor_clock)
                if rollout is None:
                    return
                rollouts.append(rollout)
            waited += time.perf_counter() - wait_start
            lag = (u - 1) - min(r.oldest_version for r in rollouts)
            self.policy_lags.append(lag)
            lags.append(lag)

            # UPDATE, REPLICATED OVER EVERY LEARNER DEVICE OF EVERY PROCESS. Dispatched, not
            # awaited: the loop goes on to fetch rollout u + 1 while update u computes, and
            # publishes version u at once; the store hands actors only computed versions.
            batch = tuple(_global_batch(r.shards, self.mesh) for r in rollouts)
            self.state, self.keys, metrics = self.update_fn(self.state, self.keys, batch)
            in_flight.append(self.store.publish(u, self.local_actor_params(self.state)))
            learner_clock.tick()
            pending_metrics.append(jax.tree.map(lambda x: x.addressable_shards[0].data,
                                                metrics))
            self.last_batch = batch

            # Every process takes the same decisions here (a signal to any one stops all), so
            # that they call the checkpointer together; across processes that check is a
            # collective, so it is made every `stop_check_every` updates only.
            stop_now = ((u - self.start_update) % self.stop_check_every == 0
                        and self.should_stop())
            last = u == self.num_updates
            checkpoint_now = self.checkpointer is not None and (
                stop_now or last or (self.checkpoint_every > 0 and u % self.checkpoint_every == 0))
            eval_now = self.evaluate is not None and u % self.eval_every == 0

            # LOG (also where a checkpoint or an evaluation falls, so that the records of a
            # resumed run continue exactly after its checkpoint's)
            wall_time = time.perf_counter() - run_start + self.wall_offset
            if u % self.log_every == 0 or last or stop_now or checkpoint_now or eval_now:
                learner_metrics = jax.device_get(pending_metrics)
                finite = [bool(m.pop(faults.FINITE)) for m in learner_metrics]
                if not all(finite):
                    # Raised before this update's state can reach a checkpoint.
                    raise faults.NonFiniteError(faults.nonfinite_message(
                        last_update + 1 + finite.index(False), f"seed {self.seed}",
                        None if self.checkpointer is None else self.checkpointer.directory))
                now = time.perf_counter()
                actor = self.counters.take()
                elapsed = now - last_time
                done_updates = u - last_update
                env_steps = u * self.steps_per_update
                record = {
                    "env_steps": env_steps,
                    "env_frames": env_steps * self.frame_skip,
                    "updates": u,
                    "episode_return": _mean(actor.episode_returns),
                    "episode_length": _mean(actor.episode_lengths),
                    "episodes": len(actor.episode_returns),
                    "steps_per_second": done_updates * self.steps_per_update / elapsed,
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
                    with learner_clock.busy():  # the actors wait meanwhile, however long
                        record.update(self.evaluate(self.store.get(u, 0),
                                                    eval_key(self.seed, u)))
                    self.eval_seconds += time.perf_counter() - eval_start
                if self.log is not None:
                    self.log(record)
                pending_metrics, lags, waited = [], [], 0.0
                last_time, last_update = now, u

            # CHECKPOINT the state after update u (the actors may already act with it)
            if checkpoint_now:
                save_start = time.perf_counter()
                with learner_clock.busy():
                    self.save(u, wall_time)
                    if stop_now:
                        self.checkpointer.wait()  # on disk before the process may exit
                self.checkpoint_seconds += time.perf_counter() - save_start
                self.saved_update = u
            if stop_now:
                self.interrupted = True
                break
        # The run's result is the computed state, and every actor device holds its version.
        jax.block_until_ready((self.state, self.keys, [
            self.store.get(self.store.newest_version, i) for i in range(len(self.store.devices))]))
        self.done.set()
