"""`experiments.probe_latent`'s read-out and per-row means, and the player's cell it reads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from experiments import probe_latent
from experiments.probing import freeway_row, newest_frame, player_cell, saved_env


def test_a_latent_that_codes_the_label_is_read_out_and_noise_is_not():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=4000)
    # Each label's one-hot code mixed into 16 dimensions, plus a little noise: linear.
    mix = rng.normal(size=(4, 16))
    coded = np.eye(4)[labels] @ mix + 0.01 * rng.normal(size=(4000, 16))
    accuracy, majority = probe_latent.linear_readout(coded, labels, 4)
    assert accuracy == 1.0
    held_out = labels[3000:]
    assert majority == np.bincount(held_out).max() / 1000
    # A latent drawn independently of the labels reads out no better than chance (1/4 here,
    # the labels being uniform), within sampling error over 1000 held-out rows.
    noise = rng.normal(size=(4000, 16))
    accuracy, _ = probe_latent.linear_readout(noise, labels, 4)
    assert abs(accuracy - 0.25) < 0.06


def test_mean_by_label_averages_each_label_and_marks_an_absent_one():
    values = np.array([1.0, 3.0, 10.0, 0.5])
    labels = np.array([0, 0, 2, 3])
    np.testing.assert_allclose(probe_latent.mean_by_label(values, labels, 5),
                               [2.0, np.nan, 10.0, 0.5, np.nan])


def test_freeway_row_reads_the_chicken_at_the_start_and_as_it_moves_up():
    pytest.importorskip("gymnax")  # an extra: pip install -e ".[gymnax]"
    env = envs_jax.make("gymnax:Freeway-MinAtar")
    state, timestep = env.reset(jax.random.PRNGKey(0))
    # MinAtar Freeway starts the chicken on the bottom row (9 of 0..9) with its move timer at
    # 3, counted down by one at the end of every step: "up" moves it only when the timer is 0,
    # on the fourth step, and then every third step (a move sets it to 3, and the same step's
    # count-down leaves 2).
    rows = [int(freeway_row(timestep.observation))]
    up = 1  # gymnax's minimal action set for Freeway: no-op, up, down
    for _ in range(8):
        state, timestep = env.step(state, up)
        rows.append(int(freeway_row(timestep.observation)))
    assert rows == [9, 9, 9, 9, 8, 8, 8, 7, 7]


def test_player_cell_finds_channel_zeros_cell_on_a_batch_of_boards():
    boards = np.zeros((2, 3, 10, 10, 4), np.float32)
    boards[0, 0, 3, 7, 0] = 1  # row 3, column 7
    boards[0, 1, 9, 0, 0] = 1
    boards[0, 2, 0, 9, 0] = 1
    boards[1, 0, 5, 5, 0] = 1
    boards[1, 0, 1, 1, 1:] = 1  # other channels are not the player
    boards[1, 1, 9, 9, 0] = 1
    rows, columns = player_cell(jnp.asarray(boards))
    np.testing.assert_array_equal(rows, [[3, 9, 0], [5, 9, 0]])
    np.testing.assert_array_equal(columns, [[7, 0, 9], [5, 9, 0]])  # [1, 2]: no player


def test_saved_env_stacks_as_the_run_did_and_newest_frame_is_the_last_channels():
    plain, depth = saved_env({"env": {"name": "catch"}})  # a run from before frame_stack
    assert depth == 1 and plain.observation_spec().shape == (10, 5)
    stacked, depth = saved_env({"env": {"name": "catch", "frame_stack": 3}})
    assert depth == 3 and stacked.observation_spec().shape == (10, 15)
    _, timestep = stacked.step(*stacked.reset(jax.random.PRNGKey(0))[:1], jnp.int32(0))
    np.testing.assert_array_equal(newest_frame(timestep.observation, 3),
                                  timestep.observation[:, 10:])
    boards = np.arange(2 * 10 * 10 * 12).reshape(2, 10, 10, 12)  # 3 boards of 4 channels
    np.testing.assert_array_equal(newest_frame(boards, 3), boards[..., 8:])
    np.testing.assert_array_equal(newest_frame(boards, 1), boards)


@pytest.mark.parametrize("game", ["Asterix", "Seaquest"])
def test_player_cell_agrees_with_gymnaxs_state(game):
    pytest.importorskip("gymnax")
    env = envs_jax.make(f"gymnax:{game}-MinAtar")
    state, timestep = env.reset(jax.random.PRNGKey(0))
    key = jax.random.PRNGKey(1)
    for _ in range(12):
        inner = state.env_state  # gymnax's own state under the adapter's
        x, y = (inner.player_x, inner.player_y) if game == "Asterix" else (inner.sub_x,
                                                                            inner.sub_y)
        row, column = player_cell(timestep.observation)
        assert (int(row), int(column)) == (int(y), int(x))
        key, sub = jax.random.split(key)
        action = jax.random.randint(sub, (), 0, env.action_spec().num_values)
        state, timestep = env.step(state, action)
