"""What an Anakin run leaves in its workdir and on the console: config.json/config.yaml,
metrics.jsonl with greedy evaluations, TensorBoard event files (read back with TensorBoard's
own reader), and progress as a bar on a terminal or plain lines elsewhere."""

import contextlib
import io
import json
import os
import pathlib
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from conftest import assert_trees_equal

import anakin
import envs_jax
from experiments.configs import vtrace_catch
from podracer import metrics, replication
from podracer.agent import Agent


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("run"))
    config = vtrace_catch.get_config()
    config.num_devices = 2
    config.num_envs = 16
    config.rollout_length = 10
    config.updates_per_chunk = 5
    config.total_env_steps = 16 * 10 * 5 * 4  # 4 chunks
    config.eval_every_updates = 10  # after chunks 2 and 4
    config.eval_episodes = 16
    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        result = anakin.train(config, workdir)
    print(console.getvalue())
    return config, workdir, result, console.getvalue()


def test_resolved_config_is_saved_as_json_and_yaml(run):
    config, workdir, _, _ = run
    saved = json.loads(pathlib.Path(workdir, "config.json").read_text())
    # The config as given, but for the fields left to the agent ("auto" or None): its
    # choices are saved.
    expected = json.loads(config.to_json_best_effort())
    left = {"torso": "auto", "hidden_sizes": None, "logit_scale": None}
    assert {field: expected["agent"][field] for field in left} == left
    expected["agent"]["torso"] = "mlp"  # Catch's board is smaller than the conv's field
    expected["agent"]["hidden_sizes"] = [64, 64]  # a 2-D array, not an image: 2 x 64
    expected["agent"]["logit_scale"] = 1.0  # a 64-wide head: unscaled
    assert expected["learner_steps"] == 0  # and the runner's count: 4 chunks of 5 updates
    expected["learner_steps"] = 20
    assert saved == expected
    assert yaml.safe_load(pathlib.Path(workdir, "config.yaml").read_text()) == saved
    assert saved["agent"]["learning_rate"] == config.agent.learning_rate
    assert saved["num_envs"] == 16 and saved["rollout_length"] == 10


def test_run_info_records_the_environment_devices_machine_and_versions(run):
    config, workdir, result, _ = run
    info = json.loads(pathlib.Path(workdir, "run_info.json").read_text())
    assert info["architecture"] == "anakin"
    assert info["environment"] == {"name": "catch", "kind": "native", "kwargs": {}}
    assert info["agent"] == "vtrace" and info["platform"] == "cpu"
    assert info["devices"] == [str(d) for d in jax.devices()[:2]]  # config.num_devices = 2
    assert (info["num_envs"], info["rollout_length"], info["updates_per_chunk"],
            info["num_chunks"], info["num_runs"]) == (16, 10, 5, 4, 1)
    assert info["derived_sizes"] == []  # num_envs was set
    assert info["jax_version"] == jax.__version__ and info["machine"]["cpu"]
    assert info["config"] == json.loads(pathlib.Path(workdir, "config.json").read_text())
    assert info["resumed_from_updates"] is None
    assert result.run_info["environment"] == info["environment"]


def test_an_adapted_environment_is_described_with_its_librarys_version(monkeypatch):
    # bsuite stands in for an adapted library: the test extra pins it at 0.3.6 (pyproject).
    monkeypatch.setitem(envs_jax.registry._NAMESPACES, "stand_in", envs_jax.registry._Namespace(
        library="bsuite", adapter="unused", extra="test"))
    assert envs_jax.describe("stand_in:anything") == {
        "name": "stand_in:anything", "kind": "stand_in", "library": "bsuite",
        "library_version": "0.3.6"}
    assert envs_jax.describe("CartPole-v1") == {"name": "CartPole-v1", "kind": "native"}


def test_the_banner_counts_the_parameters_acted_with(run):
    """The widths resolved from the observations show in the banner: Catch's 10 x 5 board
    read flattened by 2 x 64 (V-trace's default for it), then a policy head of 3 and a value
    head of 1, each with biases: 50*64+64 + 64*64+64 + 64*3+3 + 64+1 = 7,684."""
    config, _, _, console = run
    assert config.agent.hidden_sizes is None
    banner = [line for line in console.splitlines() if line.startswith("Anakin: ")]
    assert len(banner) == 1 and "acting with 7,684 parameters" in banner[0], console


def test_the_result_prints_as_a_summary_without_arrays(run):
    _, _, result, _ = run
    text = repr(result)
    # 4 chunks of 5 updates, 16 environments x 10 steps each.
    assert text.startswith("TrainResult(updates=20, env_steps=3200, final_episode_return="), text
    assert "final_eval_return=" in text and ", run_seconds=" in text
    assert "compile_seconds=" in text and text.endswith(")")
    assert "rray" not in text and len(text) < 200, text
    assert str(result) == text


def test_a_results_summary_names_a_sweeps_runs_a_resume_and_an_interruption():
    from podracer.session import TrainResult

    result = TrainResult(state=np.zeros((2, 1000)), history=[],
                         final_metrics={"updates": 50, "env_steps": 25600,
                                        "episode_return": 0.123456, "loss": 1.0},
                         compile_seconds=3.04, run_seconds=12.96, interrupted=True,
                         resumed_from_updates=40, run_histories=[[], [], []])
    assert repr(result) == (
        "TrainResult(updates=50, env_steps=25600, final_episode_return=0.1235, "
        "run_seconds=13.0, compile_seconds=3.0, runs=3, resumed_from_updates=40, "
        "interrupted=True)")


def test_metrics_jsonl_has_greedy_evaluations_at_the_interval(run):
    _, workdir, result, _ = run
    records = [json.loads(line)
               for line in pathlib.Path(workdir, "metrics.jsonl").read_text().splitlines()]
    assert [r["updates"] for r in records] == [5, 10, 15, 20]
    assert ["eval_return" in r for r in records] == [False, True, False, True]
    for record in (records[1], records[3]):
        assert -1.0 <= record["eval_return"] <= 1.0
        assert record["eval_finished"] == 1.0  # Catch episodes end after 9 steps
    assert records == json.loads(json.dumps(result.history))


def test_tensorboard_events_are_readable_by_tensorboard(run):
    from tensorboard.backend.event_processing import event_accumulator

    _, workdir, result, _ = run
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(workdir))
    reader = event_accumulator.EventAccumulator(workdir)
    reader.Reload()
    tags = reader.Tags()["scalars"]
    for tag in ("episode_return", "eval_return", "loss", "steps_per_second", "updates"):
        assert tag in tags, tags
    returns = reader.Scalars("episode_return")
    assert [e.step for e in returns] == [r["env_steps"] for r in result.history]
    np.testing.assert_allclose([e.value for e in returns],
                               [r["episode_return"] for r in result.history], rtol=1e-6)
    evals = reader.Scalars("eval_return")
    assert [e.step for e in evals] == [r["env_steps"] for r in result.history
                                       if "eval_return" in r]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_is_one_bar_redrawn_in_place():
    stream = _Terminal()
    progress = metrics.Progress(1_000_000, stream)
    progress.update({"env_steps": 250_000, "steps_per_second": 812_000.0,
                     "episode_return": 0.5})
    progress.update({"env_steps": 500_000, "steps_per_second": 790_000.0,
                     "episode_return": 0.75, "eval_return": 1.0})
    progress.close()
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    last = text.split("\r")[-1]
    assert "[############............]  50%" in last
    assert "500K/1M steps" in last and "790K steps/s" in last and "ETA " in last
    assert "episode 0.75" in last and "eval 1" in last


def test_a_sweeps_progress_says_its_return_is_a_mean_and_its_rate_a_sum_over_the_runs():
    record = {"env_steps": 500_000, "updates": 10, "episode_return": 0.75,
              "steps_per_second": 790_000.0, "eval_return": 1.0}
    plain = io.StringIO()
    metrics.Progress(1_000_000, plain, tty=False, runs=4).update(record)
    assert plain.getvalue().startswith(
        "env_steps=500,000  updates=10  episode_return=0.75 (mean over 4 runs)  "
        "sps=790,000 (sum over 4 runs)  eval_return=1 (mean over 4 runs)  eta=")
    terminal = _Terminal()
    metrics.Progress(1_000_000, terminal, runs=4).update(record)
    line = terminal.getvalue()
    assert "790K steps/s (sum over 4 runs)" in line
    assert "episode 0.75 (mean over 4 runs)" in line and "eval 1 (mean over 4 runs)" in line


def test_progress_elsewhere_is_plain_lines_with_an_eta():
    stream = io.StringIO()
    writer = metrics.MetricsWriter(None, stream=stream, total_env_steps=100)
    writer.write({"env_steps": 50, "updates": 1, "episode_return": 0.5,
                  "steps_per_second": 10.0})
    writer.close()
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("env_steps=50  updates=1  episode_return=0.5  sps=10")
    assert "eta=0:" in line and "\r" not in stream.getvalue()
    assert "eval_return" not in line  # shown only where there was an evaluation


def test_progress_lines_show_evaluations():
    stream = io.StringIO()
    writer = metrics.MetricsWriter(None, stream=stream, total_env_steps=100)
    writer.write({"env_steps": 50, "updates": 1, "episode_return": 0.5, "eval_return": 0.875})
    writer.close()
    assert "eval_return=0.875" in stream.getvalue()


def test_tensorboard_events_are_on_disk_once_written(tmp_path):
    """A record written is readable before the writer is closed (a process killed right after
    logging loses nothing), and two writers made within one second keep separate files."""
    from tensorboard.backend.event_processing import event_accumulator

    first = metrics.MetricsWriter(str(tmp_path), total_env_steps=100)
    for step in (10, 20, 30):
        first.write({"env_steps": step, "updates": step // 10, "loss": step / 10})
    # Resumed from a checkpoint at env step 20 while the first writer is still open: TensorBoard
    # hides the first writer's step 30, which the resumed run logs again.
    second = metrics.MetricsWriter(str(tmp_path), total_env_steps=100, resume_env_steps=20)
    second.write({"env_steps": 30, "updates": 3, "loss": 7.0})
    reader = event_accumulator.EventAccumulator(str(tmp_path))
    reader.Reload()
    assert [(e.step, e.value) for e in reader.Scalars("loss")] == [(10, 1.0), (20, 2.0),
                                                                   (30, 7.0)]
    first.close()
    second.close()


def _oracle_agent() -> Agent:
    """Greedy: moves the paddle under the ball. Otherwise: always left."""

    def actor_step(params, actor_state, timestep, key, *, evaluation=False):
        board = timestep.observation  # [B, 10, 5]
        ball_x = jnp.argmax(jnp.max(board[:, :-1], axis=1), axis=-1)
        paddle_x = jnp.argmax(board[:, -1], axis=-1)
        toward = jnp.sign(ball_x - paddle_x) + 1
        action = toward if evaluation else jnp.zeros_like(toward)
        return action.astype(jnp.int32), actor_state, {}

    return Agent(init=None, actor_step=actor_step, learner_step=None,
                 init_actor_state=lambda batch_size: (), actor_params=lambda s: s)


def test_evaluation_plays_one_greedy_episode_per_environment():
    env = envs_jax.wrap_for_training(envs_jax.make("catch"))
    agent = _oracle_agent()
    evaluate = jax.jit(anakin.make_evaluator(agent, env, num_episodes=64, max_steps=100))
    out = evaluate({}, jax.random.PRNGKey(0))
    # The greedy policy catches every ball; always-left would catch only those in column 0.
    assert float(out["eval_return"]) == 1.0 and float(out["eval_return_std"]) == 0.0
    assert float(out["eval_finished"]) == 1.0
    # Cut before Catch's 9th step: nothing finished, no reward yet.
    cut = jax.jit(anakin.make_evaluator(agent, env, num_episodes=8, max_steps=3))(
        {}, jax.random.PRNGKey(0))
    assert float(cut["eval_finished"]) == 0.0 and float(cut["eval_return"]) == 0.0


def test_the_next_chunk_is_dispatched_before_a_chunks_metrics_are_logged(run):
    # The host loop's pipeline: when chunk k's record is written, chunk k + 1 has been
    # dispatched already (the last chunk has none after it).
    from anakin import runner

    config, _, _, _ = run
    programs = next(p for p in reversed(runner._PROGRAMS.values()) if p.chunk_fn is not None)
    compiled = programs.chunk_fn
    dispatched = []

    def counting(state):
        dispatched.append(len(dispatched))
        return compiled(state)

    seen = []
    evaluated = []  # (params, key) of each evaluation the runner dispatches
    evaluators = dict(programs.evaluators)

    def recording(fn):
        def evaluate(params, key):
            evaluated.append(jax.device_get((params, key)))
            return fn(params, key)
        return evaluate

    programs.chunk_fn = counting
    programs.evaluators.update({k: recording(fn) for k, fn in evaluators.items()})
    try:
        result = anakin.train(config, log_fn=lambda record: seen.append(len(dispatched)))
    finally:
        programs.chunk_fn = compiled
        programs.evaluators.update(evaluators)
    assert seen == [2, 3, 4, 4]
    # The evaluation logged with the last chunk is of the parameters after it, keyed as the
    # runner documents: fold_in(fold_in(PRNGKey(seed), 0x5EED), updates).
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(config.seed), 0x5EED), 20)
    params = replication.unreplicate(programs.agent.actor_params(result.state.learner_state))
    assert evaluated, "no evaluation went through the compiled evaluator"
    last_params, last_key = evaluated[-1]
    np.testing.assert_array_equal(last_key, key)
    assert_trees_equal(last_params, jax.device_get(params))
    evaluator = anakin.make_evaluator(
        programs.agent, programs.env, num_episodes=config.eval_episodes,
        max_steps=config.eval_max_steps)
    expected = jax.device_get(jax.jit(evaluator)(params, key))
    assert result.history[-1]["eval_return"] == pytest.approx(float(expected["eval_return"]))


def test_an_evaluation_is_dispatched_after_the_previous_chunks_record(run):
    # Dispatching the evaluation of chunk k's parameters can wait until chunk k has run
    # (XLA:CPU does: MuZero's records showed 12,546,953 steps/s on each evaluation and half the
    # rate on the record before it). Dispatched before chunk k - 1's record, that wait was
    # counted in chunk k - 1's time and chunk k's record saw almost none. So it is dispatched
    # after chunk k - 1's record, and any wait there is counted in chunk k's.
    from anakin import runner

    config, _, _, _ = run
    programs = next(p for p in reversed(runner._PROGRAMS.values()) if p.chunk_fn is not None)
    events = []
    programs.eval_params = lambda learner_state, inner=programs.eval_params: (
        events.append("eval") or inner(learner_state))
    try:
        anakin.train(config, log_fn=lambda record: events.append(record["updates"]))
    finally:
        del programs.eval_params
    # The first is the evaluator's compilation, before the loop; then evaluations after
    # updates 10 and 20 (chunks 2 and 4 of 5 updates each).
    assert events == ["eval", 5, "eval", 10, 15, "eval", 20]


@pytest.mark.parametrize("signum, with_workdir", [
    (signal.SIGTERM, True), (signal.SIGTERM, False), (signal.SIGINT, True)])
def test_sigterm_or_ctrl_c_stops_after_the_chunk_in_flight_logged_and_checkpointed(
        run, tmp_path, signum, with_workdir):
    from conftest import checkpoint_steps

    # Ctrl-C's disposition in a terminal (a worker started in the background may ignore it).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    config, _, _, _ = run
    config = config.copy_and_resolve_references()
    config.total_env_steps = 16 * 10 * 5 * 6  # 6 chunks
    config.checkpoint_every_updates = 0  # only the one the signal asks for

    def log(record):
        if record["updates"] == 10:  # seen while chunk 3 (updates 11-15) is in flight
            os.kill(os.getpid(), signum)

    workdir = str(tmp_path / "run") if with_workdir else None
    try:
        result = anakin.train(config, workdir, log_fn=log)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.interrupted and result.signal_received == signum
    assert [r["updates"] for r in result.history] == [5, 10, 15]
    if with_workdir:
        assert checkpoint_steps(workdir) == [15]


def test_a_second_ctrl_c_stops_at_once_and_an_ignored_one_stays_ignored():
    from podracer.checkpoint import Preemption

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Preemption() as preemption:
            os.kill(os.getpid(), signal.SIGINT)
            assert preemption.requested() and preemption.received == signal.SIGINT
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with Preemption() as preemption:
            os.kill(os.getpid(), signal.SIGINT)
            assert not preemption.requested()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_end_of_run_line_reports_the_latest_return_when_the_last_record_has_none():
    # Fixed-length episodes (MinAtar Freeway's 2,500 steps) end in bursts: a last record may
    # hold no finished episode, and its mean return is NaN (None once read from JSON).
    assert metrics.final_return_text([{"env_steps": 10, "episode_return": 7.0}]) == (
        "final mean episode return 7.000")
    history = [{"env_steps": 1_000, "episode_return": 5.25},
               {"env_steps": 2_000, "episode_return": float("nan")},
               {"env_steps": 3_000, "episode_return": None}]
    assert metrics.final_return_text(history) == (
        "no episode ended in the last record; the latest mean episode return 5.250, at 1,000 "
        "env steps")
    assert metrics.final_return_text(history[1:]) == "no episode ended"
    assert metrics.final_return_text([]) == "no episode ended"
