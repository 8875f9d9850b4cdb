"""The state comparison helper of conftest.py: what it lets through and what it catches."""

import jax
import numpy as np
import pytest
from conftest import assert_trees_equal, relative_differences


def _state(**changes):
    state = {
        "params": {"w": np.array([0.5, -2.0, 1.0], np.float32), "b": np.zeros(2, np.float32)},
        "count": np.array(7, np.int32),
        "done": np.array([True, False]),
        "key": np.asarray(jax.random.PRNGKey(3)),  # uint32 [2]
    }
    for name, value in changes.items():
        if name in ("w", "b"):
            state["params"][name] = value
        else:
            state[name] = value
    return state


def test_identical_trees_pass_exactly():
    assert_trees_equal(_state(), _state())
    assert_trees_equal({"k": jax.random.key(1)}, {"k": jax.random.key(1)})


def test_one_ulp_fails_exactly_and_passes_within_a_tolerance():
    w = np.array([0.5, -2.0, np.nextafter(np.float32(1.0), np.float32(2.0))], np.float32)
    with pytest.raises(AssertionError, match="w"):
        assert_trees_equal(_state(w=w), _state())
    # 1 ulp of 1.0 is 2^-23; the leaf's largest magnitude is 2, so the measure is 2^-24.
    assert relative_differences(_state(w=w), _state())["['params']['w']"] == 2.0**-24
    assert_trees_equal(_state(w=w), _state(), float_rtol=2.0**-24)
    with pytest.raises(AssertionError, match="largest difference"):
        assert_trees_equal(_state(w=w), _state(), float_rtol=2.0**-25)


def test_the_tolerance_scales_with_the_leafs_largest_magnitude():
    # 0.5 -> 0.5 + 3e-6 is 1.5e-6 of the leaf's largest magnitude, 2.
    w = np.array([0.5 + 3e-6, -2.0, 1.0], np.float32)
    assert_trees_equal(_state(w=w), _state(), float_rtol=2e-6)
    with pytest.raises(AssertionError):
        assert_trees_equal(_state(w=w), _state(), float_rtol=1e-6)
    # A leaf of zeros has no scale: anything else fails, whatever the tolerance.
    with pytest.raises(AssertionError, match="b"):
        assert_trees_equal(_state(b=np.array([0.0, 1e-30], np.float32)), _state(), float_rtol=1)


@pytest.mark.parametrize("change", [
    {"count": np.array(8, np.int32)},
    {"done": np.array([True, True])},
    {"key": np.asarray(jax.random.PRNGKey(4))},
])
def test_integer_boolean_and_key_leaves_must_be_exact_whatever_the_tolerance(change):
    with pytest.raises(AssertionError):
        assert_trees_equal(_state(**change), _state(), float_rtol=1e6)


def test_typed_keys_are_compared_by_their_bits():
    with pytest.raises(AssertionError):
        assert_trees_equal({"k": jax.random.key(1)}, {"k": jax.random.key(2)}, float_rtol=1e6)


def test_dtype_shape_structure_and_nan_placement_must_match():
    with pytest.raises(AssertionError, match="dtype"):
        assert_trees_equal(_state(count=np.array(7, np.int64)), _state())
    with pytest.raises(AssertionError, match="shape"):
        assert_trees_equal(_state(b=np.zeros(3, np.float32)), _state(), float_rtol=1)
    with pytest.raises(AssertionError, match="structure"):
        assert_trees_equal({"a": np.zeros(2)}, {"b": np.zeros(2)})
    nan = np.array([np.nan, 1.0], np.float32)
    assert_trees_equal({"x": nan}, {"x": nan.copy()}, float_rtol=1e-6)
    with pytest.raises(AssertionError):
        assert_trees_equal({"x": nan[::-1].copy()}, {"x": nan}, float_rtol=1e6)
    with pytest.raises(AssertionError):
        assert_trees_equal({"x": np.array([np.inf, 1.0])}, {"x": np.array([2.0, 1.0])},
                           float_rtol=1e6)


@pytest.mark.parametrize("cores, memory_gib, workers", [
    (2, 24, 2),  # CI: one per core
    (16, 128, 4),  # capped at 4
    (8, 12, 2),  # one per 6 GiB of memory
    (1, 24, 1),
    (4, 4, 1),  # never fewer than one
])
def test_xdist_workers_one_per_core_at_most_four_and_one_per_six_gib(monkeypatch, cores,
                                                                     memory_gib, workers):
    import os

    import conftest

    page = 4096
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(os, "sysconf", lambda name: {
        "SC_PAGE_SIZE": page, "SC_PHYS_PAGES": memory_gib * 2**30 // page}[name])
    assert conftest.pytest_xdist_auto_num_workers(None) == workers
