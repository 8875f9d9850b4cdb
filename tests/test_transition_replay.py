"""`podracer.transition_replay` against hand-worked cases: the ring's layout across adds and
its wrap, which positions can be sampled (flagged, lookahead stored), the n-step windows read
across a trajectory edge, priorities and importance weights, and `n_step_target` against rlax
and by hand at a terminal and a truncation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from podracer import transition_replay as tr


def _steps(t0, t, b):
    """Timesteps of global times t0 .. t0 + t - 1 for b columns: value 10 * time + column."""
    times = np.arange(t0, t0 + t)[:, None]
    return {"value": jnp.asarray(10 * times + np.arange(b)[None, :], jnp.int32)}


def _ok(t, b):
    return jnp.ones((t, b), bool)


def test_positions_wait_for_their_lookahead_and_windows_read_across_adds():
    replay = tr.make_transition_replay(10, lookahead=2)
    state = replay.init({"value": jnp.zeros((), jnp.int32)})
    state = replay.add(state, _steps(0, 3, 2), _ok(3, 2))
    # Times 0, 1, 2 of columns 0, 1 in slots 0..5; only time 0 has its 2 following steps.
    assert int(replay.size(state)) == 2
    sample = replay.sample(state, jax.random.key(0), 64, alpha=0.0, beta=1.0)
    assert set(np.asarray(sample.indices).tolist()) == {0, 1}
    np.testing.assert_array_equal(sample.items["value"][sample.indices == 1][0], [1, 11, 21])
    # Times 3..5 fill slots 6..9 and wrap into 0, 1: times 1, 2, 3 can now be sampled.
    state = replay.add(state, _steps(3, 3, 2), _ok(3, 2))
    assert int(state.next_index) == 2 and int(state.stored) == 10
    assert int(replay.size(state)) == 6
    sample = replay.sample(state, jax.random.key(1), 600, alpha=0.0, beta=1.0)
    first = np.asarray(sample.items["value"][:, 0])
    assert set(first.tolist()) == {10, 11, 20, 21, 30, 31}
    # Each window is the position and the same column's next two timesteps, across the wrap.
    np.testing.assert_array_equal(sample.items["value"], first[:, None] + [0, 10, 20])
    # Uniform: each of the 6 positions about 100 times in 600 draws.
    counts = np.unique(first, return_counts=True)[1]
    assert counts.min() > 60 and counts.max() < 140
    np.testing.assert_allclose(sample.probabilities, 1 / 6, rtol=1e-5)
    np.testing.assert_allclose(sample.weights, 1.0, rtol=1e-5)


def test_unflagged_positions_are_never_drawn():
    replay = tr.make_transition_replay(16, lookahead=1)
    state = replay.init({"value": jnp.zeros((), jnp.int32)})
    flags = jnp.asarray([[True, False], [False, True], [True, True]])  # [T, B]
    state = replay.add(state, _steps(0, 3, 2), flags)
    # Times 0, 1 have their lookahead; of them only (time 0, column 0) and (1, 1) are flagged.
    assert int(replay.size(state)) == 2
    sample = replay.sample(state, jax.random.key(0), 100, alpha=0.0, beta=1.0)
    assert set(np.asarray(sample.items["value"][:, 0]).tolist()) == {0, 11}


def test_priorities_set_probabilities_and_importance_weights():
    replay = tr.make_transition_replay(8, lookahead=0)
    state = replay.init({"value": jnp.zeros((), jnp.int32)})
    state = replay.add(state, _steps(0, 3, 1), _ok(3, 1))
    state = replay.update_priorities(state, jnp.asarray([0, 1, 2]),
                                     jnp.asarray([1.0, 2.0, 5.0]))
    assert float(state.max_priority) == 5.0
    sample = replay.sample(state, jax.random.key(0), 4000, alpha=1.0, beta=1.0)
    # P = 1/8, 2/8, 5/8; weights (3 P)^-1 = 8/3, 4/3, 8/15, over their max: 1, 1/2, 1/5.
    expected_p = np.asarray([1, 2, 5]) / 8
    idx = np.asarray(sample.indices)
    np.testing.assert_allclose(sample.probabilities, expected_p[idx], rtol=1e-5)
    np.testing.assert_allclose(sample.weights, np.asarray([1.0, 0.5, 0.2])[idx], rtol=1e-5)
    freq = np.bincount(idx, minlength=3) / len(idx)
    np.testing.assert_allclose(freq, expected_p, atol=0.03)
    # alpha 0.5: P ∝ sqrt(p); a new position gets the largest priority seen (5).
    state = replay.add(state, _steps(3, 1, 1), _ok(1, 1))
    sample = replay.sample(state, jax.random.key(1), 8, alpha=0.5, beta=0.0)
    scores = np.sqrt([1.0, 2.0, 5.0, 5.0])
    np.testing.assert_allclose(sample.probabilities, (scores / scores.sum())[sample.indices],
                               rtol=1e-5)
    np.testing.assert_allclose(sample.weights, 1.0)  # beta = 0


def test_an_add_longer_than_the_ring_keeps_the_newest_timesteps():
    replay = tr.make_transition_replay(4, lookahead=1)
    state = replay.init({"value": jnp.zeros((), jnp.int32)})
    state = replay.add(state, _steps(0, 3, 2), _ok(3, 2))  # 6 timesteps into 4 slots
    # Slots hold times 1, 1, 2, 2 as the ring wrote them: time 2 in 0, 1; time 1 in 2, 3.
    np.testing.assert_array_equal(state.items["value"], [20, 21, 10, 11])
    sample = replay.sample(state, jax.random.key(0), 50, alpha=0.0, beta=1.0)
    np.testing.assert_array_equal(sample.items["value"][:, 1] - sample.items["value"][:, 0], 10)


def test_a_lookahead_wider_than_the_ring_is_refused():
    replay = tr.make_transition_replay(5, lookahead=2)
    state = replay.init({"value": jnp.zeros((), jnp.int32)})
    with pytest.raises(ValueError, match="lookahead"):
        replay.add(state, _steps(0, 1, 2), _ok(1, 2))


def test_n_step_target_matches_rlax_without_an_episode_end():
    r, d = jnp.asarray([1.0, 2.0, 3.0]), jnp.asarray([1.0, 0.5, 1.0])
    g, discount, k = tr.n_step_target(r, d, jnp.zeros(3, bool), gamma=0.9)
    v = 4.0
    # rlax's n-step return from the position: r_1 + g_1 r_2 + g_1 g_2 r_3 + g_1 g_2 g_3 v.
    expected = rlax.n_step_bootstrapped_returns(r, 0.9 * d, jnp.asarray([0.0, 0.0, v]), 3)[0]
    np.testing.assert_allclose(g + discount * v, expected, rtol=1e-6)
    np.testing.assert_allclose([g, discount], [1 + 0.9 * 2 + 0.81 * 0.5 * 3, 0.729 * 0.5],
                               rtol=1e-6)
    assert int(k) == 3


@pytest.mark.parametrize("d2, bootstrap", [(0.0, 0.0), (1.0, 0.81)])  # terminal, truncation
def test_n_step_target_stops_at_an_episode_end(d2, bootstrap):
    r, d = jnp.asarray([1.0, 2.0, 7.0]), jnp.asarray([1.0, d2, 1.0])
    g, discount, k = tr.n_step_target(r, d, jnp.asarray([False, True, False]), gamma=0.9)
    # The third reward belongs to the next episode: G = 1 + 0.9 * 2, bootstrap from step 2.
    np.testing.assert_allclose([g, discount], [2.8, bootstrap], rtol=1e-6)
    assert int(k) == 2


def test_replay_bytes_count_timesteps_and_priorities():
    example = {"obs": jax.ShapeDtypeStruct((4,), jnp.float32),
               "a": jax.ShapeDtypeStruct((), jnp.int32)}
    assert tr.transition_replay_bytes(100, example) == 100 * (16 + 4 + 4)
