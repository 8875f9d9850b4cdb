"""A Sebulba actor: B host environments (`sebulba.host_env`: envpool, gymnasium or envs_jax) in
one batch or several, inference on one actor device, and rollouts sent, split along B, to the
learner devices.

    timesteps = [env.reset() for each batch]
    for rollout k = first, first + 1, ...:
        params = store.wait_for(version for rollout k)     # "fixed"; "latest": store.newest
        repeat T times, for each batch in turn:
            on the host:         timestep = recv()          # the step sent for this batch
            on the actor device: action, extras = actor_step(params, observation, step type)
            on the host:         send(action)               # the batch steps on its own threads
        rewards, discounts [T+1, B] -> the actor device       # one transfer per rollout
        on the actor device: stack the T+1 timesteps, T actions and extras -> [T+1, B]
                             and split along B into L shards [T+1, B/L]
        shard l -> learner device l                         # device to device, no host copy
        out.put(Rollout(shards, versions))                  # bounded: back-pressure

With one batch (`config.env.batches = 1`) this is "act, then step". With two, one batch steps
(envpool's C++ threads) while the thread chooses the other's actions, so that stepping hides
inference; the rollout holds the batches side by side along B, in order.

`Actor` takes everything it uses as arguments (the environments, the parameter store, its
queue, the clocks and counters it shares with the learner), so one actor can run alone against
a queue, as a test or a benchmark does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from podracer.agent import Agent
from podracer.types import TimeStep, Trajectory
from sebulba import envpool_env
from sebulba.host_env import HostEnv, split_step
from sebulba.params import ParamsStore, rollout_version
from sebulba.threads import ProgressClock, put


@dataclasses.dataclass
class Rollout:
    """What an actor thread hands to the learner for one trajectory."""

    shards: list[Trajectory]  # one per local learner device, leaves [1, T+1, B/L, ...]
    oldest_version: int  # the oldest parameters version that chose an action in it
    newest_version: int


@dataclasses.dataclass
class ActorFigures:
    """Actor-side figures since the last log record, summed over this process's threads."""

    env_steps: int = 0
    rollouts: int = 0
    put_wait_s: float = 0.0
    params_wait_s: float = 0.0
    inference_s: float = 0.0  # acting: from dispatching `act` until its actions are on the host
    env_s: float = 0.0  # stepping the host environments
    transfer_s: float = 0.0  # handing each step's observations to the actor device
    episode_returns: list[float] = dataclasses.field(default_factory=list)
    episode_lengths: list[int] = dataclasses.field(default_factory=list)


class ActorCounters:
    """Thread-safe accumulation of `ActorFigures`; the learner takes them at each log."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._figures = ActorFigures()

    def add(self, *, env_steps: int, put_wait_s: float, params_wait_s: float,
            episode_returns: list[float], episode_lengths: list[int],
            inference_s: float = 0.0, env_s: float = 0.0, transfer_s: float = 0.0) -> None:
        with self._lock:
            f = self._figures
            f.env_steps += env_steps
            f.rollouts += 1
            f.put_wait_s += put_wait_s
            f.params_wait_s += params_wait_s
            f.inference_s += inference_s
            f.env_s += env_s
            f.transfer_s += transfer_s
            f.episode_returns.extend(episode_returns)
            f.episode_lengths.extend(episode_lengths)

    def take(self) -> ActorFigures:
        with self._lock:
            figures, self._figures = self._figures, ActorFigures()
        return figures


def acting_view(timestep: TimeStep) -> TimeStep:
    """What crosses to the actor device at every step: the observation and the step type (which
    a recurrent agent needs to reset its state). Reward, discount and the episode statistics
    stay on the host (`None` and `{}` here: an `actor_step` that reads them fails loudly); the
    learner's copies of reward and discount cross once per rollout (`pack`)."""
    return TimeStep(step_type=timestep.step_type, reward=None, discount=None,
                    observation=timestep.observation)


def make_act(agent: Agent, *, evaluation: bool,
             to_agent_layout: Callable = envpool_env.to_agent_layout) -> Callable:
    """`act(params, actor_state, timestep, key) -> (action, actor_state, extras, key)`, on the
    host environment's layout of `timestep`'s observations (`to_agent_layout`:
    `sebulba.host_env.agent_layout(kind)`; envpool's by default)."""

    def act(params, actor_state, timestep, key):
        key, act_key = jax.random.split(key)
        timestep = timestep.replace(observation=to_agent_layout(timestep.observation))
        action, actor_state, extras = agent.actor_step(params, actor_state, timestep, act_key,
                                                       evaluation=evaluation)
        return action, actor_state, extras, key

    return act


def make_actor_functions(agent: Agent, num_shards: int,
                         to_agent_layout: Callable = envpool_env.to_agent_layout
                         ) -> tuple[Callable, Callable]:
    """The jitted `act(params, actor_state, timestep, key)` and
    `pack(observed, rewards, discounts, actions, extras) -> tuple of num_shards Trajectory
    shards`. `observed`, `actions` and `extras` hold one sequence per batch of the actor
    thread: its T+1 `acting_view`s already on the actor device, its T actions and extras;
    `rewards`, `discounts` are the host's [T+1, B] arrays (the batches side by side), sent with
    this one call."""

    def stack(xs):
        return jax.tree.map(lambda *leaves: jnp.stack(leaves), *xs)

    def side_by_side(per_batch):  # [T(+1), B_i] per batch -> [T(+1), B]
        return jax.tree.map(lambda *leaves: jnp.concatenate(leaves, axis=1), *per_batch)

    def pack(observed, rewards, discounts, actions, extras):
        timestep = TimeStep(
            step_type=side_by_side([jnp.stack([t.step_type for t in ts]) for ts in observed]),
            reward=rewards,
            discount=discounts,
            observation=side_by_side([jnp.stack([to_agent_layout(t.observation) for t in ts])
                                      for ts in observed]),
        )
        trajectory = Trajectory(timestep=timestep,
                                action=side_by_side([jnp.stack(a) for a in actions]),
                                extras=side_by_side([stack(e) for e in extras]))
        b = trajectory.action.shape[1] // num_shards
        return tuple(
            jax.tree.map(lambda x, i=i: x[None, :, i * b:(i + 1) * b], trajectory)
            for i in range(num_shards)
        )

    return (jax.jit(make_act(agent, evaluation=False, to_agent_layout=to_agent_layout)),
            jax.jit(pack))


@dataclasses.dataclass
class Actor:
    """One actor thread's loop (`run`), with its inputs explicit.

    Rollout k (k = `start_update` + 1, ...) feeds update k. Under "fixed" staleness
    (`policy_lag` an int) it acts with exactly version `rollout_version(k, ...)` of `store`,
    waiting for it; under "latest" (`policy_lag=None`) with the newest version before each
    inference. Each rollout goes onto `out` as a `Rollout` of one shard per learner device.
    `env` is one batch of environments, or a sequence of batches stepped in turn (see the
    module docstring).
    """

    agent: Agent
    env: HostEnv | Sequence[HostEnv]
    act: Callable  # from `make_actor_functions`
    pack: Callable  # from `make_actor_functions`, with len(learner_devices) shards
    store: ParamsStore
    device_index: int  # which of `store.devices` this actor acts on
    learner_devices: Sequence[jax.Device]  # this process's, one shard each
    out: queue.Queue
    key: jax.Array
    rollout_length: int
    policy_lag: int | None  # None: "latest" staleness
    timeout_s: float
    start_update: int = 0  # the store's first version (a resumed run's checkpoint)
    name: str = "actor"
    counters: ActorCounters | None = None
    learner_clock: ProgressClock | None = None  # the learner's progress, for this actor's waits
    actor_clock: ProgressClock | None = None  # ticked after every environment step

    @property
    def envs(self) -> list[HostEnv]:
        """The batches of environments this actor steps in turn."""
        return list(self.env) if isinstance(self.env, (list, tuple)) else [self.env]

    def run(self, stop: threading.Event) -> None:
        """Acts until `stop` is set (or a wait on the learner stalls: `StallError`)."""
        fixed = self.policy_lag is not None
        store, device_index = self.store, self.device_index
        actor_clock = self.actor_clock or ProgressClock()
        learner_clock = self.learner_clock or ProgressClock()
        device = store.devices[device_index]
        envs = self.envs
        batches = range(len(envs))
        steppers = [split_step(env) for env in envs]
        envs_per_thread = sum(env.num_envs for env in envs)
        key = jax.device_put(self.key, device)
        actor_states = [jax.device_put(self.agent.init_actor_state(env.num_envs), device)
                        for env in envs]
        timesteps = [env.reset() for env in envs]
        observed = [jax.device_put(acting_view(t), device) for t in timesteps]
        first = True
        for k in itertools.count(self.start_update + 1):  # rollout k feeds update k
            # PARAMETERS FOR THIS ROLLOUT
            wait_start = time.perf_counter()
            if fixed:
                version = rollout_version(k, policy_lag=self.policy_lag,
                                          start_update=self.start_update)
                params = store.wait_for(version, device_index, stop, self.timeout_s,
                                        learner_clock)
                if params is None:
                    return
            else:
                version, params = store.newest(device_index)
            params_wait = time.perf_counter() - wait_start
            oldest = newest = version

            # ACT FOR T STEPS, batch after batch; observations and step types go to the actor
            # device as they come, rewards and discounts stay on the host until the rollout is
            # complete
            observations = [[o] for o in observed]
            actions: list[list] = [[] for _ in batches]
            extras: list[list] = [[] for _ in batches]
            rewards = [[t.reward] for t in timesteps]
            discounts = [[t.discount] for t in timesteps]
            returns, lengths = [], []
            times = {"inference": 0.0, "env": 0.0, "transfer": 0.0}

            def receive(i: int) -> None:
                """Waits for batch i's step and hands its observations to the device."""
                env_start = time.perf_counter()
                timestep = timesteps[i] = steppers[i][1]()
                actor_clock.tick()
                transfer_start = time.perf_counter()
                # Dispatched: a copy still running when the next `act` needs it counts there.
                observed[i] = jax.device_put(acting_view(timestep), device)
                times["env"] += transfer_start - env_start
                times["transfer"] += time.perf_counter() - transfer_start
                observations[i].append(observed[i])
                rewards[i].append(timestep.reward)
                discounts[i].append(timestep.discount)
                done = timestep.extras["game_over"]
                if done.any():
                    returns.extend(timestep.extras["episode_return"][done].tolist())
                    lengths.extend(timestep.extras["episode_length"][done].tolist())

            for t in range(self.rollout_length):
                for i in batches:
                    if stop.is_set():
                        return
                    if t:
                        receive(i)  # its step ran while the other batches' actions were chosen
                    if not fixed:
                        version, params = store.newest(device_index)
                        oldest, newest = min(oldest, version), max(newest, version)
                    # The first call compiles: not a stall, however long it takes.
                    act_start = time.perf_counter()
                    with actor_clock.busy() if first else contextlib.nullcontext():
                        action, actor_states[i], extra, key = self.act(
                            params, actor_states[i], observed[i], key)
                        first = False
                        host_action = np.asarray(action)
                    send_start = time.perf_counter()
                    steppers[i][0](host_action)
                    times["inference"] += send_start - act_start
                    times["env"] += time.perf_counter() - send_start
                    actions[i].append(action)
                    extras[i].append(extra)
            for i in batches:
                receive(i)

            # SPLIT ALONG B AND SEND EACH SHARD TO ITS LEARNER DEVICE
            host_rewards = np.concatenate([np.stack(r) for r in rewards], axis=1)
            host_discounts = np.concatenate([np.stack(d) for d in discounts], axis=1)
            with (actor_clock.busy() if k == self.start_update + 1
                  else contextlib.nullcontext()):
                shards = self.pack(observations, *jax.device_put(
                    (host_rewards, host_discounts), device), actions, extras)
            shards = [jax.device_put(s, d) for s, d in zip(shards, self.learner_devices)]
            put_start = time.perf_counter()
            if not put(self.out, Rollout(list(shards), oldest, newest), stop, self.timeout_s,
                       self.name, learner_clock):
                return
            if self.counters is not None:
                self.counters.add(env_steps=self.rollout_length * envs_per_thread,
                                  put_wait_s=time.perf_counter() - put_start,
                                  params_wait_s=params_wait, episode_returns=returns,
                                  episode_lengths=lengths, inference_s=times["inference"],
                                  env_s=times["env"], transfer_s=times["transfer"])
