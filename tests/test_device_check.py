"""The prepared device check (`experiments.benchmarks.device_check`) in its smoke mode: every
part runs at tiny sizes on CPU and the JSON and markdown table hold what the device run needs."""

import json
import os
import subprocess
import sys

from conftest import ROOT

from experiments.benchmarks._ceiling import tree_loop_iterations

PARTS = ["anakin_catch", "muzero_search", "muzero_learner", "maxpool_grad", "sebulba_pong",
         "graph_loops"]


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
        "muzero", "gumbel", "muzero_ez"] + ["muzero_atari.py"] * atari
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
