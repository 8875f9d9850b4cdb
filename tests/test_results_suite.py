"""The results suite (`experiments.benchmarks.suite`) at its smallest setting, so that it cannot
rot: one agent on Catch, two seeds as one sweep, and a pair it must skip."""

import json
import os

import pytest
from conftest import snapshot

from experiments import plot
from experiments.benchmarks import suite


def test_returns_at_reads_the_last_record_at_or_before_the_point():
    records = [{"env_steps": 100, "episode_return": 1.0},
               {"env_steps": 200, "episode_return": float("nan")},
               {"env_steps": 250, "episode_return": None},  # no episode ended in the chunk
               {"env_steps": 300, "episode_return": 3.0},
               {"env_steps": 400, "loss": 0.5}]
    assert suite.returns_at(records, 250) == 1.0  # the NaN record has no return
    assert suite.returns_at(records, 300) == 3.0
    assert suite.returns_at(records, 50) == 1.0  # before any record: the first
    assert suite.returns_at(records, 10_000) == 3.0


def test_budgets_follow_the_stated_protocol():
    assert suite.budget("vtrace", "CartPole-v1") == 1_000_000
    assert suite.budget("ppo", "gymnax:Breakout-MinAtar") == 10_000_000
    assert suite.budget("muzero", "gymnax:Breakout-MinAtar") == 1_000_000
    assert suite.budget("muzero", "gymnax:Breakout-MinAtar", minatar_steps=5) == 5
    assert suite.budget("ppo", "catch", steps=7) == 7


def test_the_pair_config_is_the_defaults_with_only_env_budget_seeds_and_logging_set():
    import agents
    import anakin
    config = suite.pair_config("vtrace", "Acrobot-v1", (0, 1, 2), 1_000_000)
    expected = anakin.default_config()
    expected.agent = agents.default_config("vtrace")
    changed = {k for k in config if config[k] != expected[k]}
    # updates_per_chunk only where the budget has fewer than RECORDS chunks of the default's.
    assert {"env", "total_env_steps", "sweep"} <= changed
    assert changed <= {"env", "total_env_steps", "sweep", "updates_per_chunk"}
    assert config.agent.to_dict() == expected.agent.to_dict()
    assert config.env.name == "Acrobot-v1" and tuple(config.sweep.seeds) == (0, 1, 2)


def test_smallest_suite_runs_writes_its_table_and_refuses_to_overwrite(tmp_path):
    out = str(tmp_path / "results")
    steps = 4 * 32 * 16  # four updates of the runner's default 32 envs x T = 16
    results = suite.run_suite(out, ["vtrace"], ["catch", "Pendulum-v1"], [0, 1], steps=steps)
    rows = {(r["agent"], r["env"]): r for r in results["pairs"]}
    assert rows[("vtrace", "Pendulum-v1")]["skipped"]
    catch = rows[("vtrace", "catch")]
    assert catch["budget"] == steps and catch["env_steps"] == steps
    end = catch["points"][-1]
    assert len(end["seeds"]) == 2 and end["min"] <= end["mean"] <= end["max"]
    assert -1.0 <= end["min"] and end["max"] <= 1.0  # Catch's returns
    # The table's figures are those of the runs' own records.
    runs = plot.load_runs(os.path.join(out, "runs", "vtrace", "catch"))
    assert [r.records[-1]["episode_return"] for r in runs] == pytest.approx(end["seeds"])
    for name in ("results.md", "results.json", "curves_catch.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0
    with open(os.path.join(out, "results.md")) as f:
        table = f.read()
    assert "| vtrace | catch | 2.048K |" in table and "discrete actions only" in table
    with open(os.path.join(out, "results.json")) as f:
        assert json.load(f)["seeds"] == [0, 1]
    before = snapshot(out)  # every file's bytes and times, and every directory
    with pytest.raises(FileExistsError, match="--resume"):
        suite.run_suite(out, ["vtrace"], ["catch"], [0, 1], steps=steps)
    assert snapshot(out) == before
    # --resume finishes without running the finished pair again.
    again = suite.run_suite(out, ["vtrace"], ["catch"], [0, 1], steps=steps, resume=True)
    assert again["pairs"][0]["wall_seconds"] == catch["wall_seconds"]


def test_sigterm_stops_the_suite_and_resume_finishes_the_pair(tmp_path, monkeypatch):
    # A preempted pair used to be marked done with the records it had, and the suite went on
    # to the next pair in the same process; --resume then skipped the cut-short pair.
    import signal

    import anakin

    out = str(tmp_path / "results")
    steps = 4 * 32 * 16  # four chunks of one update each
    real_train = anakin.train

    def preempted(config, workdir):
        def log(record):  # chunk 1 logged while chunk 2 is in flight: stops after chunk 2
            if record["updates"] == 1:
                os.kill(os.getpid(), signal.SIGTERM)
        return real_train(config, workdir, log_fn=log)

    monkeypatch.setattr(suite.anakin, "train", preempted)
    results = suite.run_suite(out, ["vtrace"], ["catch", "CartPole-v1"], [0], steps=steps)
    catch = os.path.join(out, "runs", "vtrace", "catch")
    assert results["interrupted"] == {"agent": "vtrace", "env": "catch", "workdir": catch}
    assert not os.path.exists(os.path.join(catch, "suite_done.json"))
    assert not os.path.exists(os.path.join(out, "runs", "vtrace", "CartPole-v1"))  # not started
    assert not os.path.exists(os.path.join(out, "results.md"))
    assert [r["updates"] for r in plot.load_runs(catch)[0].records] == [1, 2]

    monkeypatch.setattr(suite.anakin, "train", real_train)
    results = suite.run_suite(out, ["vtrace"], ["catch", "CartPole-v1"], [0], steps=steps,
                              resume=True)
    assert "interrupted" not in results
    rows = {r["env"]: r for r in results["pairs"]}
    assert rows["catch"]["env_steps"] == rows["CartPole-v1"]["env_steps"] == steps
    assert [r["updates"] for r in plot.load_runs(catch)[0].records] == [1, 2, 3, 4]


def test_value_agents_take_their_cartpole_configs_settings_with_schedules_scaled_to_the_run():
    from experiments.configs import dqn_cartpole, pqn_cartpole
    assert suite.budget("dqn", "gymnax:Breakout-MinAtar") == 10_000_000  # model-free
    assert suite.budget("pqn", "gymnax:Breakout-MinAtar") == 10_000_000
    for agent, module, anneal in (
            # dqn_cartpole: 2,500 of 500K // 64 = 7,812 learner steps (160K env steps, 32%);
            # 1M // 64 = 15,625 learner steps, 32% of them: 5,000 (320K env steps).
            ("dqn", dqn_cartpole, {"epsilon_anneal_steps": 5_000}),
            # pqn_cartpole: epsilon over 50 of 500K // 2,048 = 244 learner steps (20.5%), the
            # step size over all 244; 1M // 2,048 = 488, 20.5% of them: 100, and all 488.
            ("pqn", pqn_cartpole, {"epsilon_anneal_steps": 100, "anneal_lr_updates": 488})):
        shipped = module.get_config()
        config = suite.pair_config(agent, "Acrobot-v1", (0, 1, 2), 1_000_000)
        for field in ("num_devices", "num_envs", "rollout_length"):
            assert config[field] == shipped[field], (agent, field)
        expected = shipped.agent.to_dict()
        expected.update(anneal)
        assert config.agent.to_dict() == expected
        assert config.env.name == "Acrobot-v1" and config.total_env_steps == 1_000_000
        assert config.eval_every_updates == 0  # as every pair: training returns only
    dqn = suite.pair_config("dqn", "catch", (0,), 1_000_000).agent
    assert dqn.layer_norm and dqn.target_update_interval == 100 and dqn.replay_ratio == 2


def test_pqn_on_minatar_takes_its_minatar_configs_settings():
    from experiments.configs import pqn_minatar
    shipped = pqn_minatar.get_config()
    config = suite.pair_config("pqn", "gymnax:Freeway-MinAtar", (0, 1, 2), 1_000_000)
    assert (config.num_envs, config.rollout_length) == (128, 32)
    # pqn_minatar: 10M // 4,096 = 2,441 learner steps, epsilon over 244 of them (10%); 1M //
    # 4,096 = 244, 10% of them: 24, and the step size over all 244.
    expected = shipped.agent.to_dict()
    expected.update(epsilon_anneal_steps=24, anneal_lr_updates=244)
    assert config.agent.to_dict() == expected
    assert config.agent.torso == "board_conv" and config.agent.lambda_ == 0.65
    # Elsewhere PQN keeps its CartPole config's settings.
    assert suite.pair_config("pqn", "Acrobot-v1", (0,), 1_000_000).num_envs == 32


def test_tiny_run_of_each_value_agent(tmp_path):
    out = str(tmp_path / "results")
    # Two of PQN's learner steps (32 envs x T = 64); 64 of DQN's (8 x 8), past its warm-up of
    # 1,000 stored positions after 16.
    steps = 2 * 32 * 64
    results = suite.run_suite(out, ["dqn", "pqn"], ["catch"], [0, 1], steps=steps)
    for row in results["pairs"]:
        assert row["budget"] == steps and row["env_steps"] >= steps, row["agent"]
        end = row["points"][-1]
        assert len(end["seeds"]) == 2 and -1.0 <= end["min"] <= end["max"] <= 1.0
        runs = plot.load_runs(os.path.join(out, "runs", row["agent"], "catch"))
        last = runs[0].records[-1]
        assert last["loss"] > 0, row["agent"]  # it made updates
    with open(os.path.join(out, "results.md")) as f:
        table = f.read()
    assert "| dqn | catch | 4.096K |" in table and "| pqn | catch | 4.096K |" in table
