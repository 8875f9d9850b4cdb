"""Replay of positions: windows across trajectory edges, per-position priorities, IS weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podracer import position_replay as pr

EXAMPLE = {"t": jnp.zeros((), jnp.int32), "frame": jnp.zeros((2,), jnp.uint8)}


def _steps(start, period, columns):
    """T timesteps of B columns whose field `t` is 100 + 10 * stream time + column (0 marks
    never-written storage), time-major [T, B]."""
    time = jnp.arange(start, start + period)[:, None]
    t = 100 + 10 * time + jnp.arange(columns)[None, :]
    return {"t": t.astype(jnp.int32),
            "frame": jnp.broadcast_to((t % 256).astype(jnp.uint8)[..., None],
                                      (period, columns, 2))}


def _stamp(time, column):
    return 100 + 10 * time + column


def test_windows_cross_trajectory_edges_and_pre_stream_positions_are_never_sampled():
    # T = 3, P = K + n = 2, H = 1: window i holds stream times 3i - 3 .. 3i + 2 and owns the
    # positions 3i - 2 .. 3i. After 3 adds (times 0..8) the owned positions are -2..6; those
    # before the stream (-2, -1) are never sampled, 7 and 8 wait for a window that has their
    # 2 lookahead steps. A sample returns times tau - 1 .. tau + 2.
    replay = pr.make_position_replay(8, period=3, lookahead=2, history=1)
    state = replay.init(EXAMPLE)
    for i in range(3):
        state = replay.add(state, _steps(3 * i, 3, 2), jnp.ones((3, 2), bool))
    assert int(replay.size(state)) == 2 * 7  # positions 0..6 of each of 2 columns
    sample = replay.sample(state, jax.random.PRNGKey(0), 2000, alpha=0.0, beta=1.0)
    t = np.asarray(sample.windows["t"])  # [S, 4]
    assert t.shape == (2000, 4)
    tau, column = (t[:, 1] - 100) // 10, (t[:, 1] - 100) % 10
    assert set(zip(tau.tolist(), column.tolist())) == {(s, c) for s in range(7) for c in (0, 1)}
    for k in range(1, 4):  # the unroll and target steps: consecutive times of one column
        np.testing.assert_array_equal(t[:, k], _stamp(tau + k - 1, column))
    # The step before position 0 was never written (zeros); otherwise it is time tau - 1.
    np.testing.assert_array_equal(t[:, 0], np.where(tau == 0, 0, _stamp(tau - 1, column)))
    np.testing.assert_array_equal(np.asarray(sample.windows["frame"])[:, :, 0], t % 256)
    np.testing.assert_allclose(sample.weights, 1.0)  # uniform: every (M / M)^-beta = 1


def test_unsampleable_timesteps_are_never_drawn_and_the_ring_keeps_tails_when_it_wraps():
    # One column, T = 2, P = 1, 2 windows: after 4 adds (times 0..7) the ring holds windows
    # 2 and 3, owning positions 3, 4 and 5, 6 (window i owns 2i - 1, 2i); time 5 is flagged.
    replay = pr.make_position_replay(2, period=2, lookahead=1)
    state = replay.init(EXAMPLE)
    for i in range(4):
        flags = jnp.array([[True], [i != 2]])  # time 2i + 1 = 5 is not sampleable
        state = replay.add(state, _steps(2 * i, 2, 1), flags)
    assert int(replay.size(state)) == 3
    sample = replay.sample(state, jax.random.PRNGKey(1), 600, alpha=0.0, beta=1.0)
    t = np.asarray(sample.windows["t"])
    tau = (t[:, 0] - 100) // 10
    assert set(tau.tolist()) == {3, 4, 6}
    np.testing.assert_array_equal(t[:, 1], _stamp(tau + 1, 0))


def test_per_position_priorities_set_sampling_frequencies_and_importance_weights():
    # One window owning 5 positions, one of them not sampleable (M = 4).
    replay = pr.make_position_replay(1, period=5, lookahead=0)
    state = replay.init(EXAMPLE)
    state = replay.add(state, _steps(0, 5, 1), jnp.array([[1], [1], [0], [1], [1]], bool))
    np.testing.assert_allclose(np.asarray(state.priorities), [[1, 1, 0, 1, 1]])  # max priority
    priorities = np.array([1.0, 4.0, 9.0, 16.0], np.float32)
    owned = jnp.array([0, 1, 3, 4])
    state = replay.update(state, jnp.zeros(4, jnp.int32), owned, jnp.asarray(priorities))
    assert float(state.max_priority) == 16.0
    n = 40_000
    # alpha = 1/2: P = sqrt(p) / sum = 1, 2, 3, 4 over 10.
    expected = np.array([1, 2, 3, 4]) / 10
    for beta, weights in [
        # w = (M P)^-beta / max: (4 P)^-1 = 2.5, 1.25, 0.833, 0.625 -> 1, 1/2, 1/3, 1/4.
        (1.0, [1, 1 / 2, 1 / 3, 1 / 4]),
        # beta = 1/2: the square roots of those.
        (0.5, [1, 2 ** -0.5, 3 ** -0.5, 1 / 2]),
    ]:
        sample = replay.sample(state, jax.random.PRNGKey(2), n, alpha=0.5, beta=beta)
        positions = np.asarray(sample.positions)
        counts = np.array([np.sum(positions == u) for u in (0, 1, 3, 4)])
        assert np.sum(positions == 2) == 0
        # Binomial standard error is below 0.0025 here; 5 sigma.
        np.testing.assert_allclose(counts / n, expected, atol=0.0125)
        weight_of = {int(u): float(w) for u, w in zip(positions, sample.weights)}
        np.testing.assert_allclose([weight_of[u] for u in (0, 1, 3, 4)], weights, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(sample.probabilities),
                                   [dict(zip((0, 1, 3, 4), expected))[u] for u in positions],
                                   rtol=1e-5)
    # alpha = 0 is uniform over the sampleable positions whatever their priorities.
    sample = replay.sample(state, jax.random.PRNGKey(3), n, alpha=0.0, beta=1.0)
    counts = np.bincount(np.asarray(sample.positions), minlength=5)
    np.testing.assert_allclose(counts / n, [0.25, 0.25, 0, 0.25, 0.25], atol=0.011)
    np.testing.assert_allclose(sample.weights, 1.0)
    # New positions get the largest priority seen.
    state = replay.add(state, _steps(5, 5, 1), jnp.ones((5, 1), bool))
    np.testing.assert_allclose(np.asarray(state.priorities), [[16.0] * 5])


def test_position_replay_runs_under_jit_and_checks_sizes():
    replay = pr.make_position_replay(4, period=3, lookahead=2, history=1)

    @jax.jit
    def cycle(state, key):
        state = replay.add(state, _steps(0, 3, 2), jnp.ones((3, 2), bool))
        state = replay.add(state, _steps(3, 3, 2), jnp.ones((3, 2), bool))
        sample = replay.sample(state, key, 8, alpha=0.6, beta=0.4)
        return replay.update(state, sample.slots, sample.positions, jnp.full(8, 2.0)), sample

    state, sample = cycle(replay.init(EXAMPLE), jax.random.PRNGKey(0))
    assert sample.windows["frame"].shape == (8, 4, 2) and sample.weights.shape == (8,)
    assert float(state.max_priority) == 2.0
    with pytest.raises(ValueError, match="columns"):
        replay.add(state, _steps(0, 3, 5), jnp.ones((3, 5), bool))
    with pytest.raises(ValueError, match="period"):
        replay.add(state, _steps(0, 2, 2), jnp.ones((2, 2), bool))


def test_memory_is_computed_before_allocation():
    example = {"frame": jax.ShapeDtypeStruct((84, 84), jnp.uint8),
               "reward": jax.ShapeDtypeStruct((), jnp.float32)}
    # Windows of 3 + 15 + 20 = 38 timesteps of (84*84 + 4 + 1 flag) bytes, and 20 4-byte
    # priorities, per window.
    assert pr.position_replay_bytes(1000, example, period=20, lookahead=15, history=3) == (
        1000 * (38 * (84 * 84 + 5) + 80))
    with pytest.raises(ValueError, match="capacity"):
        pr.make_position_replay(0, period=3, lookahead=1)


def test_a_draw_that_float_rounding_puts_on_a_zero_probability_position_is_moved_to_a_valid_one():
    # A float32 running sum need not be monotone: here the second entry has probability 0 but
    # its running sum rose by rounding. Plain inverse-CDF sampling returns the first index
    # whose running sum reaches r = total * (1 - u); r = 0.3000001 reaches index 1.
    cumulative = jnp.asarray([0.3, 0.30000012, 0.6, 1.0], jnp.float32)
    valid = jnp.asarray([True, False, True, True])
    u = 1.0 - jnp.asarray([0.30000006, 0.1, 0.9999], jnp.float32)  # r = 0.30000006, 0.1, 0.9999
    assert int(jnp.searchsorted(cumulative, jnp.float32(0.30000006))) == 1  # the invalid index
    np.testing.assert_array_equal(pr.draw_positions(cumulative, valid, u), [2, 0, 3])
    # No valid index after the draw: the nearest before it.
    cumulative = jnp.asarray([0.5, 1.0, 1.0000001], jnp.float32)
    valid = jnp.asarray([True, True, False])
    np.testing.assert_array_equal(pr.draw_positions(cumulative, valid, jnp.zeros(1)), [1])


def test_many_draws_from_a_large_replay_never_return_an_unsampleable_position():
    # 100,000 positions, 7% unsampleable (priority 0), as in a MinAtar run whose sweeps once
    # stopped on NaN: an unsampleable draw has probability 0, so an infinite importance weight.
    replay = pr.make_position_replay(10_000, period=10, lookahead=0)
    state = replay.init({"x": jnp.zeros((), jnp.float32)})
    rng = np.random.default_rng(0)
    priorities = rng.uniform(0.1, 2.0, (10_000, 10)).astype(np.float32)
    priorities[rng.uniform(size=priorities.shape) < 0.07] = 0.0
    state = state.replace(priorities=jnp.asarray(priorities))
    draw = jax.jit(lambda key: replay.sample(state, key, 500_000, alpha=1.0, beta=1.0))
    for seed in range(4):
        sample = draw(jax.random.key(seed))
        assert np.all(priorities[np.asarray(sample.slots), np.asarray(sample.positions)] > 0)
        assert np.all(np.isfinite(np.asarray(sample.weights)))
