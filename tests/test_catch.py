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
    second = jax.jit(run)(keys)
    np.testing.assert_array_equal(first, second)
    # Different keys give different ball columns somewhere in the batch.
    assert not np.all(first[0] == first[0][:1])
