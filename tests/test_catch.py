"""Catch dynamics and TimeStep semantics against hand-worked cases, with the wrappers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from podracer.types import StepType

LEFT, STAY, RIGHT = 0, 1, 2


def _board(ball_y, ball_x, paddle_x):
    board = np.zeros((10, 5), np.float32)
    board[ball_y, ball_x] = 1.0
    board[9, paddle_x] = 1.0
    return board


def _reset_with_ball_at(env, column):
    """Finds a reset key whose ball starts in `column` (the start column is random)."""
    for seed in range(200):
        state, timestep = env.reset(jax.random.PRNGKey(seed))
        if int(state.ball_x) == column:
            return state, timestep
    raise AssertionError(f"no seed in 200 put the ball in column {column}")


def test_reset_puts_ball_on_top_row_and_paddle_in_the_middle():
    env = envs_jax.Catch()
    _, timestep = _reset_with_ball_at(env, 4)
    assert int(timestep.step_type) == StepType.FIRST
    assert float(timestep.reward) == 0.0 and float(timestep.discount) == 1.0
    np.testing.assert_array_equal(timestep.observation, _board(0, 4, 2))


def test_ball_columns_cover_the_board():
    env = envs_jax.Catch()
    keys = jax.random.split(jax.random.PRNGKey(0), 500)
    states, _ = jax.vmap(env.reset)(keys)
    counts = np.bincount(np.asarray(states.ball_x), minlength=5)
    assert counts.shape == (5,) and counts.min() > 60  # ~100 each if uniform


def test_catching_the_ball_ends_with_plus_one_after_nine_steps():
    env = envs_jax.Catch()
    state, _ = _reset_with_ball_at(env, 4)
    actions = [RIGHT, RIGHT, RIGHT, STAY, STAY, STAY, STAY, STAY, STAY]
    paddle = [3, 4, 4, 4, 4, 4, 4, 4, 4]  # clipped at the right wall
    for t, action in enumerate(actions):
        state, timestep = env.step(state, jnp.asarray(action))
        np.testing.assert_array_equal(timestep.observation, _board(t + 1, 4, paddle[t]))
        if t < 8:
            assert int(timestep.step_type) == StepType.MID
            assert float(timestep.reward) == 0.0 and float(timestep.discount) == 1.0
    assert int(timestep.step_type) == StepType.LAST
    assert float(timestep.reward) == 1.0
    assert float(timestep.discount) == 0.0  # a true terminal


def test_missing_the_ball_ends_with_minus_one():
    env = envs_jax.Catch()
    state, _ = _reset_with_ball_at(env, 0)
    for _ in range(9):
        state, timestep = env.step(state, jnp.asarray(RIGHT))
    assert int(timestep.step_type) == StepType.LAST
    assert float(timestep.reward) == -1.0 and float(timestep.discount) == 0.0
    np.testing.assert_array_equal(timestep.observation, _board(9, 0, 4))


def test_specs_describe_the_outputs():
    env = envs_jax.make("catch")
    assert env.observation_spec().shape == (10, 5)
    assert env.action_spec().num_values == 3
    _, timestep = env.reset(jax.random.PRNGKey(0))
    assert timestep.observation.shape == (10, 5) and timestep.observation.dtype == jnp.float32


def test_unknown_environment_names_the_registered_ones():
    with pytest.raises(KeyError, match="catch"):
        envs_jax.make("catsh")


def test_auto_reset_starts_a_new_episode_after_last_and_keeps_the_final_observation():
    env = envs_jax.wrap_for_training(envs_jax.Catch())
    state, timestep = env.reset(jax.random.PRNGKey(0))
    step = jax.jit(env.step)
    kinds, rewards = [], []
    for _ in range(20):
        state, timestep = step(state, jnp.asarray(STAY))
        kinds.append(int(timestep.step_type))
        rewards.append(float(timestep.reward))
        if timestep.last():
            # The final observation: the ball has reached the paddle's row.
            assert timestep.observation[9].sum() >= 1.0 and timestep.observation[:9].sum() == 0
            assert float(timestep.extras["episode_length"]) == 9
            assert float(timestep.extras["episode_return"]) == rewards[-1]
    mid, last, first = StepType.MID, StepType.LAST, StepType.FIRST
    # 9 steps to the end, then the reset step (FIRST, reward 0), then 9 more.
    assert kinds == [mid] * 8 + [last] + [first] + [mid] * 8 + [last] + [first]
    assert rewards[9] == 0.0 and rewards[19] == 0.0


def test_time_limit_truncates_with_discount_one():
    env = envs_jax.wrap_for_training(envs_jax.Catch(), max_episode_steps=4)
    state, timestep = env.reset(jax.random.PRNGKey(0))
    for t in range(5):
        state, timestep = env.step(state, jnp.asarray(STAY))
        if t < 3:
            assert int(timestep.step_type) == StepType.MID
    # Step 4 ended the episode by the time limit (the ball is on row 4, not at the bottom).
    # Step 5 is the reset.
    assert int(timestep.step_type) == StepType.FIRST
    state, timestep = env.reset(jax.random.PRNGKey(0))
    for _ in range(4):
        state, timestep = env.step(state, jnp.asarray(STAY))
    assert int(timestep.step_type) == StepType.LAST
    assert float(timestep.discount) == 1.0  # truncation, not termination
    assert float(timestep.reward) == 0.0
    assert int(timestep.extras["episode_length"]) == 4


def test_vmapped_episodes_are_independent_and_deterministic():
    env = envs_jax.wrap_for_training(envs_jax.Catch())
    keys = jax.random.split(jax.random.PRNGKey(7), 16)

    def run(keys):
        state, _ = jax.vmap(env.reset)(keys)

        def body(state, _):
            state, timestep = jax.vmap(env.step)(state, jnp.full((16,), STAY))
            return state, timestep.observation

        return jax.lax.scan(body, state, length=30)[1]

    first = jax.jit(run)(keys)

    def alone(key):  # one environment, traced on its own, without vmap
        state, _ = env.reset(key)

        def body(state, _):
            state, timestep = env.step(state, jnp.asarray(STAY))
            return state, timestep.observation

        return jax.lax.scan(body, state, length=30)[1]

    # Each environment of the batch runs as it would alone with its key.
    for i in (0, 5, 15):
        np.testing.assert_array_equal(first[:, i], alone(keys[i]))
    # Different keys give different ball columns somewhere in the batch.
    assert not np.all(first[0] == first[0][:1])


# ---------------------------------------------------------------------------------------------
# Stochastic Catch: the ball drifts a column with probability p after it falls.


def test_catch_without_drift_is_catch_and_keeps_its_key():
    # stochastic_catch with p = 0: the ball falls straight down its column (2), the paddle
    # moves from the middle (2) by each action, as worked by hand; no key is drawn.
    still = envs_jax.stochastic_catch(drift_probability=0.0)
    state, _ = _reset_with_ball_at(still, 2)
    key = np.asarray(state.key)
    for t, (action, paddle) in enumerate(zip([LEFT, STAY, RIGHT, RIGHT], [1, 1, 2, 3])):
        state, timestep = still.step(state, jnp.asarray(action))
        np.testing.assert_array_equal(timestep.observation, _board(t + 1, 2, paddle))
    np.testing.assert_array_equal(state.key, key)


def _drifts(env, ball_x, num=4000):
    """The ball's column moves (new - old) over `num` one-step draws from column `ball_x`,
    the paddle staying: as counts of -1, 0, +1."""
    state, _ = env.reset(jax.random.PRNGKey(0))
    states = jax.vmap(lambda key: state.replace(ball_x=jnp.asarray(ball_x, jnp.int32), key=key))(
        jax.random.split(jax.random.PRNGKey(1), num))
    after, timesteps = jax.vmap(env.step, in_axes=(0, None))(states, jnp.asarray(STAY))
    np.testing.assert_array_equal(after.ball_y, 1)  # the ball fell one row, as in Catch
    np.testing.assert_array_equal(after.paddle_x, 2)
    moves = np.asarray(after.ball_x) - ball_x
    # The observation shows the ball where it drifted to.
    obs = np.asarray(timesteps.observation)
    np.testing.assert_array_equal(obs[np.arange(num), 1, np.asarray(after.ball_x)], 1.0)
    return [int(np.sum(moves == m)) for m in (-1, 0, 1)]


def test_the_ball_drifts_left_or_right_with_half_the_probability_each():
    # Column 2, p = 0.25: left 1/8, stay 3/4, right 1/8 (4000 draws: 500, 3000, 500; the
    # bounds are five standard deviations).
    left, stay, right = _drifts(envs_jax.make("stochastic_catch"), 2)
    assert abs(left - 500) < 105 and abs(right - 500) < 105 and abs(stay - 3000) < 140


def test_a_drift_into_the_wall_leaves_the_ball_in_place():
    # Column 0, p = 0.25: a left drift is blocked, so stay 7/8 and right 1/8.
    left, stay, right = _drifts(envs_jax.make("stochastic_catch"), 0)
    assert left == 0 and abs(right - 500) < 105 and abs(stay - 3500) < 105


def test_with_certain_drift_the_ball_never_stays_off_the_walls():
    # p = 1: every step the ball moves left or right, each half the time.
    left, stay, right = _drifts(envs_jax.make("stochastic_catch", drift_probability=1.0), 2)
    assert stay == 0 and abs(left - 2000) < 160 and abs(right - 2000) < 160


def test_the_catch_is_decided_where_the_ball_lands_after_its_last_drift():
    env = envs_jax.make("stochastic_catch", drift_probability=1.0)
    state, _ = env.reset(jax.random.PRNGKey(0))
    # The ball one row above the bottom in column 2, the paddle under it, staying: the last
    # drift always moves the ball (p = 1), so it is always missed.
    state = state.replace(ball_y=jnp.asarray(8, jnp.int32), ball_x=jnp.asarray(2, jnp.int32),
                          paddle_x=jnp.asarray(2, jnp.int32))
    keys = jax.random.split(jax.random.PRNGKey(2), 64)
    after, ts = jax.vmap(lambda k: env.step(state.replace(key=k), jnp.asarray(STAY)))(keys)
    np.testing.assert_array_equal(ts.step_type, StepType.LAST)
    np.testing.assert_array_equal(ts.reward, -1.0)
    np.testing.assert_array_equal(ts.discount, 0.0)
    assert set(np.asarray(after.ball_x).tolist()) == {1, 3}
    # Moving the paddle right catches exactly the balls that drifted right.
    after, ts = jax.vmap(lambda k: env.step(state.replace(key=k), jnp.asarray(RIGHT)))(keys)
    np.testing.assert_array_equal(ts.reward, np.where(np.asarray(after.ball_x) == 3, 1.0, -1.0))


def test_stochastic_catch_is_registered_with_its_drift_and_refuses_a_bad_one():
    assert "stochastic_catch" in envs_jax.registered(adapters=False)
    assert envs_jax.make("stochastic_catch").drift_probability == 0.25
    assert envs_jax.make("catch").drift_probability == 0.0
    with pytest.raises(ValueError, match="drift_probability"):
        envs_jax.Catch(drift_probability=1.5)
