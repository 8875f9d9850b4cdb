"""The Sebulba runner on 8 simulated CPU devices: placement, replication, staleness, learning,
and faults.

Expected values are derived from the protocol definitions (docstring of `sebulba.runner`):
with a fixed lag l, update u's batch was produced by exactly version max(u - 1 - l, 0), so its
lag is min(l, u - 1); with "latest" the lag is at most queue_size + 2; with lag 0 the behaviour
policy is the learner's policy, so every importance ratio pi/mu is 1.
"""

import os
import threading
import time

import jax
import numpy as np
import pytest
from conftest import (assert_a_refused_run_leaves_no_trace, assert_trees_equal,
                      relative_differences, snapshot)

import sebulba
from experiments.configs import sebulba_vtrace_cartpole
from podracer import replication
from sebulba import envpool_env, host_env
from sebulba.runner import ParamsStore, StallError, ThreadFailure

ACTORS = (0, 1)
LEARNERS = (2, 3, 4, 5, 6, 7)


def _config(**overrides):
    config = sebulba_vtrace_cartpole.get_config()
    config.actor_device_ids = ACTORS
    config.learner_device_ids = LEARNERS
    config.envs_per_actor_thread = 12
    config.rollout_length = 8
    config.log_every_updates = 5
    config.timeout_s = 60.0
    for field, value in overrides.items():
        config[field] = value
    return config


def _tree_equal(a, b) -> bool:
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: np.array_equal(x, y), a, b)))


# ---------------------------------------------------------------------------------------------
# ParamsStore


def test_params_store_versions_stop_and_timeout():
    devices = jax.devices()[:2]
    store = ParamsStore(devices, keep=2)
    stop = threading.Event()
    store.publish(0, {"w": np.zeros(3, np.float32)})
    store.publish(1, {"w": np.ones(3, np.float32)})
    p = store.wait_for(0, 1, stop, timeout_s=1)
    assert p["w"].devices() == {devices[1]} and float(p["w"].sum()) == 0.0
    assert store.newest(0)[0] == 1
    store.publish(2, {"w": np.full(3, 2, np.float32)})  # keep=2 drops version 0
    with pytest.raises(RuntimeError, match="already dropped"):
        store.wait_for(0, 0, stop, timeout_s=1)
    start = time.monotonic()
    with pytest.raises(StallError):
        store.wait_for(5, 0, stop, timeout_s=0.3)
    assert time.monotonic() - start < 2
    threading.Timer(0.2, stop.set).start()
    assert store.wait_for(5, 0, stop, timeout_s=30) is None  # the stop flag ends the wait


# ---------------------------------------------------------------------------------------------
# Placement, replication and the fixed-lag protocol (2 actor + 6 learner devices)


@pytest.fixture(scope="module")
def fixed_lag_run():
    config = _config(total_env_steps=2 * 12 * 8 * 12, actor_threads_per_device=1)  # 12 updates
    return config, sebulba.train(config)


def test_learner_batch_shards_live_on_the_learner_devices(fixed_lag_run):
    config, result = fixed_lag_run
    devices = jax.devices()
    learners = [devices[i] for i in LEARNERS]
    assert len(result.last_batch) == len(ACTORS)  # one trajectory per actor thread
    b = config.envs_per_actor_thread // len(LEARNERS)
    for trajectory in result.last_batch:
        for leaf in jax.tree.leaves(trajectory):
            shard_devices = [s.device for s in leaf.addressable_shards]
            assert shard_devices == learners
            assert leaf.shape[0] == len(LEARNERS) and leaf.shape[2] == b
        assert trajectory.timestep.observation.shape == (6, config.rollout_length + 1, b, 4)


def test_learner_params_identical_on_every_learner_device(fixed_lag_run):
    _, result = fixed_lag_run
    slices = replication.local_slices(result.learner_state.params)
    assert len(slices) == len(LEARNERS)
    for other in slices[1:]:
        assert _tree_equal(slices[0], other)
    assert int(replication.unreplicate(result.learner_state.updates)) == 12


def test_actor_params_are_the_newest_version_on_each_actor_device(fixed_lag_run):
    _, result = fixed_lag_run
    devices = jax.devices()
    learner_params = jax.device_get(result.params)
    assert len(result.actor_params) == len(ACTORS)
    for device_index, (version, params) in zip(ACTORS, result.actor_params):
        assert version == 12
        for leaf in jax.tree.leaves(params):
            assert leaf.devices() == {devices[device_index]}
        assert _tree_equal(jax.device_get(params), learner_params)


def test_fixed_lag_one_is_exact(fixed_lag_run):
    _, result = fixed_lag_run
    assert result.policy_lags == [0] + [1] * 11
    record = result.final_metrics
    assert record["policy_lags"] == [1] * 2  # updates 11 and 12 (log every 5, and at the end)
    for key in ("policy_lag", "policy_lag_max", "actor_steps_per_second",
                "learner_wait_fraction", "actor_put_wait_s", "actor_params_wait_s", "loss",
                "steps_per_second", "env_frames"):
        assert key in record
    # Where the actor threads' time went, per rollout: each part took some time.
    parts = [record[k] for k in ("actor_inference_s", "actor_env_s", "actor_transfer_s")]
    assert all(p > 0 for p in parts)
    assert record["env_steps"] == 12 * 2 * 12 * 8
    assert result.run_info["environment"]["envpool_version"] == "1.2.5"
    # The sizes the config left to the machine are named in run_info.json.
    assert result.run_info["derived_sizes"] == ["env.num_threads"]
    assert result.run_info["machine"]["platform"] == "cpu"


def test_fixed_lag_run_repeats_bit_for_bit():
    # The promise of the "fixed" protocol: the same config and seed on the same devices run the
    # same compiled programs on the same data, whatever the threads' timing (two actor threads
    # share a device here), so the whole learner state and the keys repeat exactly. Another
    # seed changes them.
    config = _config(total_env_steps=2 * 8 * 8 * 12, actor_device_ids=(0,),
                     learner_device_ids=(1, 2), actor_threads_per_device=2,
                     envs_per_actor_thread=8)
    first, second = sebulba.train(config), sebulba.train(config)
    assert first.policy_lags == second.policy_lags == [0] + [1] * 11
    assert_trees_equal(second.learner_state, first.learner_state)
    assert_trees_equal(second.learner_keys, first.learner_keys)
    config.seed = 1
    other = sebulba.train(config)
    assert max(relative_differences(other.params, first.params).values()) > 0.1


def test_a_run_with_two_batches_per_actor_thread_repeats_bit_for_bit(monkeypatch):
    # Stepping one batch while acting on the other changes the threads' timing, not what the
    # fixed protocol computes. Each of the 2 actor threads steps 2 batches of 8 / 2 envs.
    made = []
    make = host_env.make

    def recording_make(kind, name, num_envs, **kwargs):
        made.append(num_envs)
        return make(kind, name, num_envs, **kwargs)

    monkeypatch.setattr(host_env, "make", recording_make)
    config = _config(total_env_steps=2 * 8 * 8 * 6, actor_device_ids=(0,),
                     learner_device_ids=(1, 2), actor_threads_per_device=2,
                     envs_per_actor_thread=8)
    config.env.batches = 2
    first = sebulba.train(config)
    assert made.count(4) == 4 and 8 not in made  # (besides the evaluation's batch)
    second = sebulba.train(config)
    assert first.policy_lags == second.policy_lags == [0] + [1] * 5
    assert_trees_equal(second.learner_state, first.learner_state)
    assert first.history[-1]["env_steps"] == 2 * 8 * 8 * 6
    assert first.run_info["config"]["env"]["batches"] == 2


@pytest.mark.parametrize("batches", [1, 2])
def test_lag_zero_is_on_policy(batches):
    # With two batches an actor thread acts on one while the other steps: each batch's
    # actions, behaviour logits and observations must still reach the learner together.
    config = _config(policy_lag=0, total_env_steps=2 * 8 * 8 * 6, actor_device_ids=(0,),
                     learner_device_ids=(0, 1), envs_per_actor_thread=8,
                     actor_threads_per_device=2, log_every_updates=1)
    config.env.batches = batches
    result = sebulba.train(config)
    assert result.policy_lags == [0] * 6
    # Behaviour and learner policies are the same parameters: every ratio pi/mu is 1 (up to
    # float differences between the actor's and the learner's batch shapes).
    for record in result.history:
        assert record["mean_rho"] == pytest.approx(1.0, abs=1e-5)


def test_latest_staleness_lag_is_bounded_by_the_queue():
    queue_size = 2
    config = _config(staleness="latest", queue_size=queue_size, actor_device_ids=(0,),
                     learner_device_ids=(1, 2), actor_threads_per_device=2,
                     total_env_steps=2 * 12 * 8 * 15, log_every_updates=5)
    result = sebulba.train(config)
    assert len(result.policy_lags) == 15
    assert all(0 <= lag <= queue_size + 2 for lag in result.policy_lags)
    assert max(r["policy_lag_max"] for r in result.history) == max(result.policy_lags)


# ---------------------------------------------------------------------------------------------
# Learning


def test_learns_cartpole():
    """V-trace on envpool CartPole-v1 (1 actor + 1 learner device, 32 envs, T = 32, fixed lag
    1): the mean episode return over the last 100K of 500K environment steps is >= 60 (a
    uniformly random policy scores about 22). Seeds 0 to 5 reached 188, 131, 223, 279, 169 and
    196 on one AMD EPYC; seed 0 reached 392 with only XLA's code generation changed (AVX2), so
    on another CPU the seed is a fresh draw from that spread, and the bound sits under half of
    its lowest figure."""
    config = sebulba_vtrace_cartpole.get_config()
    config.actor_device_ids = (0,)
    config.learner_device_ids = (1,)
    config.total_env_steps = 500_000
    config.log_every_updates = 10
    result = sebulba.train(config)
    late = [r for r in result.history if r["env_steps"] > 400_000 and r["episodes"]]
    returns = sum(r["episode_return"] * r["episodes"] for r in late)
    episodes = sum(r["episodes"] for r in late)
    # 32 environments (derived from this machine, or set by the config) x T = 32 per update.
    assert result.history[-1]["env_steps"] >= 500_000
    assert returns / episodes >= 60, [round(r["episode_return"]) for r in result.history]


# ---------------------------------------------------------------------------------------------
# Faults


def test_crashing_actor_thread_ends_the_run_with_its_error(monkeypatch):
    original = envpool_env.EnvpoolEnv.step
    calls = {"n": 0}

    def flaky_step(self, action):
        calls["n"] += 1
        if calls["n"] == 40:
            raise RuntimeError("boom: simulated environment failure")
        return original(self, action)

    monkeypatch.setattr(envpool_env.EnvpoolEnv, "step", flaky_step)
    config = _config(total_env_steps=10**9, actor_device_ids=(0,), learner_device_ids=(0,),
                     actor_threads_per_device=2)
    before = set(threading.enumerate())
    start = time.monotonic()
    with pytest.raises(ThreadFailure) as info:
        sebulba.train(config)
    elapsed = time.monotonic() - start
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "boom: simulated environment failure" in str(info.value)
    assert "flaky_step" in str(info.value)  # the thread's traceback travels with the error
    assert elapsed < 60  # compile included; without the stop flag this would run for hours
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]


def test_an_evaluation_longer_than_timeout_s_does_not_fail_the_run(monkeypatch):
    # The actors wait for the learner while it evaluates; an evaluation lasting several times
    # `timeout_s` (slowed down here on purpose) must not read to them as a stalled learner.
    # 3 s: long enough that start-up and first calls on a slow, busy 2-core machine never
    # read as a stall themselves.
    timeout_s = 3.0
    real = sebulba.runner.make_evaluator

    def slow_evaluator(*args, **kwargs):
        evaluate = real(*args, **kwargs)

        def slow(params, key):
            time.sleep(1.5 * timeout_s)
            return evaluate(params, key)

        return slow

    monkeypatch.setattr(sebulba.runner, "make_evaluator", slow_evaluator)
    config = _config(total_env_steps=12 * 8 * 4, actor_device_ids=(0,), learner_device_ids=(0,),
                     timeout_s=timeout_s, eval_every_updates=2, eval_episodes=2,
                     eval_max_steps=20, log_every_updates=2)  # 4 updates, 2 evaluations
    result = sebulba.train(config)
    assert [r["updates"] for r in result.history] == [2, 4]
    assert all("eval_return" in r for r in result.history)
    assert result.eval_seconds >= 2 * 1.5 * timeout_s


def test_a_stalled_learner_still_times_out_the_actors():
    # The counterpart: without progress from the learner (and no evaluation under way), an
    # actor's wait ends after timeout_s.
    from sebulba.runner import ProgressClock

    clock = ProgressClock()
    start = time.monotonic()
    assert not clock.expired(start, 0.2)
    time.sleep(0.3)
    assert clock.expired(start, 0.2)
    with clock.busy():
        assert not clock.expired(start, 0.2)  # evaluating: however long it takes
    assert not clock.expired(start, 0.2)  # the evaluation's end counts as progress


def test_a_nan_stops_the_run_naming_the_update_before_any_checkpoint(tmp_path):
    # An absurd step size on purpose: the parameters overflow to inf, then NaN.
    from podracer.faults import NonFiniteError

    config = _config(total_env_steps=10**9, actor_device_ids=(0,), learner_device_ids=(0,),
                     checkpoint_every_updates=1, log_every_updates=1)
    config.agent.learning_rate = 1e30
    config.agent.max_grad_norm = 1e30
    workdir = str(tmp_path / "run")
    with pytest.raises(NonFiniteError) as info:
        sebulba.train(config, workdir)
    message = str(info.value)
    bad_update = int(message.split()[1].rstrip(":").replace(",", ""))
    assert message.startswith("update ") and "NaN or inf" in message
    saved = [int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()]
    # Checkpoints every update up to the failure, none from the failed state or after it.
    assert saved and max(saved) == bad_update - 1
    assert not os.path.exists(os.path.join(workdir, "run.lock"))  # a failed run unlocks too


def test_a_missing_parent_workdir_fails_before_anything_starts(tmp_path):
    from podracer.workdir import WorkdirError

    start = time.monotonic()
    with pytest.raises(WorkdirError, match="parent directory .* does not exist"):
        sebulba.train(_config(), str(tmp_path / "missing" / "run"))
    assert time.monotonic() - start < 5  # nothing compiled, no environment made
    assert os.listdir(tmp_path) == []


def test_a_locked_workdir_is_refused_before_compiling_and_left_untouched(tmp_path, monkeypatch):
    # Another run holds the workdir (flock is per open file, so a second hold taken in this
    # process conflicts as one from another process would). The refused run must not compile,
    # start anything or touch the workdir: not even replace the records of an attempt that
    # never finished a checkpoint, as a fresh start there would.
    from podracer.session import LOCK_FILE, WorkdirLock, WorkdirLockedError

    workdir = str(tmp_path / "run")
    held = WorkdirLock.acquire(workdir)
    try:
        with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
            f.write('{"env_steps": 96, "updates": 1}\n')
        before = snapshot(workdir)
        built = []
        monkeypatch.setattr(sebulba.runner, "init_learner",
                            lambda *args, **kwargs: built.append("init_learner"))
        monkeypatch.setattr(sebulba.runner, "make_update",
                            lambda *args, **kwargs: built.append("make_update"))
        start = time.monotonic()
        with pytest.raises(WorkdirLockedError, match="in use by a run that is still alive") as info:
            sebulba.train(_config(actor_device_ids=(0,), learner_device_ids=(0,)), workdir)
        assert time.monotonic() - start < 5  # nothing compiled, no environment made
        assert built == []
        assert info.value.holder["pid"] == os.getpid()  # it names the holder
        assert snapshot(workdir) == before  # the holder's lock file and the records as they were
        assert held.held
    finally:
        held.release()
    assert not os.path.exists(os.path.join(workdir, LOCK_FILE))


def test_a_run_refused_as_its_learner_step_traces_leaves_no_trace_in_its_workdir(tmp_path):
    # The same under Sebulba: PPO's minibatch count must divide the 8 x 12 = 96 transitions a
    # learner device receives, which it checks when the learner's update is traced.
    from agents import ppo
    from podracer.config import ConfigError

    config = _config(actor_device_ids=(0,), learner_device_ids=(0,))
    config.agent = ppo.default_config()
    config.agent.num_minibatches = 7
    assert_a_refused_run_leaves_no_trace(lambda workdir: sebulba.train(config, workdir),
                                         tmp_path, ConfigError,
                                         "agent.num_minibatches.* does not divide the 96")
