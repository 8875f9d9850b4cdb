"""Sweeps vmapped inside one Anakin program: each run equals the same run made on its own.

The runs' whole states (parameters, optimiser state, environments, keys) are compared bit for
bit. The logged metrics are compared exactly where they are counts and sums of rewards, and to
a relative 1e-6 where they are float reductions: under `vmap` XLA may order a reduction
differently (the gradient-norm metric, e.g., differs in its last bit), which no state depends
on in these runs. A run whose update depends on such a reduction (gradient clipping that
triggers) can then differ by rounding too, and drift apart over many updates.
"""

import json
import os

import jax
import numpy as np
import pytest

import anakin
from anakin import runner
from experiments.configs import vtrace_catch

SEEDS = (0, 1, 2, 3)
TIMING = {"steps_per_second", "wall_time"}


def _config(**overrides):
    config = vtrace_catch.get_config()
    config.num_devices = 2
    config.num_envs = 16
    config.rollout_length = 10
    config.updates_per_chunk = 5
    config.total_env_steps = 16 * 10 * 5 * 2  # 2 chunks
    config.eval_every_updates = 10  # once, after the last chunk
    config.eval_episodes = 8
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return config


@pytest.fixture(scope="module")
def separate():
    """Four ordinary runs, one per seed."""
    return {seed: anakin.train(_config(seed=seed)) for seed in SEEDS}


def _run_slice(tree, run):
    return jax.tree.map(lambda x: np.asarray(x)[:, run], jax.device_get(tree))


def _assert_identical(actual, expected):
    leaves_a, tree_a = jax.tree.flatten(actual)
    leaves_e, tree_e = jax.tree.flatten(jax.device_get(expected))
    assert tree_a == tree_e
    for a, e in zip(leaves_a, leaves_e, strict=True):
        assert np.asarray(a).dtype == np.asarray(e).dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def _assert_same_records(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        a = {k: v for k, v in a.items() if k not in TIMING}
        e = {k: v for k, v in e.items() if k not in TIMING}
        assert a.keys() == e.keys()
        for key in ("env_steps", "updates", "episodes", "episode_return", "episode_length"):
            assert a[key] == e[key], key
        for key in a:
            np.testing.assert_allclose(a[key], e[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_four_seed_sweep_equals_four_separate_runs(separate, tmp_path):
    sweep = anakin.train(_config(**{"sweep.seeds": SEEDS}), str(tmp_path))
    assert len(sweep.run_histories) == len(SEEDS)
    params = sweep.params
    for run, seed in enumerate(SEEDS):
        alone = separate[seed]
        # The whole state: parameters, optimiser state, environments, RNG keys, counters.
        _assert_identical(_run_slice(sweep.state, run), alone.state)
        _assert_identical(jax.tree.map(lambda x, r=run: x[r], params), alone.params)
        # The same metrics, evaluation included, chunk by chunk.
        _assert_same_records(sweep.run_histories[run], alone.history)
        assert "eval_return" in sweep.run_histories[run][-1]
    # The seeds did make different runs.
    first = jax.tree.leaves(separate[0].params)[0]
    assert not np.array_equal(first, jax.tree.leaves(separate[1].params)[0])

    # Each run is logged on its own, with its own resolved config.
    for run, seed in enumerate(SEEDS):
        run_dir = tmp_path / f"run_{run}"
        records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
        _assert_same_records(records, separate[seed].history)
        assert json.load(open(run_dir / "config.json"))["seed"] == seed
        assert any(name.startswith("events.out.tfevents") for name in os.listdir(run_dir))
    assert json.load(open(tmp_path / "config.json"))["sweep"]["seeds"] == list(SEEDS)
    assert os.listdir(tmp_path / "checkpoints") == ["10"]


def test_hyperparameter_sweep_runs_equal_runs_with_those_hyperparameters(separate):
    sweep = anakin.train(_config(**{
        "sweep.seeds": SEEDS,
        # Run 1 changes two hyperparameters; the others keep the defaults.
        "sweep.agent.learning_rate": (1e-3, 3e-3, 1e-3, 1e-3),
        "sweep.agent.entropy_cost": (0.01, 0.05, 0.01, 0.01),
    }))
    built = set(runner._PROGRAMS)
    alone = anakin.train(_config(**{"seed": 1, "agent.learning_rate": 3e-3,
                                    "agent.entropy_cost": 0.05}))
    # Hyperparameters are inputs of the compiled programs, not constants: the run with other
    # values reused the programs of the default runs rather than building new ones.
    assert set(runner._PROGRAMS) == built
    for run in (0, 2, 3):
        _assert_identical(_run_slice(sweep.state, run), separate[SEEDS[run]].state)
    _assert_identical(_run_slice(sweep.state, 1), alone.state)
    _assert_same_records(sweep.run_histories[1], alone.history)
    # The hyperparameters changed the run: it is not the default seed-1 run.
    assert not np.array_equal(jax.tree.leaves(alone.params)[0],
                              jax.tree.leaves(separate[1].params)[0])
