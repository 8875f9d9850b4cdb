"""Sebulba's parts run alone, without `train`: one actor filling a queue against a parameter
store, and the learner loop consuming hand-made rollouts.

Expected values come from the protocols (docstrings of `sebulba.params` and `sebulba.actor`):
under "fixed" staleness with lag l, rollout k acts with exactly version max(k - 1 - l, 0), so
with only version 0 published and l = 1 an actor can produce rollouts 1 and 2 and must then
wait; a rollout of B environments over L learner devices is L shards [1, T+1, B/L], shard l
holding environments l*B/L .. (l+1)*B/L - 1 and living on learner device l; update u's policy
lag is (u - 1) - the oldest version in its batch.
"""

import itertools
import queue
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import agents
from experiments.configs import sebulba_vtrace_cartpole
from podracer import replication
from podracer.faults import FINITE
from sebulba import envpool_env
from sebulba import params as sebulba_params
from sebulba.actor import Actor, ActorCounters, Rollout, make_actor_functions
from sebulba.learner import (
    Learner,
    LearnerSchedule,
    Wiring,
    abstract_batch,
    init_learner,
    make_local_actor_params,
    make_update,
)
from sebulba.params import ParamsStore

T, B = 5, 4


def _agent():
    config = sebulba_vtrace_cartpole.get_config()
    spec = envpool_env.env_spec("CartPole-v1")
    return agents.make(config.agent, spec), spec


def _wait_for_size(q: queue.Queue, size: int, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while q.qsize() < size and time.monotonic() < end:
        time.sleep(0.05)


def test_an_actor_alone_fills_its_queue_with_the_versions_of_the_fixed_lag_protocol():
    agent, spec = _agent()
    seen = []  # what actor_step receives, at tracing
    inner = agent.actor_step

    def actor_step(params, actor_state, timestep, key, **kwargs):
        seen.append(timestep)
        return inner(params, actor_state, timestep, key, **kwargs)

    agent = agent._replace(actor_step=actor_step)
    actor_device, learner_devices = jax.devices()[0], jax.devices()[1:3]
    params = agent.actor_params(agent.init(jax.random.PRNGKey(0), spec))
    store = ParamsStore([actor_device], keep=3)
    store.publish(0, params)
    out = queue.Queue()
    counters = ActorCounters()
    env = envpool_env.EnvpoolEnv("CartPole-v1", B, seed=7, num_threads=1)
    act, pack = make_actor_functions(agent, len(learner_devices))
    actor = Actor(agent=agent, env=env, act=act, pack=pack, store=store, device_index=0,
                  learner_devices=learner_devices, out=out, key=jax.random.PRNGKey(1),
                  rollout_length=T, policy_lag=1, timeout_s=60.0, counters=counters)
    stop = threading.Event()
    thread = threading.Thread(target=actor.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _wait_for_size(out, 2)
        time.sleep(1.0)  # rollout 3 needs version 1, which is not published: it must wait
        assert out.qsize() == 2
        rollouts = [out.get() for _ in range(2)]
        store.publish(1, params)
        _wait_for_size(out, 1)
        rollouts.append(out.get())
    finally:
        stop.set()
        thread.join(30)
        env.close()
    assert not thread.is_alive()

    assert [(r.oldest_version, r.newest_version) for r in rollouts] == [(0, 0), (0, 0), (1, 1)]
    for r in rollouts:
        assert len(r.shards) == len(learner_devices)
        for shard, device in zip(r.shards, learner_devices):
            assert shard.timestep.observation.shape == (1, T + 1, B // 2, 4)
            assert shard.action.shape == (1, T, B // 2)
            assert all(leaf.devices() == {device} for leaf in jax.tree.leaves(shard))
    # The first timestep of rollout 1 is the reset of the same seed, split along B in order.
    reference = envpool_env.EnvpoolEnv("CartPole-v1", B, seed=7, num_threads=1)
    expected = reference.reset().observation
    reference.close()
    first = np.concatenate([np.asarray(s.timestep.observation[0, 0]) for s in rollouts[0].shards])
    np.testing.assert_array_equal(first, expected)
    # Consecutive rollouts share their boundary timestep (o_T of one is o_0 of the next).
    for a, b in itertools.pairwise(rollouts):
        for sa, sb in zip(a.shards, b.shards):
            np.testing.assert_array_equal(np.asarray(sa.timestep.observation[0, -1]),
                                          np.asarray(sb.timestep.observation[0, 0]))
    figures = counters.take()
    assert figures.rollouts >= 3 and figures.env_steps == figures.rollouts * T * B

    # Each step only the observation and the step type crossed to the actor device ...
    assert seen and all(t.reward is None and t.discount is None for t in seen)
    # ... yet the trajectories are whole: replaying their actions on environments of the same
    # seed gives the same step types, rewards, discounts and observations.
    reference = envpool_env.EnvpoolEnv("CartPole-v1", B, seed=7, num_threads=1)
    reference.reset()
    for r in rollouts:
        joined = jax.tree.map(lambda *xs: np.concatenate([np.asarray(x[0]) for x in xs], axis=1),
                              *r.shards)
        for t in range(T):
            expected = reference.step(joined.action[t])
            for field in ("step_type", "reward", "discount", "observation"):
                np.testing.assert_array_equal(getattr(joined.timestep, field)[t + 1],
                                              getattr(expected, field), err_msg=field)
    reference.close()


class _Logged:
    """An environment batch that logs its sends and receives as ("send" | "recv", i)."""

    def __init__(self, env, i: int, log: list):
        self.env, self.i, self.log, self.num_envs = env, i, log, env.num_envs

    def reset(self):
        return self.env.reset()

    def send(self, action):
        self.log.append(("send", self.i))
        self.env.send(action)

    def recv(self):
        self.log.append(("recv", self.i))
        return self.env.recv()

    def close(self):
        self.env.close()


def test_an_actor_with_two_batches_steps_one_while_it_acts_on_the_other():
    agent, _ = _agent()
    actor_device, learner_devices = jax.devices()[0], jax.devices()[1:3]
    params = agent.actor_params(agent.init(jax.random.PRNGKey(0), _agent()[1]))
    store = ParamsStore([actor_device], keep=3)
    store.publish(0, params)
    out, log = queue.Queue(), []
    seeds, half = (7, 8), B // 2
    envs = [_Logged(envpool_env.EnvpoolEnv("CartPole-v1", half, seed=seed, num_threads=1), i, log)
            for i, seed in enumerate(seeds)]
    act, pack = make_actor_functions(agent, len(learner_devices))
    actor = Actor(agent=agent, env=envs, act=act, pack=pack, store=store, device_index=0,
                  learner_devices=learner_devices, out=out, key=jax.random.PRNGKey(1),
                  rollout_length=T, policy_lag=1, timeout_s=60.0)
    stop = threading.Event()
    thread = threading.Thread(target=actor.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _wait_for_size(out, 2)
        rollouts = [out.get() for _ in range(2)]
    finally:
        stop.set()
        thread.join(30)
        for env in envs:
            env.close()
    assert not thread.is_alive()

    # Batch 0 is sent its actions, then batch 1 (whose actions were chosen while batch 0
    # stepped), and each is received only after the other was sent: T steps of each per
    # rollout, the last two receives closing it.
    one_rollout = ([("send", 0), ("send", 1)]
                   + [("recv", 0), ("send", 0), ("recv", 1), ("send", 1)] * (T - 1)
                   + [("recv", 0), ("recv", 1)])
    assert log[:2 * len(one_rollout)] == one_rollout * 2
    # The rollout holds the batches side by side along B: replaying each half's actions on an
    # environment of its seed gives its step types, rewards, discounts and observations.
    references = [envpool_env.EnvpoolEnv("CartPole-v1", half, seed=seed, num_threads=1)
                  for seed in seeds]
    starts = [reference.reset() for reference in references]
    for r_index, r in enumerate(rollouts):
        joined = jax.tree.map(lambda *xs: np.concatenate([np.asarray(x[0]) for x in xs], axis=1),
                              *r.shards)
        assert joined.action.shape == (T, B)
        for i, reference in enumerate(references):
            columns = slice(i * half, (i + 1) * half)
            if r_index == 0:
                np.testing.assert_array_equal(joined.timestep.observation[0, columns],
                                              starts[i].observation)
            for t in range(T):
                expected = reference.step(joined.action[t, columns])
                for field in ("step_type", "reward", "discount", "observation"):
                    np.testing.assert_array_equal(
                        getattr(joined.timestep, field)[t + 1, columns],
                        getattr(expected, field), err_msg=f"batch {i}, {field}")
    for reference in references:
        reference.close()


def _zero_rollout(agent, spec, mesh, version: int) -> Rollout:
    (abstract,) = abstract_batch(agent, spec, mesh, rollout_length=T, shard_batch=B,
                                 num_rollouts=1)
    devices = replication.local_devices(mesh)
    shards = [jax.tree.map(lambda s, d=d: jnp.zeros((1,) + s.shape[1:], s.dtype, device=d),
                           abstract) for d in devices]
    return Rollout(shards, oldest_version=version, newest_version=version)


def test_the_learner_loop_alone_consumes_hand_made_rollouts_and_publishes_each_version():
    agent, spec = _agent()
    mesh = replication.make_mesh(jax.devices()[:1])
    state, keys = init_learner(agent, spec, mesh, jax.random.PRNGKey(0), jax.random.PRNGKey(1))
    update_fn = replication.replicate(make_update(agent), mesh, donate_argnums=(0, 1))
    store = ParamsStore(jax.devices()[1:2], keep=1)
    local_actor_params = make_local_actor_params(agent)
    store.publish(0, local_actor_params(state))
    q = queue.Queue()
    for version in (0, 0, 1):  # the versions of a lag-1 run's rollouts 1, 2, 3
        q.put(_zero_rollout(agent, spec, mesh, version))
    records = []
    learner = Learner(update_fn=update_fn, local_actor_params=local_actor_params, mesh=mesh,
                      schedule=LearnerSchedule(num_updates=3, steps_per_update=T * B,
                                               timeout_s=30.0, seed=0, log_every=1),
                      wiring=Wiring(queues=[q], store=store, counters=ActorCounters()),
                      log=records.append)
    outcome = learner.run(threading.Event(), state, keys)

    assert outcome.completed and not outcome.interrupted
    assert outcome.policy_lags == [0, 1, 1]  # (u - 1) - oldest version, u = 1, 2, 3
    assert int(replication.unreplicate(outcome.state.updates)) == 3  # what it returns is after
    assert [r["updates"] for r in records] == [1, 2, 3]
    assert [r["env_steps"] for r in records] == [T * B, 2 * T * B, 3 * T * B]
    assert store.newest(0)[0] == 3
    assert all(np.isfinite(r["loss"]) for r in records)


@pytest.mark.optimised
def test_the_learner_dispatches_each_update_before_the_previous_one_is_computed():
    # With updates dispatched back to back, the learner calls update u + 1 while update u
    # still computes (the host never waits for it); with at most two in flight, update u - 2
    # is computed before update u is called. The first update takes seconds (its loop's length
    # is in the state), many times the learner's host work between two calls even on a loaded
    # machine; the later ones are short. (A host callback cannot hold an update back until the
    # next call instead: XLA:CPU runs a program with one synchronously, in the calling thread.)
    mesh = replication.make_mesh(jax.devices()[:1])

    def slow_update(state, key, batch):
        del batch
        w = jax.lax.fori_loop(0, state["n"], lambda i, w: jnp.tanh(w @ w) * 0.5, state["w"])
        return ({"w": w, "n": jnp.ones_like(state["n"])}, key,
                {FINITE: jnp.all(jnp.isfinite(w)), "loss": jnp.mean(w)})

    update_fn = replication.replicate(slow_update, mesh)
    calls = []  # per call: whether the outputs of each earlier call were computed

    def recording_update(state, keys, batch):
        calls.append([out.is_ready() for out in outputs])
        result = update_fn(state, keys, batch)
        outputs.append(result[0]["w"])
        return result

    outputs = []
    w0 = np.random.default_rng(0).normal(size=(1, 384, 384)).astype(np.float32) / 384
    state = {"w": replication.from_global(w0, mesh),
             "n": replication.from_global(np.full((1,), 2_000, np.int32), mesh)}
    keys = replication.from_global(np.zeros((1, 2), np.uint32), mesh)
    local_params = jax.jit(lambda s: s["w"][0])
    store = ParamsStore(jax.devices()[1:2], keep=1)
    store.publish(0, local_params(jax.tree.map(lambda x: x.addressable_shards[0].data, state)))
    q = queue.Queue()
    for version in (0, 0, 1, 2):
        q.put(Rollout([jnp.zeros((1, 2))], oldest_version=version, newest_version=version))
    learner = Learner(update_fn=recording_update,
                      local_actor_params=lambda s: local_params(
                          jax.tree.map(lambda x: x.addressable_shards[0].data, s)),
                      mesh=mesh,
                      schedule=LearnerSchedule(num_updates=4, steps_per_update=1, timeout_s=60.0,
                                               seed=0, log_every=4),
                      wiring=Wiring(queues=[q], store=store, counters=ActorCounters()))
    outcome = learner.run(threading.Event(), state, keys)

    assert outcome.completed and store.newest(0)[0] == 4
    assert calls[0] == []
    assert calls[1] == [False]  # update 2 called while update 1 computes
    assert calls[2][0] and calls[3][1]  # update u - 2 computed before update u is called


def test_the_store_keeps_a_version_that_finishes_after_a_newer_one_is_published(monkeypatch):
    # Under "latest" staleness (keep = 1) the learner publishes version u + 1 while u may still
    # be computing. When u finishes first, it is the newest computed version and the one the
    # actors must get, not the version before it: the lag bound of `sebulba.params` counts on
    # it. Readiness is set by hand here, so that the order of events is the test's.
    computed = {0}
    monkeypatch.setattr(sebulba_params, "_ready", lambda tree: all(
        int(leaf) in computed for leaf in jax.tree.leaves(tree)))
    store = ParamsStore(jax.devices()[:1], keep=1)
    store.publish(0, jnp.asarray(0))
    store.publish(1, jnp.asarray(1))  # update 1 dispatched, not computed
    store.publish(2, jnp.asarray(2))  # update 2 dispatched while 1 still computes
    assert store.newest(0)[0] == 0
    computed.add(1)  # update 1 finishes; update 2 still computes
    assert store.newest(0)[0] == 1
    computed.add(2)
    store.publish(3, jnp.asarray(3))  # 2 is computed: every older version can go
    assert sorted(store._versions) == [2, 3]
    assert store.newest(0)[0] == 2
