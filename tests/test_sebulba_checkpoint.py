"""Sebulba checkpoints, resumption, pre-emption and evaluation.

A resumed Sebulba run restarts its environments (envpool cannot save them), so unlike Anakin's
resume test this one cannot compare against an uninterrupted run: it checks what a resumption
promises instead. The learner state comes back bit for bit; updates continue at u + 1 with the
restored parameters (so the first update after a resume has policy lag 0, as the first update
of a fresh run does); the log continues without a missing or repeated update; and SIGTERM
leaves a checkpoint at the update it stopped after.
"""

import json
import os
import shutil
import signal
import time

import envpool
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    TINY_SEBULBA_ENVS,
    TINY_SEBULBA_T,
    checkpoint_steps,
    snapshot,
    start_experiment,
    strip_agent_field,
    tiny_sebulba_muzero_config,
    wait_until,
)

import sebulba
from podracer.agent import Agent
from podracer.checkpoint import load_arrays, read_metadata
from podracer.config import ConfigError
from podracer.metrics import read_records
from sebulba import envpool_env

ENVS, T = TINY_SEBULBA_ENVS, TINY_SEBULBA_T
STEPS_PER_UPDATE = ENVS * T  # one process, one actor thread


def _small(config, **overrides):
    config.envs_per_actor_thread = ENVS
    config.rollout_length = T
    config.timeout_s = 60.0
    for field, value in overrides.items():
        config[field] = value
    return config


def _named_leaves(tree) -> dict[str, np.ndarray]:
    """Leaves by their path of field names, whether `tree` holds dataclasses or the nested
    dicts that `load_arrays` returns."""
    def name(entry):
        for attr in ("name", "key", "idx"):
            if hasattr(entry, attr):
                return str(getattr(entry, attr))
        return str(entry)

    leaves = jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]
    return {"/".join(name(e) for e in path): np.asarray(x) for path, x in leaves}


def _assert_bitwise_equal(actual, expected):
    actual, expected = _named_leaves(actual), _named_leaves(expected)
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


# ---------------------------------------------------------------------------------------------
# Real processes: SIGKILL, resume, SIGTERM, resume to the end.

NUM_UPDATES = 120
LOG_EVERY = 10
OVERRIDES = {
    "envs_per_actor_thread": ENVS,
    "rollout_length": T,
    "total_env_steps": NUM_UPDATES * STEPS_PER_UPDATE,
    "log_every_updates": LOG_EVERY,
    "checkpoint_every_updates": 20,
    "eval_every_updates": 20,
    "eval_episodes": 4,
    "eval_max_steps": 50,
}


def _start(workdir, cache):
    command = ["-m", "experiments.sebulba",
               "--config=experiments/configs/sebulba_vtrace_cartpole.py",
               *(f"--config.{k}={v}" for k, v in OVERRIDES.items()), f"--workdir={workdir}"]
    return start_experiment(command, cache=cache, num_devices=1)


def test_killed_then_preempted_run_resumes_where_its_checkpoints_left_off(tmp_path):
    workdir, cache = str(tmp_path / "run"), str(tmp_path / "jax_cache")

    # Killed outright once it has logged past a checkpoint: what it logged after it is lost.
    proc = _start(workdir, cache)
    wait_until(proc, lambda: checkpoint_steps(workdir) and read_records(workdir) and
               read_records(workdir)[-1]["updates"] >= checkpoint_steps(workdir)[-1] + LOG_EVERY,
               "a checkpoint and a record after it")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = checkpoint_steps(workdir)[-1]
    assert killed_at < NUM_UPDATES

    # Rerun: it resumes, and is pre-empted (SIGTERM) once it has saved a checkpoint of its own.
    proc = _start(workdir, cache)
    wait_until(proc, lambda: checkpoint_steps(workdir)[-1] > killed_at,
               "a checkpoint after resuming")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert f"Resuming from the checkpoint at update {killed_at:,}" in out, out
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "Stopped by signal 15" in out and "rerun the same command to resume" in out, out
    stopped_at = read_records(workdir)[-1]["updates"]
    assert checkpoint_steps(workdir)[-1] == stopped_at < NUM_UPDATES
    meta = read_metadata(os.path.join(workdir, "checkpoints"))
    assert meta["updates"] == stopped_at and meta["env_steps"] == stopped_at * STEPS_PER_UPDATE

    # Rerun again: it finishes.
    proc = _start(workdir, cache)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert f"Resuming from the checkpoint at update {stopped_at:,}" in out, out
    with open(os.path.join(workdir, "run_info.json")) as f:
        assert json.load(f)["resumed_from_updates"] == stopped_at
    assert checkpoint_steps(workdir)[-1] == NUM_UPDATES
    assert len(checkpoint_steps(workdir)) <= 3  # checkpoint_keep
    assert read_metadata(os.path.join(workdir, "checkpoints"))["updates"] == NUM_UPDATES

    # One record per LOG_EVERY updates plus the one where SIGTERM stopped the run: nothing the
    # killed process logged after its checkpoint survives, nothing is missing. Each record's
    # `policy_lags` lists its updates, one each, so together they cover 1..NUM_UPDATES once.
    records = read_records(workdir)
    updates = [r["updates"] for r in records]
    assert updates == sorted(set(range(LOG_EVERY, NUM_UPDATES + 1, LOG_EVERY)) | {stopped_at})
    assert [r["env_steps"] for r in records] == [u * STEPS_PER_UPDATE for u in updates]
    assert [len(r["policy_lags"]) for r in records] == list(np.diff([0] + updates))
    # Fixed lag 1: a fresh run's first update and a resumed run's first one act with the
    # parameters they start from (lag 0); every other update's batch is one version behind.
    lags = [lag for r in records for lag in r["policy_lags"]]
    firsts = {0, killed_at, stopped_at}  # 0-based positions of updates 1, u + 1, u' + 1
    assert [i for i, lag in enumerate(lags) if lag == 0] == sorted(firsts)
    assert all(lag == 1 for i, lag in enumerate(lags) if i not in firsts)
    # Greedy evaluations every 20 updates; CartPole scores 1 per step and they stop at 50.
    evaluated = [r for r in records if "eval_return" in r]
    assert [r["updates"] for r in evaluated] == list(range(20, NUM_UPDATES + 1, 20))
    for record in evaluated:
        assert 1 <= record["eval_return"] <= 50 and record["eval_return_std"] >= 0
        assert 0 <= record["eval_finished"] <= 1
    # TensorBoard hides what the killed process logged after its checkpoint.
    from tensorboard.backend.event_processing import event_accumulator

    reader = event_accumulator.EventAccumulator(workdir)
    reader.Reload()
    assert [e.step for e in reader.Scalars("loss")] == [r["env_steps"] for r in records]
    evals = reader.Scalars("eval_return")
    assert [e.step for e in evals] == [r["env_steps"] for r in evaluated]
    np.testing.assert_allclose([e.value for e in evals],
                               [r["eval_return"] for r in evaluated], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# In process, with MuZero (whose learner state holds a replay buffer): SIGTERM, and the saved
# state restored exactly.

STOP_SIGNAL_AT = 10  # the record after which the run sends itself SIGTERM


@pytest.fixture(scope="module")
def preempted(tmp_path_factory):
    """A run that sends itself SIGTERM while logging update 10 (from the learner thread) and
    waits for the handler: the learner sees the flag after its next update, 11."""
    workdir = str(tmp_path_factory.mktemp("preempted"))
    config = tiny_sebulba_muzero_config(total_env_steps=60 * STEPS_PER_UPDATE,
                                        log_every_updates=5, checkpoint_every_updates=0,
                                        eval_every_updates=0)

    def log_fn(record):
        if record["updates"] == STOP_SIGNAL_AT:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # the main thread runs the handler meanwhile

    return config, workdir, sebulba.train(config, workdir, log_fn=log_fn)


def test_sigterm_stops_after_the_next_update_with_a_checkpoint(preempted):
    config, workdir, result = preempted
    stopped_at = STOP_SIGNAL_AT + 1
    assert result.interrupted and result.resumed_from_updates is None
    assert [r["updates"] for r in result.history] == [5, 10, stopped_at]
    assert checkpoint_steps(workdir) == [stopped_at]  # checkpoint_every_updates=0: only this
    assert int(jax.device_get(result.learner_state.updates)[0]) == stopped_at
    assert result.checkpoint_seconds > 0
    assert not os.path.exists(os.path.join(workdir, "run.lock"))  # released on SIGTERM too
    # What was saved is the state the run stopped with, MuZero's replay included: one window
    # per environment per update, 11 x 8 = 88 windows written into its 128 / T = 16 slots,
    # so the next one is slot 88 mod 16 = 8.
    replay = result.learner_state.replay
    assert jax.device_get(replay.adds).tolist() == [stopped_at]
    assert jax.device_get(replay.next_index).tolist() == [stopped_at * ENVS % (128 // T)]
    saved, meta = load_arrays(os.path.join(workdir, "checkpoints"))
    assert meta["updates"] == stopped_at and meta["num_processes"] == 1
    assert meta["env_steps"] == stopped_at * STEPS_PER_UPDATE
    _assert_bitwise_equal(saved["learner_state"]["replay"], replay)
    _assert_bitwise_equal(saved, {"learner_state": result.learner_state,
                                  "learner_keys": result.learner_keys})
    # The config leaves the network to the agent ("auto"): config.json and the checkpoint
    # record what it chose for CartPole's vectors, so a later "auto" cannot silently differ.
    assert config.agent.network == "auto"
    with open(os.path.join(workdir, "config.json")) as f:
        assert json.load(f)["agent"]["network"] == "mlp"
    assert meta["config"]["agent"]["network"] == "mlp"


def test_rerun_restores_the_saved_learner_state_bit_for_bit(preempted):
    config, workdir, result = preempted
    stopped_at = STOP_SIGNAL_AT + 1
    # total_env_steps may change on resuming; here to the checkpoint's: nothing left to do, so
    # the run returns exactly what it restored (without compiling or starting anything).
    config = _small(config.copy_and_resolve_references(),
                    total_env_steps=stopped_at * STEPS_PER_UPDATE)
    restored = sebulba.train(config, workdir)
    assert restored.resumed_from_updates == stopped_at and not restored.interrupted
    assert restored.run_seconds == 0.0
    _assert_bitwise_equal(restored.learner_state.replay, result.learner_state.replay)
    _assert_bitwise_equal(restored.learner_state, result.learner_state)
    _assert_bitwise_equal(restored.learner_keys, result.learner_keys)
    assert [r["updates"] for r in restored.history] == [5, 10, stopped_at]
    assert not os.path.exists(os.path.join(workdir, "run.lock"))  # released with nothing to do


def test_a_checkpoint_made_with_another_config_is_not_resumed(preempted):
    config, workdir, _ = preempted
    config = config.copy_and_resolve_references()
    config.agent.num_simulations = 3
    before = snapshot(workdir)
    with pytest.raises(ConfigError) as info:
        sebulba.train(config, workdir)
    assert info.value.fields == ["agent.num_simulations"]
    assert "config.agent.num_simulations: checkpoint 2, this run 3" in str(info.value)
    assert "pass a new --workdir" in str(info.value)
    assert "resume_allow_changes" in str(info.value)  # it reshapes nothing: may opt in
    assert snapshot(workdir) == before  # nothing moved, written or appended


def test_a_checkpoint_from_before_a_declared_field_resumes_at_its_older_value(preempted,
                                                                           tmp_path):
    # MuZero's registration declares reward_scale=1.0 (`introduced`): a workdir made before
    # the field existed resumes with it, and another value is refused naming the one to pass.
    config, workdir, result = preempted
    copy = str(tmp_path / "copy")
    shutil.copytree(workdir, copy)
    strip_agent_field(copy, "reward_scale")
    stopped_at = STOP_SIGNAL_AT + 1
    config = _small(config.copy_and_resolve_references(),
                    total_env_steps=stopped_at * STEPS_PER_UPDATE)
    scaled = config.copy_and_resolve_references()
    scaled.agent.reward_scale = 2.0
    before = snapshot(copy)
    with pytest.raises(ConfigError) as info:
        sebulba.train(scaled, copy)
    assert info.value.fields == ["agent.reward_scale"]
    assert "To resume it as it ran, pass --config.agent.reward_scale=1.0." in str(info.value)
    assert snapshot(copy) == before
    assert config.agent.reward_scale == 1.0
    restored = sebulba.train(config, copy)  # nothing left to run: returns what it restored
    assert restored.resumed_from_updates == stopped_at
    _assert_bitwise_equal(restored.learner_state, result.learner_state)


def test_changed_replay_capacity_or_learner_devices_are_refused_untouched(preempted):
    config, workdir, _ = preempted
    before = snapshot(workdir)
    bigger = config.copy_and_resolve_references()
    bigger.agent.replay_capacity *= 2
    with pytest.raises(ConfigError) as info:
        sebulba.train(bigger, workdir)
    assert "agent.replay_capacity" in info.value.fields
    assert "reshape the saved state" in str(info.value)
    assert "resume_allow_changes" not in str(info.value).split("new run.")[-1]
    assert snapshot(workdir) == before
    more = config.copy_and_resolve_references()
    more.learner_device_ids = (0, 1)
    with pytest.raises(ConfigError) as info:
        sebulba.train(more, workdir)
    assert "num_learner_devices" in info.value.fields
    assert snapshot(workdir) == before


# ---------------------------------------------------------------------------------------------
# Evaluation of a hand-made policy


def _always_left(seen_evaluation: list) -> Agent:
    def actor_step(params, actor_state, timestep, key, *, evaluation=False):
        seen_evaluation.append(evaluation)  # at tracing
        return jnp.zeros(timestep.step_type.shape, jnp.int32), actor_state, {}

    return Agent(init=None, actor_step=actor_step, learner_step=None,
                 init_actor_state=lambda batch_size: (), actor_params=lambda s: s)


def _reference_lengths(num_envs: int, seed: int) -> np.ndarray:
    """Steps to the end of each environment's first episode when always pushing left, from
    envpool itself (CartPole pays 1 per step, so these are also the returns)."""
    # Played here directly, so under the library's own filter for gymnasium's warning about
    # envpool's float64 Box bounds, which envpool raises at make and at reset
    # (test_sebulba_envpool checks that the library's start-up uses it).
    with envpool_env._quiet_box_precision():
        env = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=num_envs, seed=seed)
        env.reset()
        lengths = np.zeros(num_envs, int)
        done = np.zeros(num_envs, bool)
        for _ in range(500):
            _, _, terminated, truncated, _ = env.step(np.zeros(num_envs, np.int32))
            lengths += ~done
            done |= terminated | truncated
            if done.all():
                break
        env.close()
    return lengths


def test_evaluation_plays_one_episode_per_environment_up_to_max_steps():
    seen: list = []
    agent = _always_left(seen)
    device = jax.devices()[0]
    # Cut at 3 steps: no CartPole episode can end so soon (the pole starts within 0.05 rad of
    # upright and must pass 0.21 rad; a push of 10 N tips it by under 0.05 rad in 3 steps of
    # 0.02 s), so every episode counts 3 steps' reward of 1.
    env = envpool_env.EnvpoolEnv("CartPole-v1", 16, seed=3)
    try:
        out = sebulba.make_evaluator(agent, env, device, max_steps=3)({}, jax.random.PRNGKey(0))
    finally:
        env.close()
    assert out == {"eval_return": 3.0, "eval_return_std": 0.0, "eval_finished": 0.0,
                   "eval_length": 3.0}
    # Uncut: a constant push topples every pole; each return is the episode's length, and
    # nothing after its end (envpool already playing the next episode) counts.
    env = envpool_env.EnvpoolEnv("CartPole-v1", 16, seed=3)
    try:
        out = sebulba.make_evaluator(agent, env, device, max_steps=500)(
            {}, jax.random.PRNGKey(0))
    finally:
        env.close()
    expected = _reference_lengths(16, seed=3)  # the same seed: the same first episodes
    assert out["eval_finished"] == 1.0
    assert out["eval_return"] == pytest.approx(expected.mean())
    assert out["eval_return_std"] == pytest.approx(expected.std())
    assert out["eval_length"] == out["eval_return"]
    assert set(seen) == {True}  # the greedy/deterministic policy
