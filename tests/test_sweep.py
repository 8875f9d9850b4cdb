"""Sweeps vmapped inside one Anakin program: each run equals the same run made on its own.

A run inside the sweep and the run alone are different compiled programs doing the same
maths, so they are compared as the README promises: every integer, boolean and RNG-key leaf of
the whole state (environment states, keys, counters) and every count in the logs exactly, and
floating-point leaves to the tolerance `FLOAT_RTOL` derived below. XLA may order a float
reduction differently inside a `vmap`, and does so differently on different CPUs: on an AMD
EPYC machine two of the six elements of one run's policy bias differ from the run alone by
1.2e-10 (2.5e-8 of that leaf's largest magnitude) after 10 updates, while on an Intel Xeon
machine every bit matches. Nothing here depends on which CPU runs it.
"""

import json
import os

import jax
import numpy as np
import pytest
from conftest import assert_trees_equal, relative_differences, set_fields

import anakin
from anakin import runner
from experiments.configs import vtrace_catch

SEEDS = (0, 1, 2, 3)
TIMING = {"steps_per_second", "wall_time"}
# Counts, and means of integer rewards and lengths: sums of small integers are exact in float32
# in any order, so these are equal exactly.
COUNTS = ("env_steps", "updates", "episodes", "episode_return", "episode_length")

# FLOAT_RTOL: how far a floating-point leaf of a sweep's run may be from the run alone, as a
# fraction of the leaf's largest magnitude (see `conftest.assert_trees_equal`). To first order:
# - Two orders of a float32 sum of n terms differ by at most 2(n-1)u * sum|x_i|, u = 2^-24
#   (Higham, Accuracy and Stability of Numerical Algorithms, 2002, eq. 4.4). The longest sums
#   are the gradient's over the (T+1)*B = 11*16 = 176 observations of both devices: a gradient
#   moves by at most 2*175*u = 2.1e-5 of its sum|x_i|, 4.2e-5 of itself if sum|x_i| <= 2|sum x_i|.
# - Adam's step lr * m/(sqrt(v) + eps) is scale-free: m moves by that fraction, sqrt(v) too, the
#   step by twice it, 8.4e-5. Over K steps a parameter drifts by at most 8.4e-5 of the sum of
#   its steps' sizes, which a leaf's largest magnitude exceeds for initialised kernels (0.26-0.33
#   here, against K * lr = 0.01) and nearly matches for biases, which start at zero (their
#   largest element is 0.28-1.0 of K * lr here): a drift of at most 8.4e-5 / 0.28 = 3e-4.
# We allow 1e-3, a factor 3 for cancellation beyond the factor 2 assumed. Measured: 2.5e-8 on
# an AMD EPYC, 0 on an Intel Xeon. Tight enough: against another seed or another learning rate
# and entropy cost, every parameter leaf differs by 6e-3 to 2 of its largest magnitude
# (measured), so a run given the wrong seed or hyperparameters fails (`_assert_far_apart`
# checks this each time the tests run). A rounding difference that flipped a sampled action
# (probability ~1e-10 per action) would show as unequal integer environment states: as a
# failure, not as a pass.
FLOAT_RTOL = 1e-3


def _config(**overrides):
    config = vtrace_catch.get_config()
    config.num_devices = 2
    config.num_envs = 16
    config.rollout_length = 10
    config.updates_per_chunk = 5
    config.total_env_steps = 16 * 10 * 5 * 2  # 2 chunks
    config.eval_every_updates = 10  # once, after the last chunk
    config.eval_episodes = 8
    set_fields(config, overrides)
    return config


@pytest.fixture(scope="module")
def separate():
    """Four ordinary runs, one per seed."""
    return {seed: anakin.train(_config(seed=seed)) for seed in SEEDS}


def _run_slice(tree, run):
    return jax.tree.map(lambda x: np.asarray(x)[:, run], jax.device_get(tree))


def _assert_same_run(actual, expected):
    """A sweep's run against the run alone: different programs, so floats to FLOAT_RTOL."""
    assert_trees_equal(actual, expected, float_rtol=FLOAT_RTOL)


def _assert_far_apart(actual, expected):
    """Parameters that must differ (other seed, other hyperparameters) do so beyond FLOAT_RTOL in
    every leaf, and by over 100 times it in some: `_assert_same_run` would catch the mix-up."""
    differences = relative_differences(actual, expected)
    assert min(differences.values()) > FLOAT_RTOL, differences
    assert max(differences.values()) > 100 * FLOAT_RTOL, differences
    with pytest.raises(AssertionError, match="largest difference"):
        _assert_same_run(actual, expected)


def _assert_same_records(actual, expected):
    """The same log, chunk by chunk: counts exactly, float metrics (float reductions, like
    the state's leaves) to FLOAT_RTOL of each metric's largest magnitude over the chunks."""
    assert len(actual) == len(expected)
    actual = [{k: v for k, v in a.items() if k not in TIMING} for a in actual]
    expected = [{k: v for k, v in e.items() if k not in TIMING} for e in expected]
    for a, e in zip(actual, expected):
        assert a.keys() == e.keys()
        for key in COUNTS:
            assert a[key] == e[key], key
    # Each metric as a column over the chunks that have it (evaluation: some chunks only).
    keys = {k for record in expected for k in record}
    columns = [{k: np.asarray([r[k] for r in records if k in r]) for k in keys}
               for records in (actual, expected)]
    assert_trees_equal(*columns, float_rtol=FLOAT_RTOL)


def test_four_seed_sweep_equals_four_separate_runs(separate, tmp_path):
    sweep = anakin.train(_config(**{"sweep.seeds": SEEDS}), str(tmp_path))
    assert len(sweep.run_histories) == len(SEEDS)
    params = sweep.params
    for run, seed in enumerate(SEEDS):
        alone = separate[seed]
        # The whole state: parameters, optimiser state, environments, RNG keys, counters.
        _assert_same_run(_run_slice(sweep.state, run), alone.state)
        _assert_same_run(jax.tree.map(lambda x, r=run: x[r], params), alone.params)
        # The same metrics, evaluation included, chunk by chunk.
        _assert_same_records(sweep.run_histories[run], alone.history)
        assert "eval_return" in sweep.run_histories[run][-1]
    # The seeds did make different runs, further apart than the tolerance by far.
    for seed in SEEDS[1:]:
        _assert_far_apart(separate[seed].params, separate[0].params)

    # Each run is logged on its own, with its own resolved config.
    for run, seed in enumerate(SEEDS):
        run_dir = tmp_path / f"run_{run}"
        records = [json.loads(line)
                   for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        _assert_same_records(records, separate[seed].history)
        assert json.loads((run_dir / "config.json").read_text())["seed"] == seed
        assert any(name.startswith("events.out.tfevents") for name in os.listdir(run_dir))
    assert json.loads((tmp_path / "config.json").read_text())["sweep"]["seeds"] == list(SEEDS)
    assert os.listdir(tmp_path / "checkpoints") == ["10"]


def test_hyperparameter_sweep_runs_equal_runs_with_those_hyperparameters(separate, capsys):
    lr = _config().agent.learning_rate  # the config's own, which the separate runs use
    capsys.readouterr()
    sweep = anakin.train(_config(**{
        "sweep.seeds": SEEDS,
        # Run 1 changes two hyperparameters; the others keep the config's values.
        "sweep.agent.learning_rate": (lr, 3e-3, lr, lr),
        "sweep.agent.entropy_cost": (0.01, 0.05, 0.01, 0.01),
    }))
    # The console line, one per chunk, says what its figures are over the runs.
    lines = [line for line in capsys.readouterr().out.splitlines() if "sps=" in line]
    assert len(lines) == 2, lines
    assert all(" (mean over 4 runs)  sps=" in line and " (sum over 4 runs)" in line
               for line in lines), lines
    built = set(runner._PROGRAMS)
    alone = anakin.train(_config(**{"seed": 1, "agent.learning_rate": 3e-3,
                                    "agent.entropy_cost": 0.05}))
    # Hyperparameters are inputs of the compiled programs, not constants: the run with other
    # values reused the programs of the default runs rather than building new ones.
    assert set(runner._PROGRAMS) == built
    for run in (0, 2, 3):
        _assert_same_run(_run_slice(sweep.state, run), separate[SEEDS[run]].state)
    _assert_same_run(_run_slice(sweep.state, 1), alone.state)
    _assert_same_records(sweep.run_histories[1], alone.history)
    # The hyperparameters changed the run, by far more than the tolerance: it is not the
    # default seed-1 run.
    _assert_far_apart(alone.params, separate[1].params)
