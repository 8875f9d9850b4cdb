"""podracer.workdir through Anakin: a workdir is resumed only by the run it belongs to.

A rerun that differs from the checkpoint (a shape-changing field, a non-shape field, another
device count) is refused before compiling, names every difference with both values, and leaves
every file of the workdir as it was; `resume_allow_changes` continues a run with changed
non-shape values and records them; only a checkpoint that fails its integrity check is set
aside; a fresh start after an attempt killed before its first checkpoint replaces that
attempt's records; a NaN stops the run naming the update, keeping the last good checkpoint; a
bad --workdir fails before anything compiles.
"""

import glob
import json
import os
import shutil
import signal

import jax
import numpy as np
import pytest
from conftest import (
    SMALL_CATCH_STEPS_PER_CHUNK,
    SMALL_CATCH_UPDATES_PER_CHUNK,
    assert_a_refused_run_leaves_no_trace,
    assert_trees_equal,
    checkpoint_steps,
    garble_arrays,
    small_catch_config,
    snapshot,
    start_experiment,
    strip_agent_field,
    wait_until,
)

import agents
import anakin
from podracer import replication
from podracer import workdir as workdir_lib
from podracer.config import ConfigError
from podracer.faults import NonFiniteError
from podracer.metrics import read_records
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec

UPDATES_PER_CHUNK = SMALL_CATCH_UPDATES_PER_CHUNK
STEPS_PER_CHUNK = SMALL_CATCH_STEPS_PER_CHUNK
_config = small_catch_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run (checkpoints at updates 10 and 20) and its workdir."""
    workdir = str(tmp_path_factory.mktemp("finished"))
    result = anakin.train(_config(), workdir)
    assert checkpoint_steps(workdir) == [10, 20]
    return workdir, result


def _copy(workdir, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(workdir, copy)
    return copy


def test_a_finished_run_started_again_does_not_compile_its_chunk(finished, tmp_path,
                                                                  monkeypatch):
    from anakin import runner

    compiled = []
    original = runner._compile
    monkeypatch.setattr(runner, "_compile",
                        lambda *a, **k: compiled.append(1) or original(*a, **k))
    workdir = _copy(finished[0], tmp_path)
    result = anakin.train(_config(), workdir)
    assert compiled == []  # the checkpoint holds every chunk: nothing to run
    assert result.resumed_from_updates == 20 and not result.interrupted
    assert_trees_equal(result.state.learner_state.params, finished[1].state.learner_state.params)
    # One chunk short of the end, the chunk is compiled and run.
    half = _copy(finished[0], tmp_path / "half")
    result = anakin.train(_config(total_env_steps=6 * STEPS_PER_CHUNK), half)
    assert compiled == [1] and result.resumed_from_updates == 20
    assert [r["updates"] for r in result.history][-1] == 30


def _fail_if_compiled(monkeypatch):
    """Makes compiling or running the run's programs fail the test. Tracing them for their
    shapes is allowed: the checkpoint's layout is compared with the state's before anything
    compiles. The runner's cache of programs is emptied, so that every program is built
    through the guard."""
    from anakin import runner

    real = replication.replicate

    def replicate(fn, *args, **kwargs):
        replicated = real(fn, *args, **kwargs)

        def guarded(*call_args):
            if not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(call_args)):
                pytest.fail("a program ran before the refusal")
            return replicated(*call_args)

        return guarded

    monkeypatch.setattr(replication, "replicate", replicate)
    monkeypatch.setattr(runner, "_PROGRAMS", {})
    monkeypatch.setattr(runner, "_compile",
                        lambda *a, **k: pytest.fail("compiled before the refusal"))


@pytest.mark.parametrize("field, value, reshapes", [
    ("num_envs", 32, True),
    ("agent.hidden_sizes", (64, 32), True),
    ("agent.learning_rate", 3e-4, False),
    ("agent.entropy_cost", 0.05, False),
])
def test_a_changed_field_is_refused_naming_it_and_nothing_changes(finished, field, value,
                                                                   reshapes, monkeypatch):
    workdir, _ = finished
    before = snapshot(workdir)
    _fail_if_compiled(monkeypatch)
    with pytest.raises(workdir_lib.ResumeError) as info:
        anakin.train(_config(**{field: value}), workdir)
    message = str(info.value)
    with open(os.path.join(workdir, "config.json")) as f:
        saved = json.load(f)
    for part in field.split("."):
        saved = saved[part]
    assert info.value.fields == [field]
    now = json.loads(json.dumps(value))  # as the resolved config holds it (tuples as lists)
    assert f"config.{field}: checkpoint {saved!r}, this run {now!r}" in message
    assert "rerun with the checkpoint's values" in message and "new --workdir" in message
    assert ("reshape the saved state" in message) == reshapes
    # The opt-in is offered only where it could work: no array changes shape.
    assert ("resume_allow_changes" in message) == (not reshapes)
    assert snapshot(workdir) == before


def test_another_device_count_is_refused_and_nothing_changes(finished, monkeypatch):
    workdir, _ = finished
    before = snapshot(workdir)
    _fail_if_compiled(monkeypatch)
    with pytest.raises(ConfigError) as info:
        anakin.train(_config(num_devices=1), workdir)
    assert "num_devices" in info.value.fields
    assert "num_devices: checkpoint 2, this run 1" in str(info.value)
    assert snapshot(workdir) == before


def test_resume_allow_changes_continues_with_the_new_value_and_records_it(finished, tmp_path):
    workdir = _copy(finished[0], tmp_path)
    config = _config(**{"agent.learning_rate": 3e-4, "total_env_steps": 6 * STEPS_PER_CHUNK,
                        "resume_allow_changes": ("agent.learning_rate",)})
    result = anakin.train(config, workdir)
    assert result.resumed_from_updates == 20
    assert [r["updates"] for r in result.history] == [5, 10, 15, 20, 25, 30]
    # The new value is the one in force, not the one the restored state held.
    in_force = replication.unreplicate(result.state.learner_state.opt_state.hyperparams)
    assert float(in_force["learning_rate"]) == pytest.approx(3e-4, rel=1e-6)
    records = read_records(workdir)
    assert [r["updates"] for r in records] == [5, 10, 15, 20, 25, 30]
    assert records[4]["config_changes"] == {  # the finished run had the config's own value
        "agent.learning_rate": {"checkpoint": _config().agent.learning_rate, "now": 3e-4}}
    assert records[4]["config_changed_at_update"] == 20
    assert "config_changes" not in records[5]
    with open(os.path.join(workdir, "config.json")) as f:
        saved = json.load(f)
    assert saved["agent"]["learning_rate"] == 3e-4
    assert saved["resume_allow_changes"] == ["agent.learning_rate"]


def test_opting_in_does_not_allow_a_shape_change(finished, monkeypatch):
    workdir, _ = finished
    before = snapshot(workdir)
    _fail_if_compiled(monkeypatch)
    with pytest.raises(ConfigError) as info:
        anakin.train(_config(num_envs=32, resume_allow_changes=("num_envs",)), workdir)
    assert "reshape the saved state" in str(info.value)
    assert snapshot(workdir) == before


def test_a_run_records_what_auto_chose_and_a_rerun_naming_it_resumes(finished, tmp_path):
    # The config leaves V-trace's torso to the agent ("auto": an MLP for Catch's small board);
    # config.json and the checkpoint hold the choice, so naming it explicitly is the same run.
    workdir = _copy(finished[0], tmp_path)
    assert _config().agent.torso == "auto"
    with open(os.path.join(workdir, "config.json")) as f:
        assert json.load(f)["agent"]["torso"] == "mlp"
    config = _config(**{"agent.torso": "mlp", "total_env_steps": 5 * STEPS_PER_CHUNK})
    assert anakin.train(config, workdir).resumed_from_updates == 20


_LAYOUT = [["['params']['w']", [400, 128], "float32"]]


def _check(saved_torso, current_torso, saved_layout, current_layout=_LAYOUT):
    metadata = {"updates": 20, "config": {"agent": {"torso": saved_torso}},
                "layout": saved_layout}
    return workdir_lib.check_compatible(
        metadata, directory="/nowhere/checkpoints", config={"agent": {"torso": current_torso}},
        layout=current_layout, run_shape={})


def test_a_checkpoint_that_recorded_auto_resumes_when_every_array_agrees():
    # Checkpoints made before runs recorded the agent's choice hold "auto" itself.
    assert _check("auto", "mlp", _LAYOUT) == {}
    # A recorded choice is compared like any other value.
    with pytest.raises(workdir_lib.ResumeError):
        _check("conv", "mlp", _LAYOUT)
    # Without a recorded layout nothing shows that "auto" chose the same: refused.
    with pytest.raises(workdir_lib.ResumeError):
        _check("auto", "mlp", None)


def test_a_checkpoint_whose_auto_chose_otherwise_is_refused_naming_the_field():
    conv_layout = [["['params']['w']", [3200, 128], "float32"]]
    with pytest.raises(workdir_lib.ResumeError) as info:
        _check("auto", "conv", _LAYOUT, conv_layout)
    message = str(info.value)
    assert info.value.fields == ["agent.torso"]
    assert "config.agent.torso: checkpoint 'auto', this run 'conv'" in message
    assert "reshape the saved state" in message
    assert 'config.agent.torso was "auto" when the checkpoint was made' in message
    assert "--config.agent.torso=<its value>" in message


def test_a_width_left_to_the_agent_resumes_when_every_array_agrees():
    # MuZero's hidden_sizes=None: checkpoints made before runs recorded the width hold None.
    def check(saved, layout):
        metadata = {"updates": 20, "config": {"agent": {"name": "muzero", **saved}},
                    "layout": _LAYOUT}
        return workdir_lib.check_compatible(
            metadata, directory="/nowhere/checkpoints",
            config={"agent": {"name": "muzero", "hidden_sizes": [128]}}, layout=layout,
            run_shape={})

    assert check({"hidden_sizes": None}, _LAYOUT) == {}
    with pytest.raises(workdir_lib.ResumeError) as info:
        check({"hidden_sizes": None}, [["['params']['w']", [400, 64], "float32"]])
    assert "config.agent.hidden_sizes was null when the checkpoint was made" in str(info.value)
    # A field the checkpoint's config lacks (added to the code since) is not a choice left to
    # the agent: still a difference, even when the arrays agree.
    with pytest.raises(workdir_lib.ResumeError) as info:
        check({}, _LAYOUT)
    assert info.value.fields == ["agent.hidden_sizes"]
    assert "config.agent.hidden_sizes: checkpoint None, this run [128]" in str(info.value)
    assert "--config.resume_allow_changes='(\"agent.hidden_sizes\",)'" in str(info.value)


def test_a_field_added_since_the_checkpoint_resumes_only_when_named():
    # e.g. MuZero's terminal_head_gradient, added after EfficientZero's head runs began: the
    # new field's default need not be what the older code did, so the user says so.
    def check(allow):
        metadata = {"updates": 20, "config": {"agent": {"name": "muzero"}}, "layout": _LAYOUT}
        config = {"agent": {"name": "muzero", "head_share": 1.0}, "resume_allow_changes": allow}
        return workdir_lib.check_compatible(metadata, directory="/nowhere/checkpoints",
                                            config=config, layout=_LAYOUT, run_shape={})

    with pytest.raises(workdir_lib.ResumeError) as info:
        check(())
    assert info.value.fields == ["agent.head_share"]
    assert check(("agent.head_share",)) == {"agent.head_share": (None, 1.0)}


def test_a_field_the_checkpoint_predates_resumes_at_the_value_the_agent_declares():
    # Declared at registration (`introduced`): the value under which the agent behaves as
    # before the field existed.
    introduced = {"agent.average_first": False}

    def check(saved, current, allow=()):
        metadata = {"updates": 20, "config": {"agent": {"name": "x", **saved}},
                    "layout": _LAYOUT}
        config = {"agent": {"name": "x", **current}, "resume_allow_changes": allow}
        return workdir_lib.check_compatible(metadata, directory="/nowhere/checkpoints",
                                            config=config, layout=_LAYOUT, run_shape={},
                                            introduced=introduced)

    assert check({}, {"average_first": False}) == {}  # the same run
    with pytest.raises(workdir_lib.ResumeError) as info:
        check({}, {"average_first": True})
    message = str(info.value)
    assert info.value.fields == ["agent.average_first"]
    assert ("config.agent.average_first: absent from the checkpoint, which was made before the "
            "field existed, when the code behaved as False; this run True") in message
    assert "To resume it as it ran, pass --config.agent.average_first=False." in message
    # Opted in, it continues with the new value and records the change.
    assert check({}, {"average_first": True}, ("agent.average_first",)) == {
        "agent.average_first": (None, True)}
    # A checkpoint that holds the field is compared as usual, whatever was declared.
    with pytest.raises(workdir_lib.ResumeError):
        check({"average_first": True}, {"average_first": False})
    # A field nobody declared is still refused when the checkpoint lacks it.
    with pytest.raises(workdir_lib.ResumeError):
        check({}, {"average_first": False, "other": 1})


@pytest.mark.parametrize("name", ["vtrace", "ppo", "muzero", "efficientzero", "dqn"])
def test_each_declared_older_value_names_a_field_the_agent_builds_with(name):
    # A misspelt declaration would never match a field, and an invalid value would not build.
    spec = EnvSpec(observation=ArraySpec((5,), np.float32), action=DiscreteSpec(3))
    declared = agents.introduced(name)
    config = agents.default_config(name)
    for field, value in declared.items():
        assert field in config, field
        config[field] = value
    agents.make(config, spec)  # validates every field
    assert ("popart_average_first" in declared) == (name in ("vtrace", "ppo"))


def test_a_vtrace_workdir_from_before_popart_average_first_resumes_as_it_ran(finished,
                                                                             tmp_path):
    workdir = _copy(finished[0], tmp_path)
    strip_agent_field(workdir, "popart_average_first")
    longer = 5 * STEPS_PER_CHUNK
    before = snapshot(workdir)
    # The default (True) is not what that run did: refused, naming the value to pass.
    with pytest.raises(workdir_lib.ResumeError) as info:
        anakin.train(_config(total_env_steps=longer), workdir)
    assert info.value.fields == ["agent.popart_average_first"]
    assert "pass --config.agent.popart_average_first=False" in str(info.value)
    assert snapshot(workdir) == before
    result = anakin.train(
        _config(total_env_steps=longer, **{"agent.popart_average_first": False}), workdir)
    assert result.resumed_from_updates == 20
    assert [r["updates"] for r in read_records(workdir)] == [5, 10, 15, 20, 25]


def test_a_ppo_workdir_from_before_flat_optimizer_resumes_with_its_optimizer(tmp_path):
    # Made as the per-array optimizer made it: its Adam moments are one array per parameter,
    # which the flat optimizer's state (one vector) cannot take.
    workdir = str(tmp_path / "ppo")

    def config(flat=None, **overrides):
        c = _config(**overrides)
        c.agent = agents.default_config("ppo")
        if flat is not None:
            c.agent.flat_optimizer = flat
        return c

    anakin.train(config(False, total_env_steps=2 * STEPS_PER_CHUNK), workdir)
    strip_agent_field(workdir, "flat_optimizer")
    before = snapshot(workdir)
    with pytest.raises(workdir_lib.ResumeError) as info:
        anakin.train(config(), workdir)
    assert info.value.fields == ["agent.flat_optimizer"]
    assert "pass --config.agent.flat_optimizer=False" in str(info.value)
    assert snapshot(workdir) == before
    result = anakin.train(config(False), workdir)
    assert result.resumed_from_updates == 10
    assert [r["updates"] for r in read_records(workdir)] == [5, 10, 15, 20]


def test_a_dqn_workdir_from_before_anneal_lr_updates_resumes_with_a_constant_step_size(
        tmp_path):
    workdir = str(tmp_path / "dqn")

    def config(anneal=0, **overrides):
        c = _config(**overrides)
        c.agent = agents.default_config("dqn")
        c.agent.batch_size, c.agent.warmup, c.agent.anneal_lr_updates = 32, 32, anneal
        return c

    anakin.train(config(total_env_steps=2 * STEPS_PER_CHUNK), workdir)
    strip_agent_field(workdir, "anneal_lr_updates")
    before = snapshot(workdir)
    # An anneal is not what that run did: refused, naming the value to pass.
    with pytest.raises(workdir_lib.ResumeError) as info:
        anakin.train(config(anneal=100), workdir)
    assert info.value.fields == ["agent.anneal_lr_updates"]
    assert "pass --config.agent.anneal_lr_updates=0" in str(info.value)
    assert snapshot(workdir) == before
    result = anakin.train(config(), workdir)  # the default, 0: the constant step size it ran
    assert result.resumed_from_updates == 10
    assert [r["updates"] for r in read_records(workdir)] == [5, 10, 15, 20]


def test_only_a_damaged_checkpoint_is_set_aside(finished, tmp_path):
    workdir = _copy(finished[0], tmp_path)
    garble_arrays(os.path.join(workdir, "checkpoints", "20"))
    result = anakin.train(_config(), workdir)
    assert result.resumed_from_updates == 10  # the newest one that verifies
    assert len(os.listdir(os.path.join(workdir, "checkpoints.corrupt"))) == 1
    assert checkpoint_steps(workdir) == [10, 20]  # step 20 written again
    assert [r["updates"] for r in read_records(workdir)] == [5, 10, 15, 20]


def test_a_nan_stops_the_run_naming_the_update_and_keeps_the_good_checkpoint(finished,
                                                                              tmp_path):
    workdir = _copy(finished[0], tmp_path)
    # An absurd step size, allowed on purpose, drives the parameters to inf and then NaN.
    config = _config(**{"agent.learning_rate": 1e30, "agent.max_grad_norm": 1e30,
                        "total_env_steps": 8 * STEPS_PER_CHUNK,
                        "resume_allow_changes": ("agent.learning_rate", "agent.max_grad_norm")})
    with pytest.raises(NonFiniteError) as info:
        anakin.train(config, workdir)
    message = str(info.value)
    assert message.startswith("update ") and "NaN or inf" in message
    bad_update = int(message.split()[1].rstrip(":").replace(",", ""))
    assert 20 < bad_update <= 40
    assert "the last good checkpoint" in message
    # No checkpoint holds a state past the failure.
    assert max(checkpoint_steps(workdir)) < bad_update


def test_a_missing_parent_or_a_file_as_workdir_fails_before_compiling(tmp_path, monkeypatch):
    _fail_if_compiled(monkeypatch)
    with pytest.raises(workdir_lib.WorkdirError, match="parent directory .* does not exist"):
        anakin.train(_config(), str(tmp_path / "no" / "such" / "dir"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(workdir_lib.WorkdirError, match="is not a directory"):
        anakin.train(_config(), str(tmp_path / "file"))
    with pytest.raises(workdir_lib.WorkdirError, match="parent directory"):
        anakin.train(_config(), str(tmp_path / "file" / "run"))
    assert sorted(os.listdir(tmp_path)) == ["file"]  # nothing created


def test_check_writable_refuses_a_directory_it_cannot_write(tmp_path, monkeypatch):
    # Root may write anywhere, so a read-only mode cannot be relied on: make the probe fail.
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(workdir_lib.tempfile, "mkstemp", refuse)
    with pytest.raises(workdir_lib.WorkdirError, match="cannot write in .*Permission denied"):
        workdir_lib.check_writable(str(tmp_path))


def test_a_fresh_start_replaces_the_records_of_an_attempt_killed_before_its_first_checkpoint(
        tmp_path):
    workdir, cache = str(tmp_path / "run"), str(tmp_path / "cache")
    command = ["-m", "experiments.anakin", "--config=experiments/configs/vtrace_catch.py",
               "--config.num_devices=2", "--config.num_envs=16", "--config.rollout_length=10",
               f"--config.updates_per_chunk={UPDATES_PER_CHUNK}",
               f"--config.total_env_steps={400 * STEPS_PER_CHUNK}",
               "--config.checkpoint_every_updates=0", "--config.eval_every_updates=0",
               f"--workdir={workdir}"]
    proc = start_experiment(command, cache=cache, num_devices=2)
    wait_until(proc, lambda: len(read_records(workdir)) >= 3, "three records")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert checkpoint_steps(workdir) == []  # killed before its first checkpoint
    killed_records = read_records(workdir)

    # The same workdir, a short run: it starts afresh and its records replace the old ones.
    command[7] = f"--config.total_env_steps={2 * STEPS_PER_CHUNK}"
    proc = start_experiment(command, cache=cache, num_devices=2)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "replacing the records of an earlier attempt" in out
    records = read_records(workdir)
    assert [r["updates"] for r in records] == [5, 10]
    assert records[0]["wall_time"] < records[1]["wall_time"]
    assert len(killed_records) >= 3
    events = glob.glob(os.path.join(workdir, "events.out.tfevents.*"))
    assert len(events) == 1  # the killed attempt's event file is gone


def test_the_cli_refuses_a_changed_config_with_status_2_and_one_message(finished, tmp_path):
    workdir, _ = finished
    before = snapshot(workdir)
    command = ["-m", "experiments.anakin", "--config=experiments/configs/vtrace_catch.py",
               "--config.num_devices=2", "--config.num_envs=32", "--config.rollout_length=10",
               f"--config.updates_per_chunk={UPDATES_PER_CHUNK}",
               f"--config.total_env_steps={4 * STEPS_PER_CHUNK}",
               f"--config.checkpoint_every_updates={2 * UPDATES_PER_CHUNK}",
               "--config.eval_every_updates=0", f"--workdir={workdir}"]
    proc = start_experiment(command, cache=str(tmp_path / "cache"), num_devices=2)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-3000:]
    assert "error: Cannot resume the checkpoint at update 20" in err
    assert "config.num_envs: checkpoint 16, this run 32" in err
    assert "Traceback" not in err
    assert "compiled" not in out  # refused before compiling
    assert snapshot(workdir) == before


def test_a_run_refused_as_its_learner_step_traces_leaves_no_trace_in_its_workdir(tmp_path):
    # PPO refuses a minibatch count that does not divide the transitions a learner device
    # receives (here T = 10 x 8 environments = 80) when its learner step is traced, after the
    # workdir is locked: the workdir it made is gone again, an existing one is left as it was
    # (no empty checkpoints/ directory), and a rerun there with a fixed config starts afresh.
    from agents import ppo

    def config(num_minibatches):
        config = _config()
        config.agent = ppo.default_config()
        config.agent.num_minibatches = num_minibatches
        return config

    kept = assert_a_refused_run_leaves_no_trace(
        lambda workdir: anakin.train(config(7), workdir), tmp_path, ConfigError,
        "agent.num_minibatches.* does not divide the 80")
    anakin.train(config(4), kept)
    assert checkpoint_steps(kept) == [10, 20]
