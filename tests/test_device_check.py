"""The prepared device check (`experiments.benchmarks.device_check`): in its smoke mode every
part runs at tiny sizes on CPU and the JSON and markdown table hold what the device run needs;
the parts share the check's time (`_schedule`), and a part's stopped process keeps what it
finished."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT

from experiments.benchmarks import _schedule
from experiments.benchmarks._ceiling import tree_loop_iterations

PARTS = ["anakin_catch", "muzero_search", "muzero_learner", "maxpool_grad", "sebulba_pong",
         "graph_loops"]
# The parts' own caps (device_check.CAPS_S, which the smoke run records).
CAPS = {"anakin_catch": 60.0, "muzero_search": 75.0, "muzero_learner": 45.0,
        "maxpool_grad": 20.0, "sebulba_pong": 270.0, "graph_loops": 75.0}


def _check(*flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "experiments.benchmarks.device_check",
                           "--smoke", *flags], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def test_smoke_runs_every_part_and_writes_json_and_table(tmp_path):
    proc = _check(f"--out={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "device_check.json").read_text())
    assert set(results) >= {"smoke", "machine", "versions", "derived_sizes", "parts"}
    assert results["smoke"] is True
    assert list(results["parts"]) == PARTS
    # Smoke has no limit for the check: each part had its own cap.
    assert results["check_s"] is None
    assert {name: part["cap_s"] for name, part in results["parts"].items()} == CAPS
    for name, part in results["parts"].items():
        assert part["status"] in ("ok", "skipped"), (name, part.get("traceback"))
        assert set(part) >= {"status", "reason", "seconds", "rows", "capped"}
        if part["status"] == "skipped":
            assert part["reason"]  # e.g. envpool's Atari games missing
            continue
        for row in part["rows"]:
            assert set(row) >= {"part", "setting", "figure", "unit", "against",
                                "against_figure", "ratio"}
            assert row["figure"] > 0
    # Smoke runs one point where a second would compile the same programs: one Anakin point
    # against the environment alone; the three searches; both learner figures; one Sebulba
    # point against envpool alone, with its shares of time.
    assert [r["ratio"] is not None for r in results["parts"]["anakin_catch"]["rows"]] == [True]
    # The Atari config's search where envpool makes Pong (its frames are the roots).
    atari = results["parts"]["sebulba_pong"]["status"] == "ok"
    assert [r["setting"].split(" (")[0].split(":")[0]
            for r in results["parts"]["muzero_search"]["rows"]] == [
        "muzero", "gumbel", "muzero_ez", "muzero_ez search alone, mean Q by walk",
        "muzero_ez search alone, mean Q by jumps"] + ["muzero_atari.py"] * atari
    # Smoke counts the first search's loops: 2 simulations, a child of the root (1 edge down,
    # 1 up), then a node at depth 1 or 2 (the deepest of the 4 roots sets both loops' length).
    row = results["parts"]["muzero_search"]["rows"][0]
    assert row["tree_loop_iterations"] in (4, 6)
    assert row["tree_us_per_loop_iteration"] is not None
    assert len(results["parts"]["muzero_learner"]["rows"]) == 2
    # agents.layers' max-pool gradient against XLA's, one row.
    assert [r["ratio"] is not None for r in results["parts"]["maxpool_grad"]["rows"]] == [True]
    if results["parts"]["sebulba_pong"]["status"] == "ok":
        rows = results["parts"]["sebulba_pong"]["rows"]
        assert len(rows) == 1 and "inference" in rows[0]["shares"]
        assert rows[0]["actor_inference_alone"] > 0  # beside the end-to-end run
        assert rows[0]["inference_ms_per_call"] > 0 and rows[0]["inference_ms_per_call_alone"] > 0
        assert rows[0]["learner_ms_per_update"] > 0
        assert "in 2 batches" in rows[0]["setting"]
    # The searches again (in smoke, not Anakin), in a process that ran under the graph flags
    # (its own XLA_FLAGS, as it recorded them; XLA:CPU parses them: their spelling is checked).
    loops = results["parts"]["graph_loops"]["rows"]
    assert [r["setting"].split(" (")[0] for r in loops] == [
        "muzero_search: muzero", "muzero_search: gumbel", "muzero_search: muzero_ez"]
    for row in loops:
        assert "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL" in row["xla_flags"]
        # Beside a process that holds 75% of a GPU, it must not reserve its own 75%.
        assert row["memory"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        assert row["ratio"] is not None
    assert "graph" not in results["xla_flags"]
    table = (tmp_path / "device_check.md").read_text()
    assert table.startswith("| part | setting | figure | against | ratio | status |")
    for name in PARTS:
        assert f"| {name} |" in table
    assert "device_check.md" in proc.stdout


def test_a_graph_loop_process_that_dies_is_reported_and_the_check_still_writes(tmp_path):
    # XLA ends a process whose XLA_FLAGS it cannot parse, after printing its flags' help.
    proc = _check("--parts=graph_loops", f"--out={tmp_path}",
                  "--graph_loop_xla_flags=--xla_gpu_enable_command_buffer=+NOT_A_COMMAND")
    assert proc.returncode == 0, proc.stderr[-3000:]
    part = json.loads((tmp_path / "device_check.json").read_text())["parts"]["graph_loops"]
    assert part["status"] == "failed" and part["rows"] == []
    assert "exited with status" in part["reason"]
    assert "--xla_gpu_enable_command_buffer 'NOT_A_COMMAND'" in part["reason"]
    assert "| graph_loops | | | | | failed: " in (tmp_path / "device_check.md").read_text()


def test_tree_loop_iterations_counts_each_loop_to_the_batchs_deepest_new_node():
    # Two trees of 4 simulations (node 0 the root). Depths of nodes 1-4: [1, 1, 2, 3] and
    # [1, 2, 3, 1]; the batch's deepest at each simulation: 1, 2, 3, 3 -> 9 edges down and 9 up.
    parents = [[-1, 0, 0, 1, 3], [-1, 0, 1, 2, 0]]
    assert tree_loop_iterations(parents) == 18
    assert tree_loop_iterations([[-1, 0, 0, 0]]) == 6  # three children of the root


def test_a_part_gets_its_own_cap_or_its_share_of_the_checks_time_left():
    later = ("sebulba_pong", "graph_loops")  # caps 270 + 75 = 345
    # Enough time left: each part its own cap.
    assert _schedule.part_cap(CAPS, "sebulba_pong", later, 400.0) == 270.0
    assert _schedule.part_cap(CAPS, "graph_loops", ("graph_loops",), 100.0) == 75.0
    # Half the caps' sum left: each its share, half its cap.
    assert _schedule.part_cap(CAPS, "sebulba_pong", later, 172.5) == pytest.approx(135.0)
    assert _schedule.part_cap(CAPS, "graph_loops", ("graph_loops",), 37.5) == 37.5
    assert _schedule.part_cap(CAPS, "graph_loops", ("graph_loops",), -3.0) <= 0
    # From the start of the check, 450 s for all six (545 s of caps): 450/545 of each.
    assert _schedule.part_cap(CAPS, "anakin_catch", tuple(CAPS), 450.0) == pytest.approx(
        60.0 * 450 / 545)


def test_a_point_starts_only_while_the_cap_would_hold_one_as_long_as_the_last(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(_schedule.time, "perf_counter", lambda: now[0])
    budget = _schedule.Budget(10.0)
    starts = []
    for t in (100.0, 104.0, 108.0, 108.5):  # points of 4 s, 4 s, then 0.5 s
        now[0] = t
        starts.append(budget.next_point())
    # 10 s left: the first; 6 s left > 4 s: the second; 2 s left < 4 s: not the third, and
    # from then on none, though the fourth would follow a point of 0.5 s.
    assert starts == [True, True, False, False]
    now[0] = 100.0
    budget = _schedule.Budget(10.0)
    now[0] = 111.0
    assert not budget.next_point()  # the cap spent before the first point


def _timed_parts(first_s: float):
    """Two stand-in parts: "first" (cap 3 s) takes `first_s` seconds, "last" (cap 1 s) none;
    `caps` records the cap each was given."""
    caps = {}

    def run_part(name, cap_s):
        caps[name] = cap_s
        time.sleep(first_s if name == "first" else 0.0)
        return {"status": "ok", "reason": "", "seconds": 0.0}

    return run_part, caps


def test_the_parts_share_the_checks_time_and_a_part_left_none_is_skipped():
    parts, own = ("first", "last"), {"first": 3.0, "last": 1.0}
    run_part, caps = _timed_parts(first_s=1.5)
    records = _schedule.run_parts(parts, own, run_part, check_s=2.0)
    # 2 s for caps 3 + 1: the first part 3/4 of it; the last what the first left (about 0.5 s).
    assert caps["first"] == pytest.approx(1.5, abs=0.05)
    assert 0 < caps["last"] <= 0.5
    assert [records[p]["status"] for p in parts] == ["ok", "ok"]

    run_part, caps = _timed_parts(first_s=2.1)
    seen = []
    records = _schedule.run_parts(parts, own, run_part, check_s=2.0,
                                  after_part=lambda name, record: seen.append(name))
    assert list(caps) == ["first"]  # the last never started ...
    assert records["last"]["status"] == "skipped"  # ... and says why
    assert records["last"]["reason"] == "the check's time was spent"
    assert seen == ["first", "last"]  # each recorded as it ended (the check writes its files)

    # Without a limit for the check (as --smoke): None, each part its own cap.
    run_part, caps = _timed_parts(first_s=0.0)
    _schedule.run_parts(parts, own, run_part, check_s=None)
    assert caps == {"first": None, "last": None}


def test_a_stopped_part_process_keeps_the_parts_it_finished(tmp_path):
    stopped = "its process ran past the part's 60 s cap and was stopped"
    row = {"part": "muzero_search", "setting": "muzero (256 roots x 16 simulations)",
           "figure": 1.0, "unit": "simulations/s", "against": "", "against_figure": 2.0,
           "ratio": 0.5}
    (tmp_path / "device_check.json").write_text(json.dumps(
        {"xla_flags": "--xla_flag", "memory": {}, "parts": {"muzero_search": {
            "status": "ok", "reason": "", "rows": [row], "capped": []}}}))
    child, unfinished = _schedule.child_results(str(tmp_path),
                                                ["muzero_search", "anakin_catch"], stopped)
    assert child["parts"]["muzero_search"]["rows"] == [row]
    assert unfinished == [f"anakin_catch: {stopped}"]
    # Its parts share the cap less the process's start-up (20 s), so it writes before the stop.
    assert _schedule.child_check_s(60.0) == 40.0
    assert _schedule.child_check_s(10.0) == 1.0

    with pytest.raises(RuntimeError, match="stopped before it finished a part"):
        _schedule.child_results(str(tmp_path / "nothing"), ["muzero_search"], stopped)
