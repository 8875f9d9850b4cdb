"""`podracer.transition_replay` against hand-worked cases: the ring's layout across adds and
its wrap, which positions can be sampled (flagged, lookahead stored), the n-step windows read
across a trajectory edge, priorities and importance weights, and `n_step_target` against rlax
and by hand at a terminal and a truncation. Uniform draws are checked both ways the replay
makes them: alpha a Python 0 (by rejection, `draw_uniform`) and alpha traced (inverse CDF)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from podracer import position_replay as pr
from podracer import transition_replay as tr

# Uniform as DQN passes it with its config's alpha 0 (a Python 0), and as a swept alpha.
UNIFORM = pytest.mark.parametrize("alpha", [0.0, jnp.float32(0.0)], ids=["static", "traced"])


def _steps(t0, t, b):
    """Timesteps of global times t0 .. t0 + t - 1 for b columns: value 10 * time + column."""
    times = np.arange(t0, t0 + t)[:, None]
    return {"value": jnp.asarray(10 * times + np.arange(b)[None, :], jnp.int32)}


def _ok(t, b):
    return jnp.ones((t, b), bool)


@UNIFORM
def test_positions_wait_for_their_lookahead_and_windows_read_across_adds(alpha):
    replay = tr.make_transition_replay(10, lookahead=2)
    state = replay.init({"value": jnp.zeros((), jnp.int32)})
    state = replay.add(state, _steps(0, 3, 2), _ok(3, 2))
    # Times 0, 1, 2 of columns 0, 1 in slots 0..5; only time 0 has its 2 following steps.
    assert int(replay.size(state)) == 2
    sample = replay.sample(state, jax.random.key(0), 64, alpha=alpha, beta=1.0)
    assert set(np.asarray(sample.indices).tolist()) == {0, 1}
    np.testing.assert_array_equal(sample.items["value"][sample.indices == 1][0], [1, 11, 21])
    # Times 3..5 fill slots 6..9 and wrap into 0, 1: times 1, 2, 3 can now be sampled.
    state = replay.add(state, _steps(3, 3, 2), _ok(3, 2))
    assert int(state.next_index) == 2 and int(state.stored) == 10
    assert int(replay.size(state)) == 6
    sample = replay.sample(state, jax.random.key(1), 600, alpha=alpha, beta=1.0)
    first = np.asarray(sample.items["value"][:, 0])
    assert set(first.tolist()) == {10, 11, 20, 21, 30, 31}
    # Each window is the position and the same column's next two timesteps, across the wrap.
    np.testing.assert_array_equal(sample.items["value"], first[:, None] + [0, 10, 20])
    # Uniform: each of the 6 positions about 100 times in 600 draws.
    counts = np.unique(first, return_counts=True)[1]
    assert counts.min() > 60 and counts.max() < 140
    np.testing.assert_allclose(sample.probabilities, 1 / 6, rtol=1e-5)
    np.testing.assert_allclose(sample.weights, 1.0, rtol=1e-5)


@UNIFORM
def test_unflagged_positions_are_never_drawn(alpha):
    replay = tr.make_transition_replay(16, lookahead=1)
    state = replay.init({"value": jnp.zeros((), jnp.int32)})
    flags = jnp.asarray([[True, False], [False, True], [True, True]])  # [T, B]
    state = replay.add(state, _steps(0, 3, 2), flags)
    # Times 0, 1 have their lookahead; of them only (time 0, column 0) and (1, 1) are flagged.
    assert int(replay.size(state)) == 2
    sample = replay.sample(state, jax.random.key(0), 100, alpha=alpha, beta=1.0)
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


def test_a_static_uniform_draw_with_few_flagged_positions_is_still_uniform_over_them():
    # 400 slots, one column, no lookahead; 3 flagged: 8 proposals find one about 6% of the
    # time, so nearly every draw falls back to the inverse-CDF draw over the whole replay.
    replay = tr.make_transition_replay(400, lookahead=0)
    state = replay.init({"value": jnp.zeros((), jnp.int32)})
    flags = np.zeros((400, 1), bool)
    flags[[7, 200, 399]] = True
    state = replay.add(state, _steps(0, 400, 1), jnp.asarray(flags))
    sample = jax.jit(lambda s, k: replay.sample(s, k, 3000, alpha=0.0, beta=1.0))(
        state, jax.random.key(0))
    values = np.asarray(sample.items["value"][:, 0])
    assert set(values.tolist()) == {70, 2000, 3990}
    freq = np.unique(values, return_counts=True)[1] / 3000
    np.testing.assert_allclose(freq, 1 / 3, atol=0.04)  # 4 standard deviations
    np.testing.assert_allclose(sample.probabilities, 1 / 3, rtol=1e-6)
    np.testing.assert_array_equal(sample.weights, 1.0)


def test_a_sweep_of_replays_draws_what_each_replay_draws_alone():
    # Two runs vmapped: one whose proposals all land (every position flagged) and one that
    # needs the fallback (2 of 64 flagged). The fallback runs for the whole batch, and leaves
    # the first run's draws as they are alone.
    replay = tr.make_transition_replay(64, lookahead=1)
    state = replay.init({"value": jnp.zeros((), jnp.int32)})
    sparse = np.zeros((32, 2), bool)
    sparse[[3, 20], [1, 0]] = True
    states = [replay.add(state, _steps(0, 32, 2), flags)
              for flags in (_ok(32, 2), jnp.asarray(sparse))]
    keys = jax.random.split(jax.random.key(1), 2)
    draw = lambda s, k: replay.sample(s, k, 256, alpha=0.0, beta=1.0).items["value"][:, 0]
    swept = jax.jit(jax.vmap(draw))(jax.tree.map(lambda *x: jnp.stack(x), *states), keys)
    alone = [jax.jit(draw)(s, k) for s, k in zip(states, keys)]
    np.testing.assert_array_equal(swept[0], alone[0])
    # Dense: times 0..30 (time 31 waits for its lookahead), both columns.
    assert set(np.asarray(swept[0]).tolist()) <= {10 * t + c for t in range(31) for c in (0, 1)}
    assert set(np.asarray(swept[1]).tolist()) == {31, 200}


def test_cond_for_any_stays_a_branch_under_vmap_and_matches_lax_cond():
    # The true branch leaves an element whose predicate is false as the false branch does
    # (`cond_for_any`'s contract).
    def expensive(args):
        pred, x = args
        return jnp.where(pred, jnp.cumsum(x), x)

    cheap = lambda args: args[1]
    fn = lambda pred, x: pr.cond_for_any(pred, expensive, cheap, (pred, x))
    plain = lambda pred, x: jax.lax.cond(pred, expensive, cheap, (pred, x))
    preds = jnp.asarray([False, True, False])
    xs = jnp.asarray([[1.0, 2.0], [-1.0, -2.0], [3.0, -4.0]])
    branches = lambda f: "stablehlo.case" in jax.jit(jax.vmap(f)).lower(preds, xs).as_text()
    assert branches(fn)
    # lax.cond under vmap computes both branches and selects: no branch left.
    assert not branches(plain)
    expected = np.stack([plain(p, x) for p, x in zip(preds, xs)])
    np.testing.assert_array_equal(jax.vmap(fn)(preds, xs), expected)
    # Nested vmaps, and a predicate that holds nowhere: the cheap branch for all.
    nested = jax.vmap(jax.vmap(fn))(jnp.stack([preds, ~preds]), jnp.stack([xs, xs]))
    np.testing.assert_array_equal(nested[0], expected)
    np.testing.assert_array_equal(nested[1], np.stack([plain(p, x) for p, x in zip(~preds, xs)]))
    np.testing.assert_array_equal(jax.vmap(fn)(jnp.zeros(3, bool), xs), xs)


def test_a_static_uniform_draw_leaves_the_scans_over_the_replay_to_its_fallback():
    # Alpha a Python 0: the inverse-CDF draw (scans over every slot: a cumulative sum, and the
    # running min and max of `draw_positions`) sits only inside the rarely taken fallback
    # branch; with alpha traced it is the draw itself.
    replay = tr.make_transition_replay(1000, lookahead=1)
    state = replay.init({"value": jnp.zeros((), jnp.int32)})

    def top_level(alpha):
        jaxpr = jax.make_jaxpr(lambda s: replay.sample(s, jax.random.key(0), 8, alpha=alpha,
                                                         beta=1.0))(state)
        return {eqn.primitive.name for eqn in jaxpr.jaxpr.eqns}

    assert not {"cummin", "cummax"} & top_level(0.0)
    assert {"cummin", "cummax"} <= top_level(jnp.float32(0.0))
