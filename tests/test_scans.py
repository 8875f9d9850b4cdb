"""`podracer.scans.scan_with_metrics` against `jax.lax.scan`, and `podracer.faults.all_finite`
on hand-made trees."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podracer import faults, scans


def _body(carry, x):
    carry = carry * 0.5 + x
    return carry, {"loss": jnp.sum(carry), "ok": jnp.all(carry > 0), "count": jnp.int32(3),
                   "vector": carry, "half": jnp.asarray(0.25, jnp.bfloat16)}


def test_scan_with_metrics_stacks_what_lax_scan_stacks():
    xs = jnp.arange(12.0).reshape(6, 2)
    carry, expected = jax.lax.scan(_body, jnp.ones(2), xs)
    got_carry, got = jax.jit(lambda c, x: scans.scan_with_metrics(_body, c, x))(jnp.ones(2), xs)
    np.testing.assert_array_equal(got_carry, carry)
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name].shape == value.shape, name
        np.testing.assert_array_equal(np.asarray(got[name], np.float32),
                                      np.asarray(value, np.float32), err_msg=name)
    # The scalars come back as float32 (booleans as 0.0 / 1.0); the rest as they were.
    assert got["ok"].dtype == jnp.float32 and got["count"].dtype == jnp.float32
    assert got["vector"].dtype == expected["vector"].dtype


def test_scan_with_metrics_nests_and_unrolls():
    def outer(carry, xs):
        return scans.scan_with_metrics(_body, carry, xs, unroll=2)

    xs = jnp.arange(24.0).reshape(2, 6, 2)
    carry, metrics = jax.jit(lambda c, x: jax.lax.scan(outer, c, x))(jnp.ones(2), xs)
    reference = jnp.ones(2)
    losses = []
    for x in np.asarray(xs).reshape(12, 2):
        reference = reference * 0.5 + x
        losses.append(np.sum(reference))
    np.testing.assert_allclose(carry, reference, rtol=1e-6)
    np.testing.assert_allclose(metrics["loss"], np.reshape(losses, (2, 6)), rtol=1e-6)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("where", ["params", "bf16", "metric"])
def test_all_finite_finds_one_bad_element_in_any_floating_leaf(bad, where):
    tree = {"params": {"w": np.ones((3, 4), np.float32), "b": np.zeros(4, np.float32)},
            "bf16": jnp.ones(5, jnp.bfloat16), "steps": np.int32(7)}
    metrics = {"metric": np.float32(1.5)}
    assert bool(jax.jit(faults.all_finite)(metrics, tree))
    if where == "params":
        tree["params"]["w"][2, 1] = bad
    elif where == "bf16":
        tree["bf16"] = tree["bf16"].at[4].set(bad)
    else:
        metrics["metric"] = np.float32(bad)
    assert not bool(jax.jit(faults.all_finite)(metrics, tree))


def test_all_finite_ignores_integers_and_holds_for_no_floats():
    assert bool(faults.all_finite({"n": np.int32(2**31 - 1)}, ()))
    assert bool(faults.all_finite())
