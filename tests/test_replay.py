"""On-device replay: add, sample, update, prioritisation statistics, wrap-around, memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podracer import replay as replay_lib


def _items(start, num, length=4):
    """Segments whose every entry is its own id, so a sample shows where it came from."""
    ids = jnp.arange(start, start + num, dtype=jnp.int32)
    return {"id": ids, "seq": jnp.repeat(ids[:, None], length, axis=1).astype(jnp.uint8)}


def test_add_then_sample_returns_stored_items_in_their_dtype():
    replay = replay_lib.make_replay(8)
    state = replay.init({"id": jnp.zeros((), jnp.int32), "seq": jnp.zeros((4,), jnp.uint8)})
    state = replay.add(state, _items(0, 5))
    assert int(state.size) == 5 and int(state.next_index) == 5
    sample = replay.sample(state, jax.random.PRNGKey(0), 64)
    ids = np.asarray(sample.items["id"])
    assert set(ids) <= {0, 1, 2, 3, 4}
    assert sample.items["seq"].dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(sample.items["seq"])[:, 0], ids)
    np.testing.assert_array_equal(np.asarray(sample.indices), ids)  # slot i holds item i
    np.testing.assert_allclose(sample.weights, 1.0)  # uniform: every weight (N/N)^-beta = 1


def test_wrap_around_overwrites_oldest_and_never_mixes_segments():
    replay = replay_lib.make_replay(6)
    state = replay.init({"id": jnp.zeros((), jnp.int32), "seq": jnp.zeros((4,), jnp.uint8)})
    for start in range(0, 20, 4):  # 5 adds of 4 items into 6 slots
        state = replay.add(state, _items(start, 4))
    assert int(state.size) == 6
    # The 6 newest items are 14..19; slots hold them at (id mod 6).
    np.testing.assert_array_equal(np.sort(np.asarray(state.items["id"])), np.arange(14, 20))
    sample = replay.sample(state, jax.random.PRNGKey(1), 500)
    seq = np.asarray(sample.items["seq"])
    # Every sampled segment is one item's, whole: all entries equal its id.
    np.testing.assert_array_equal(seq, np.repeat(np.asarray(sample.items["id"])[:, None] % 256,
                                                 4, axis=1))
    assert set(np.asarray(sample.items["id"])) == set(range(14, 20))


def test_prioritised_sampling_frequencies_match_priorities():
    alpha = 0.5
    replay = replay_lib.make_replay(4, alpha=alpha, beta=1.0)
    state = replay.init({"id": jnp.zeros((), jnp.int32), "seq": jnp.zeros((4,), jnp.uint8)})
    state = replay.add(state, _items(0, 4))
    priorities = np.array([1.0, 4.0, 9.0, 16.0], np.float32)
    state = replay.update(state, jnp.arange(4), jnp.asarray(priorities))
    n = 40_000
    sample = replay.sample(state, jax.random.PRNGKey(2), n)
    expected = priorities**alpha / np.sum(priorities**alpha)  # 1, 2, 3, 4 over 10
    counts = np.bincount(np.asarray(sample.indices), minlength=4)
    # Binomial standard error is below 0.0025 here; 5 sigma.
    np.testing.assert_allclose(counts / n, expected, atol=0.0125)
    np.testing.assert_allclose(np.asarray(sample.probabilities),
                               expected[np.asarray(sample.indices)], rtol=1e-5)
    # Importance weights (N P(i))^-1 normalised by the largest: P = .1 .2 .3 .4 -> 1, 1/2, 1/3, 1/4
    weight_of = {int(i): float(w) for i, w in zip(sample.indices, sample.weights)}
    np.testing.assert_allclose([weight_of[i] for i in range(4)], [1, 1 / 2, 1 / 3, 1 / 4],
                               rtol=1e-5)
    assert float(state.max_priority) == 16.0


def test_new_items_get_the_max_priority_seen():
    replay = replay_lib.make_replay(4, alpha=1.0)
    state = replay.init({"id": jnp.zeros((), jnp.int32), "seq": jnp.zeros((4,), jnp.uint8)})
    state = replay.add(state, _items(0, 2))
    state = replay.update(state, jnp.array([0, 1]), jnp.array([0.5, 3.0]))
    state = replay.add(state, _items(2, 1))
    np.testing.assert_allclose(np.asarray(state.priorities), [0.5, 3.0, 3.0, 0.0])


def test_replay_functions_run_under_jit():
    replay = replay_lib.make_replay(16, alpha=0.6, beta=0.4)
    example = {"id": jnp.zeros((), jnp.int32), "seq": jnp.zeros((4,), jnp.uint8)}

    @jax.jit
    def cycle(state, key):
        state = replay.add(state, _items(0, 4))
        sample = replay.sample(state, key, 8)
        return replay.update(state, sample.indices, jnp.ones(8) * 2.0), sample.weights

    state, weights = cycle(replay.init(example), jax.random.PRNGKey(0))
    assert weights.shape == (8,) and int(state.size) == 4


def test_memory_is_computed_before_allocation():
    example = {"obs": jax.ShapeDtypeStruct((21, 84, 84), jnp.uint8),
               "reward": jax.ShapeDtypeStruct((21,), jnp.float32)}
    # 21*84*84 bytes + 21*4 bytes + a 4-byte priority per item.
    assert replay_lib.replay_bytes(1000, example) == 1000 * (21 * 84 * 84 + 84 + 4)
    with pytest.raises(ValueError, match="capacity"):
        replay_lib.make_replay(0)
