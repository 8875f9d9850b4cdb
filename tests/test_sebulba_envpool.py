"""The envpool adapter: envpool's 5-tuple in our TimeStep layout, and the Atari protocols.

Expected values come from CartPole's published dynamics (termination at |theta| > 12 degrees or
|x| > 2.4, resets uniform in [-0.05, 0.05]) and from a second, raw envpool environment stepped
with the same seed and actions.
"""

import warnings

import envpool
import numpy as np
import pytest

from podracer.types import StepType
from sebulba import envpool_env
from sebulba.envpool_env import EnvpoolEnv

THETA_LIMIT = 12 * 2 * np.pi / 360  # CartPole-v1's termination angle, radians
X_LIMIT = 2.4


def test_cartpole_termination_keeps_final_observation_then_resets():
    env = EnvpoolEnv("CartPole-v1", 4, seed=3)
    ts = env.reset()
    assert (ts.step_type == StepType.FIRST).all()
    steps = np.zeros(4, int)
    checked = 0
    for _ in range(60):
        prev = ts
        ts = env.step(np.ones(4, np.int32))  # always push right: the pole falls within ~10 steps
        for i in range(4):
            if prev.step_type[i] == StepType.LAST:
                # The step after an end is envpool's reset: FIRST, no reward, a fresh state.
                assert ts.step_type[i] == StepType.FIRST
                assert ts.reward[i] == 0.0 and ts.discount[i] == 1.0
                assert np.all(np.abs(ts.observation[i]) <= 0.05)
                assert ts.extras["episode_return"][i] == 0.0
                steps[i] = 0
                continue
            steps[i] += 1
            obs = ts.observation[i]
            out_of_bounds = abs(obs[2]) > THETA_LIMIT or abs(obs[0]) > X_LIMIT
            if out_of_bounds:
                # A true terminal: LAST with discount 0, and the observation is the final one.
                assert ts.step_type[i] == StepType.LAST
                assert ts.discount[i] == 0.0 and ts.reward[i] == 1.0
                assert ts.extras["game_over"][i]
                assert ts.extras["episode_return"][i] == steps[i]
                assert ts.extras["episode_length"][i] == steps[i]
                checked += 1
            else:
                assert ts.step_type[i] == StepType.MID
                assert ts.discount[i] == 1.0 and not ts.extras["game_over"][i]
    env.close()
    assert checked >= 8  # several episodes ended in every environment


def test_cartpole_truncation_is_last_with_discount_one():
    env = EnvpoolEnv("CartPole-v1", 2, seed=0, options={"max_episode_steps": 5})
    ts = env.reset()
    types, discounts = [], []
    for t in range(7):
        ts = env.step(np.full(2, t % 2, np.int32))  # alternate: the pole stays up for 5 steps
        types.append(ts.step_type.copy())
        discounts.append(ts.discount.copy())
        if t == 4:
            assert ts.extras["game_over"].all()
            np.testing.assert_array_equal(ts.extras["episode_return"], [5.0, 5.0])
            assert np.all(np.abs(ts.observation[:, 2]) < THETA_LIMIT)  # not a terminal
    env.close()
    types, discounts = np.array(types), np.array(discounts)
    np.testing.assert_array_equal(types[:, 0], [1, 1, 1, 1, 2, 0, 1])
    np.testing.assert_array_equal(discounts[:, 0], [1, 1, 1, 1, 1, 1, 1])


def test_protocols_are_explicit_and_recorded():
    impala = envpool_env.make_options("Pong-v5", "impala")
    machado = envpool_env.make_options("Pong-v5", "machado")
    assert impala["episodic_life"] and impala["reward_clip"] and impala["noop_max"] == 30
    assert impala["repeat_action_probability"] == 0.0 and not impala["full_action_space"]
    assert not machado["episodic_life"] and machado["repeat_action_probability"] == 0.25
    assert machado["full_action_space"] and machado["reward_clip"]
    for options in (impala, machado):
        assert options["frame_skip"] == 4 and options["stack_num"] == 4
        assert (options["img_height"], options["img_width"]) == (84, 84) and options["gray_scale"]
    # Pong's minimal action set has 6 actions; the full ALE set has 18.
    assert envpool_env.env_spec("Pong-v5", impala).action.num_values == 6
    assert envpool_env.env_spec("Pong-v5", machado).action.num_values == 18
    assert envpool_env.env_spec("Pong-v5", impala).observation.shape == (84, 84, 4)
    record = envpool_env.run_description("Pong-v5", "machado", machado)
    assert record["envpool_version"] == envpool.__version__ == "1.2.5"
    assert record["protocol"] == "machado" and record["envpool_options"] == machado
    overridden = envpool_env.make_options("Pong-v5", "impala", {"noop_max": 1})
    assert overridden["noop_max"] == 1 and overridden["episodic_life"]
    with pytest.raises(ValueError, match="needs a protocol"):
        envpool_env.make_options("Pong-v5", "none")
    with pytest.raises(ValueError, match="Atari tasks only"):
        envpool_env.make_options("CartPole-v1", "impala")


def test_agent_layout_is_channels_last():
    x = np.arange(2 * 4 * 3 * 5).reshape(2, 4, 3, 5)
    y = envpool_env.to_agent_layout(x)
    assert y.shape == (2, 3, 5, 4)
    assert y[1, 2, 3, 0] == x[1, 0, 2, 3] and y[0, 1, 4, 3] == x[0, 3, 1, 4]
    assert envpool_env.to_agent_layout(np.zeros((2, 4))).shape == (2, 4)


def test_atari_returns_are_unclipped_game_scores_across_life_losses():
    # SpaceInvaders scores 5..30 per alien; the IMPALA protocol clips training rewards to their
    # sign and ends the training episode (discount 0) at every life loss, not the game.
    n, seed = 2, 7
    options = envpool_env.make_options("SpaceInvaders-v5", "impala", {"max_episode_steps": 3000})
    env = EnvpoolEnv("SpaceInvaders-v5", n, seed=seed, options=options)
    # The reference: the same game without reward clipping (clipping does not change dynamics).
    reference = envpool.make("SpaceInvaders-v5", env_type="gymnasium", num_envs=n, seed=seed,
                             **{**options, "reward_clip": False})
    env.reset()
    reference.reset()
    rng = np.random.default_rng(0)
    score = np.zeros(n)
    prev_last = np.zeros(n, bool)
    life_losses = games = big_rewards = 0
    for _ in range(4000):
        action = rng.integers(0, 6, n).astype(np.int32)
        ts = env.step(action)
        _, raw_reward, terminated, truncated, info = reference.step(action)
        for i in range(n):
            if prev_last[i]:
                assert ts.step_type[i] == StepType.FIRST and ts.reward[i] == 0.0
                # A new game starts from 0; after a life loss the game's score carries on.
                assert ts.extras["episode_return"][i] == score[i]
                continue
            assert ts.reward[i] == np.sign(raw_reward[i])
            big_rewards += raw_reward[i] > 1
            score[i] += raw_reward[i]
            assert ts.extras["episode_return"][i] == score[i]
            if ts.step_type[i] == StepType.LAST:
                assert ts.discount[i] == (0.0 if terminated[i] else 1.0)
                if info["terminated"][i] or truncated[i]:
                    assert ts.extras["game_over"][i]
                    games += 1
                    score[i] = 0.0
                else:
                    assert not ts.extras["game_over"][i] and ts.discount[i] == 0.0
                    life_losses += 1
        prev_last = ts.step_type == StepType.LAST
        if games >= 2 and life_losses >= 2:
            break
    env.close()
    reference.close()
    assert games >= 2 and life_losses >= 2 and big_rewards > 0


@pytest.mark.parametrize("protocol, channels", [("atari100k", 3), ("atari100k_grey", 1)])
def test_atari100k_protocol_reaches_envpool(protocol, channels):
    # EfficientZero's preprocessing: 96x96 frames (RGB, or grey), 4 stacked, frame skip 4, up to
    # 30 no-ops, life loss ends the training episode, clipped rewards, no sticky actions, the
    # minimal action set, no FIRE on reset, 108K-frame (27K-step) games.
    options = envpool_env.make_options("Breakout-v5", protocol)
    env = EnvpoolEnv("Breakout-v5", 2, seed=0, options=options)
    ts = env.reset()
    # envpool stacks channel-first: 4 frames x `channels` colours; agents see [H, W, C].
    assert ts.observation.shape == (2, 4 * channels, 96, 96)
    assert ts.observation.dtype == np.uint8
    assert envpool_env.env_spec("Breakout-v5", options).observation.shape == (96, 96, 4 * channels)
    assert envpool_env.env_spec("Breakout-v5", options).action.num_values == 4  # minimal set
    made = env._env.config  # what envpool itself was configured with
    expected = {"img_height": 96, "img_width": 96, "gray_scale": channels == 1, "stack_num": 4,
                "frame_skip": 4, "noop_max": 30, "episodic_life": True, "reward_clip": True,
                "repeat_action_probability": 0.0, "full_action_space": False,
                "use_fire_reset": False, "max_episode_steps": 27_000}
    assert {k: made[k] for k in expected} == expected
    if channels == 3:
        # RGB: Breakout's coloured screen differs between the channels of one frame.
        first = ts.observation[0, :3].reshape(3, -1).mean(axis=1)
        assert len(set(np.round(first, 3))) == 3
    env.close()
    record = envpool_env.run_description("Breakout-v5", protocol, options)
    assert record["protocol"] == protocol and record["envpool_options"] == expected


def test_episodic_life_changes_the_game_after_a_life_loss():
    # Why a whole-game evaluation (EfficientZero's) needs an environment without episodic life,
    # not only `game_over`: with it, envpool's reset after a life loss (whose action it ignores)
    # moves the game on, so the same game-step actions from the same seed play another game.
    options = dict(envpool_env.make_options("Breakout-v5", "atari100k_grey"), img_height=42,
                   img_width=42)
    frames = {}
    for episodic in (True, False):
        env = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=1, seed=5,
                           **{**options, "episodic_life": episodic})
        env.reset()
        rng = np.random.default_rng(0)
        seen, lives, reset_next = [], [], False
        while len(seen) < 120:
            if reset_next:  # envpool's reset step: not a game step, its action is ignored
                env.step(np.zeros(1, np.int32))
                reset_next = False
                continue
            obs, _, terminated, _, info = env.step(rng.integers(0, 4, 1).astype(np.int32))
            seen.append(obs[0, -1].copy())
            lives.append(int(info["lives"][0]))
            reset_next = bool(terminated[0])
        env.close()
        frames[episodic] = (seen, lives)
    (a, lives_a), (b, lives_b) = frames[True], frames[False]
    first_loss = lives_b.index(lives_b[0] - 1)  # the game step that lost the first life
    assert lives_a[:first_loss + 1] == lives_b[:first_loss + 1]
    assert all((x == y).all() for x, y in zip(a[:first_loss + 1], b[:first_loss + 1]))
    assert any((x != y).any() for x, y in zip(a[first_loss + 1:], b[first_loss + 1:]))


def test_starting_an_envpool_environment_prints_no_box_precision_warning():
    # envpool's CartPole spaces have float64 bounds on float32 Boxes: gymnasium warns that it
    # lowered their precision, at every Sebulba start, unless silenced.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envpool_env.env_spec("CartPole-v1")
        env = EnvpoolEnv("CartPole-v1", 2, seed=0)
        env.spec()
        env.reset()
        env.close()
        warnings.warn("a warning of the caller's own", UserWarning)  # still shown
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "precision lowered" in m], messages
    assert "a warning of the caller's own" in messages


def test_mujoco_float64_observations_arrive_as_float32_as_the_spec_says():
    # envpool's MuJoCo tasks observe in float64; agents compute in float32 and build their
    # parameters from the spec, which asked JAX for float64 zeros (a warning at every start).
    spec = envpool_env.env_spec("InvertedPendulum-v4")
    assert spec.observation.dtype == np.float32
    env = EnvpoolEnv("InvertedPendulum-v4", 2, seed=0)
    first = env.reset()
    step = env.step(np.zeros((2, 1), np.float32))
    env.close()
    assert first.observation.dtype == step.observation.dtype == np.float32
    assert first.observation.shape == (2,) + spec.observation.shape
