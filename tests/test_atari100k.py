"""experiments.atari100k: the score tables, human normalisation, and the results table written
from run workdirs (synthetic ones built here, in the layout experiments.sebulba writes:
config.json with env.task/env.protocol/seed, metrics.jsonl with env_steps/updates/eval_return).
"""

import json
import os
import subprocess
import sys

import envpool
import pytest

from experiments import atari100k

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS_PER_UPDATE = 640  # e.g. 2 actor threads x 16 envs x T = 20


def test_26_games_all_envpool_tasks():
    assert len(atari100k.GAMES) == 26
    tasks = set(envpool.list_all_envs())
    assert all(f"{game}-v5" in tasks for game in atari100k.GAMES)
    assert atari100k.game_of_task("KungFuMaster-v5") == "KungFuMaster"


def test_efficientzero_mean_and_median_match_the_paper():
    # Breakout: (414.1 - 1.7) / (30.5 - 1.7) = 412.4 / 28.8 = 14.3194...
    assert atari100k.human_normalised("Breakout", 414.1) == pytest.approx(412.4 / 28.8)
    # 26 games: the median is the mean of the 13th and 14th normalised scores in order, Qbert's
    # (13781.9 - 163.9) / (13455.0 - 163.9) = 13618 / 13291.1 = 1.0246 and Pong's
    # (20.1 + 20.7) / (14.6 + 20.7) = 40.8 / 35.3 = 1.1558, so (1.0246 + 1.1558) / 2 = 1.0902.
    mean, median = atari100k.efficientzero_summary()
    assert median == pytest.approx((13618 / 13291.1 + 40.8 / 35.3) / 2, abs=1e-9)
    # The paper (NeurIPS 2021) states 194.3% mean and 109.0% median human-normalised score.
    assert mean == pytest.approx(1.943, abs=5e-4)
    assert median == pytest.approx(1.090, abs=5e-4)


def _write_run(workdir, *, task="Breakout-v5", protocol="atari100k", seed=0, evals=(),
               kwargs=None):
    """A finished run: a record every 10 updates, `evals` = {update: eval_return} on some."""
    os.makedirs(workdir)
    config = {"seed": seed, "env": {"task": task, "protocol": protocol, "kwargs": kwargs or {}},
              "total_env_steps": atari100k.BUDGET}
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(config, f)
    evals = dict(evals)
    last = max(evals, default=157)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        for u in sorted(set(range(10, last + 1, 10)) | set(evals)):
            record = {"env_steps": u * STEPS_PER_UPDATE, "updates": u, "episode_return": 1.0}
            if u in evals:
                record["eval_return"] = evals[u]
            f.write(json.dumps(record) + "\n")
    return str(workdir)


# 157 updates of 640 steps = 100,480 agent steps: the first whole update past 100,000.
FINAL = 157


def _three_games(tmp_path):
    # Breakout: seeds score 8.9 and 23.3, mean 16.1: (16.1 - 1.7) / (30.5 - 1.7) = 14.4 / 28.8
    #   = 0.5 (an earlier evaluation, at update 80, must not count)
    # Pong: -11.875: (-11.875 + 20.7) / (14.6 + 20.7) = 8.825 / 35.3 = 0.25
    # Boxing: 24.1: (24.1 - 0.1) / (12.1 - 0.1) = 24 / 12 = 2.0
    # Mean over games (0.5 + 0.25 + 2.0) / 3 = 0.917; median 0.5.
    return [
        _write_run(tmp_path / "breakout0", seed=0, evals={80: 500.0, FINAL: 8.9}),
        _write_run(tmp_path / "breakout1", seed=1, evals={FINAL: 23.3}),
        _write_run(tmp_path / "pong0", task="Pong-v5", evals={FINAL: -11.875}),
        _write_run(tmp_path / "boxing0", task="Boxing-v5", protocol="atari100k_grey",
                   evals={FINAL: 24.1}),
    ]


def test_results_table_from_workdirs(tmp_path):
    results = [atari100k.read_run(w) for w in _three_games(tmp_path)]
    assert [r.env_steps for r in results] == [100_480] * 4
    assert results[0].score == 8.9 and results[1].seed == 1
    table = atari100k.results_table(results)
    assert "| Breakout | 2 | 16.1 | 0.500 | 414.1 | 14.319 |" in table
    assert "| Pong | 1 | -11.9 | 0.250 | 20.1 | 1.156 |" in table
    assert "| Boxing | 1 | 24.1 | 2.000 | 52.7 | 4.383 |" in table
    assert "Over 3 of 26 games: mean human-normalised score 0.917, median 0.500" in table
    # EfficientZero on these three: Breakout 412.4 / 28.8 = 14.319444, Pong 40.8 / 35.3 =
    # 1.155807, Boxing (52.7 - 0.1) / 12 = 4.383333; mean 19.858585 / 3 = 6.6195, median 4.383.
    assert "EfficientZero on the same games: mean 6.620, median 4.383" in table


def test_refuses_runs_that_are_not_atari100k_results(tmp_path):
    cases = {
        "impala": ({"protocol": "impala", "evals": {FINAL: 1.0}}, "protocol 'impala'"),
        "space": ({"task": "SpaceInvaders-v5", "evals": {FINAL: 1.0}}, "not one of the 26"),
        "short": ({"evals": {80: 3.0}}, "at 51,200 agent steps, short of 100,000"),
        "no_eval": ({"evals": {}}, "no evaluation"),
        "late": ({"evals": {400: 3.0}}, "past the 100,000-step budget"),
    }
    for name, (kwargs, words) in cases.items():
        workdir = _write_run(tmp_path / name, **kwargs)
        with pytest.raises(atari100k.RunError, match=words) as info:
            atari100k.read_run(workdir)
        assert workdir in str(info.value)
    # --allow_partial takes the short run's last evaluation, and the table says so.
    result = atari100k.read_run(str(tmp_path / "short"), allow_partial=True)
    assert result.partial and result.env_steps == 80 * STEPS_PER_UPDATE and result.score == 3.0
    assert "| Breakout | 1 (partial) | 3.00 |" in atari100k.results_table([result])
    # A longer run counts with its evaluation at the budget, not a later one.
    long_run = _write_run(tmp_path / "long", evals={FINAL: 5.0, 300: 50.0})
    assert atari100k.read_run(long_run).score == 5.0


def test_command_prints_the_table_and_names_a_refused_run(tmp_path):
    _three_games(tmp_path)
    out = tmp_path / "table.md"
    done = subprocess.run(
        [sys.executable, "-m", "experiments.atari100k", f"--runs={tmp_path}/*0,{tmp_path}/*1",
         f"--out={out}"], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "mean human-normalised score 0.917, median 0.500" in done.stdout
    assert out.read_text() == done.stdout
    bad = _write_run(tmp_path / "bad0", protocol="machado", evals={FINAL: 1.0})
    done = subprocess.run(
        [sys.executable, "-m", "experiments.atari100k", f"--runs={tmp_path}/*0"],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and bad in done.stderr and "machado" in done.stderr
