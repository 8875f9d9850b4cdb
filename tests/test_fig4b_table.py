"""The Figure 4b table: what `experiments.benchmarks.sebulba` prints for each point of its sweep
over actor threads and actor batch, `experiments.benchmarks.scaling` reads back under the same
names (it once read the columns by position and lost the end-to-end figure when the threads
column was added)."""

import pytest

from experiments.benchmarks import _fig4b


def _output(*rows: str) -> str:
    return "\n".join([
        "| part | agent steps/s | frames/s | cores busy |", "|---|---:|---:|---:|",
        "| **Sebulba end to end** | 154 | 618 | 1.80 |", "",
        "Figure 4b: frames/s against actor batch size and actor threads (torso=conv)", "",
        _fig4b.header(), *rows, "", "wrote something"])


def test_each_printed_point_is_read_back_under_its_own_names():
    # Each point's end-to-end run logs its own lines between the rows.
    text = _output(_fig4b.row(2, 8, 16, [25_753.4, 23_930.0, 4_006.2, 3_604.9]),
                   "Sebulba: vtrace on Pong-v5 (protocol impala, envpool 1.2.5); ...",
                   "env_steps=640  updates=1  episode_return=-  sps=222", "",
                   _fig4b.row(4, 32, 128, [27_074.0, 24_192.0, 4_206.0, 4_101.0]))
    assert "| 2 | 8 | 16 | 25,753 | 23,930 | 4,006 | 3,605 | 14% |" in text  # 3,604.9 / 25,753.4
    assert _fig4b.parse(text) == [
        {"actor_threads": 2, "envs_per_thread": 8, "trajectories": 16, "envpool": 25_753.0,
         "actor": 23_930.0, "learner": 4_006.0, "sebulba": 3_605.0},
        {"actor_threads": 4, "envs_per_thread": 32, "trajectories": 128, "envpool": 27_074.0,
         "actor": 24_192.0, "learner": 4_206.0, "sebulba": 4_101.0}]


def test_other_tables_are_not_read_and_a_table_missing_a_column_is_refused():
    assert _fig4b.parse(_output()) == []
    # Another table after it, with as many columns and numbers in its first: not read.
    other = ("| a | b | c | d | e | f | g | h |\n|---|---|---|---|---|---|---|---|\n"
             "| 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8% |")
    assert _fig4b.parse(_output(_fig4b.row(2, 8, 16, [4.0, 3.0, 2.0, 1.0]), other)) == [
        {"actor_threads": 2, "envs_per_thread": 8, "trajectories": 16, "envpool": 4.0,
         "actor": 3.0, "learner": 2.0, "sebulba": 1.0}]
    old = ("| actor threads per device | envs per actor thread | envpool alone | actor alone |"
           " learner alone | end to end / envpool alone |")
    with pytest.raises(ValueError, match="trajectories.*sebulba"):
        _fig4b.parse(old + "\n|---:|---:|---:|---:|---:|---:|\n| 2 | 8 | 1 | 2 | 3 | 4% |")
