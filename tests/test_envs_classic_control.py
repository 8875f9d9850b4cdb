"""Parity of `envs_jax.classic_control` with gymnasium, the reference implementation.

For each environment, a jitted, vmapped scan runs our `wrap_for_training(make(name))` for
thousands of steps (automatic resets, gymnasium's time limits) under a partly random policy
chosen so that episodes both terminate and run into the time limit. Then gymnasium's
`gym.make(name)` replays the same episodes: at each of our FIRST timesteps it is reset and our
initial state is written into `env.unwrapped.state`; then it takes our actions. Every step we
compare the physical state and the observation (float32 tolerance: we compute in float32,
gymnasium in float64), the reward, and whether the step terminated or truncated.

"resync" mode writes our state into gymnasium before every step, so every step is compared
from exactly the same state and action. "free" mode lets gymnasium run on from the episode's
initial state with our actions; it is used for MountainCar only, whose dynamics are stable.
The others amplify a float32 rounding difference exponentially when driven open-loop (an
upright pole or a swinging double pendulum is unstable: CartPole's pole angle differs by
1e-4 after about 110 steps), as two float64 runs whose start differs by 1e-7 would. Open loop,
a car that ends within float tolerance of the goal may finish a step apart in the two; such an
episode is counted, checked to end within tolerance of the goal, and skipped (0 or 1 on the
CPUs tried; the test allows 3 in free mode and none in resync mode).
"""

from __future__ import annotations

import functools

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from podracer.types import StepType

# Each environment copy mixes a heuristic with random actions in its own proportion, so that
# episodes end both ways: by termination and by the time limit.
# Per environment copy, the chance of a random action; IDLE: Acrobot's and MountainCar's
# do-nothing action (1) at every step, so that some episodes surely run to the time limit
# (which of the others do is chaotic, and moves with the CPU's float rounding).
IDLE = -1.0
EXPLORATION = (0.0, 0.3, 0.6, 1.0, IDLE)
NUM_ENVS = len(EXPLORATION)
NUM_STEPS = 1500  # per environment copy: 7500 steps per environment and mode


def _policy(name: str, observation: jax.Array, key: jax.Array, epsilon: jax.Array) -> jax.Array:
    """The heuristic, or with probability `epsilon` a uniformly random action (`IDLE`: the
    do-nothing action of Acrobot and MountainCar, CartPole's heuristic)."""
    explore_key, action_key = jax.random.split(key)
    explore = jax.random.uniform(explore_key) < epsilon
    idle = epsilon == IDLE
    if name == "CartPole-v1":
        x, x_dot, theta, theta_dot = observation
        heuristic = (theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0).astype(jnp.int32)
        return jnp.where(explore, jax.random.randint(action_key, (), 0, 2), heuristic)
    if name == "Acrobot-v1":
        # Pump energy: torque in the direction the second link swings.
        heuristic = jnp.where(observation[5] > 0, 2, 0).astype(jnp.int32)
        action = jnp.where(explore, jax.random.randint(action_key, (), 0, 3), heuristic)
        return jnp.where(idle, 1, action)
    if name == "MountainCar-v0":
        heuristic = jnp.where(observation[1] > 0, 2, 0).astype(jnp.int32)
        action = jnp.where(explore, jax.random.randint(action_key, (), 0, 3), heuristic)
        return jnp.where(idle, 1, action)
    if name == "Pendulum-v1":
        # Beyond the +-2 torque bounds, to exercise the clipping.
        return jax.random.uniform(action_key, (1,), jnp.float32, -2.5, 2.5)
    raise ValueError(name)


def _physics(state) -> jax.Array:
    # AutoReset -> EpisodeStatistics -> TimeLimit -> the environment's PhysicsState.
    return state.env_state.env_state.env_state.physics


@functools.cache
def _run_ours(name: str, seed: int):
    env = envs_jax.wrap_for_training(envs_jax.make(name))

    def run(key, epsilon):
        reset_key, key = jax.random.split(key)
        state, timestep = env.reset(reset_key)

        def body(carry, key):
            state, timestep = carry
            action = _policy(name, timestep.observation, key, epsilon)
            state, timestep = env.step(state, action)
            return (state, timestep), (action, timestep, _physics(state))

        first = (timestep, _physics(state))
        _, (actions, timesteps, physics) = jax.lax.scan(
            body, (state, timestep), jax.random.split(key, NUM_STEPS)
        )
        return first, actions, timesteps, physics

    keys = jax.random.split(jax.random.PRNGKey(seed), NUM_ENVS)
    epsilons = jnp.asarray(EXPLORATION, jnp.float32)
    first, *scanned = jax.device_get(jax.jit(jax.vmap(run))(keys, epsilons))
    # vmap put the environment axis first; index the scanned outputs as [t, b].
    return first, *jax.tree.map(lambda x: np.swapaxes(x, 0, 1), scanned)


def _gym_observation(env: gym.Env) -> np.ndarray:
    unwrapped = env.unwrapped
    if hasattr(unwrapped, "_get_ob"):  # Acrobot
        return unwrapped._get_ob()
    if hasattr(unwrapped, "_get_obs"):  # Pendulum
        return unwrapped._get_obs()
    return np.array(unwrapped.state, dtype=np.float32)


def _replay(name: str, mode: str, seed: int = 0) -> dict[str, float]:
    (first_ts, first_physics), actions, timesteps, physics = _run_ours(name, seed)
    ours, theirs, where = [], [], []  # (state, observation, reward) per step, compared at the end
    counts = {"steps": 0, "terminated": 0, "truncated": 0, "straddled": 0}
    # Free mode compares float32 against float64 open-loop, so where our state lands within
    # the tolerance of MountainCar's goal the two may end the episode a step apart; the rest of
    # such an episode cannot be compared and is skipped (counted as "straddled").
    rtol, atol = (1e-5, 1e-5) if mode == "resync" else (1e-4, 1e-4)
    for b in range(NUM_ENVS):
        env = gym.make(name)
        previous, straddled = None, False
        for t in range(-1, NUM_STEPS):
            if t == -1:
                step_type, observation, state = (
                    first_ts.step_type[b],
                    first_ts.observation[b],
                    first_physics[b],
                )
            else:
                step_type = timesteps.step_type[t, b]
                observation, state = timesteps.observation[t, b], physics[t, b]
            here = f"{name} env {b} step {t}"
            if step_type == StepType.FIRST:
                straddled = False
                env.reset(seed=seed + b)
                env.unwrapped.state = np.asarray(state, np.float64)
                ours.append((state, observation, 0.0))
                theirs.append((state, _gym_observation(env), 0.0))
                assert t == -1 or timesteps.reward[t, b] == 0.0, here
            elif straddled:
                continue
            else:
                if mode == "resync":
                    env.unwrapped.state = np.asarray(previous, np.float64)
                action = actions[t, b]
                action = np.asarray(action, np.float32) if name == "Pendulum-v1" else int(action)
                gym_obs, gym_reward, terminated, truncated, _ = env.step(action)
                reward = timesteps.reward[t, b]
                ours.append((state, observation, reward))
                theirs.append((np.asarray(env.unwrapped.state, np.float64), gym_obs, gym_reward))
                if name != "Pendulum-v1":  # discrete rewards: exactly equal
                    assert reward == gym_reward, here
                last = step_type == StepType.LAST
                discount = timesteps.discount[t, b]
                if mode == "free" and last != (terminated or truncated):
                    goal = env.unwrapped.goal_position
                    assert abs(float(state[0]) - goal) <= atol, here
                    counts["straddled"] += 1
                    straddled = True
                    continue
                assert last == (terminated or truncated), here
                # Terminated wins over truncated on the same step (discount 0), as it must.
                assert (last and discount == 0.0) == terminated, here
                assert (last and discount == 1.0) == (truncated and not terminated), here
                if last:
                    length = timesteps.extras["episode_length"][t, b]
                    assert truncated == (length == envs_jax.MAX_EPISODE_STEPS[name]), here
                counts["steps"] += 1
                counts["terminated"] += int(terminated)
                counts["truncated"] += int(truncated and not terminated)
            where.append(here)
            previous = state
    # Float32 against float64: a few float32 ulps per step (free mode: accumulated over an
    # episode). Pendulum's reward is a continuous cost, computed in float32 here.
    for i, what in enumerate(["state", "observation", "reward"]):
        a = np.stack([np.asarray(o[i], np.float64) for o in ours])
        b = np.stack([np.asarray(o[i], np.float64) for o in theirs])
        bad = ~np.isclose(a, b, rtol=rtol, atol=atol)
        if bad.ndim > 1:
            bad = bad.any(axis=tuple(range(1, bad.ndim)))
        if bad.any():
            k = int(np.argmax(bad))
            raise AssertionError(f"{what} differs at {where[k]}: ours {a[k]}, gymnasium {b[k]}")
        counts[f"max_{what}_error"] = float(np.max(np.abs(a - b)))
    return counts


@pytest.mark.parametrize(
    "name, mode",
    [
        ("CartPole-v1", "resync"),
        ("Acrobot-v1", "resync"),
        ("MountainCar-v0", "resync"),
        ("MountainCar-v0", "free"),
        ("Pendulum-v1", "resync"),
    ],
)
def test_matches_gymnasium_step_for_step(name: str, mode: str):
    counts = _replay(name, mode)
    print(name, mode, counts)  # shown with `pytest -s`: the figures docs/benchmarks.md quotes
    assert counts["steps"] > 5000
    # The policies are chosen so that both kinds of episode end occur (Pendulum never
    # terminates: its episodes all end by the time limit).
    if name != "Pendulum-v1":
        assert counts["terminated"] >= 5, counts
    assert counts["truncated"] >= 2, counts
    # An end a step apart at the goal's edge: rare (0 or 1 on the CPUs tried), and never in
    # resync mode. Each one is checked above to lie within the tolerance of the goal.
    assert counts["straddled"] <= (3 if mode == "free" else 0), counts


@pytest.mark.parametrize(
    "name, low, high",
    [
        ("CartPole-v1", [-0.05] * 4, [0.05] * 4),
        ("Acrobot-v1", [-0.1] * 4, [0.1] * 4),
        ("MountainCar-v0", [-0.6, 0.0], [-0.4, 0.0]),
        ("Pendulum-v1", [-np.pi, -1.0], [np.pi, 1.0]),
    ],
)
def test_reset_distribution_matches_gymnasium(name: str, low, high):
    """gymnasium draws initial states uniformly in these bounds (its source, `reset`)."""
    env = envs_jax.make(name)
    states, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), 4000))
    physics = np.asarray(states.env_state.physics)
    low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
    assert np.all(physics >= low) and np.all(physics <= high)
    spread = high - low
    # Uniform: mean at the centre, and the extremes close to the bounds.
    np.testing.assert_allclose(physics.mean(0), (low + high) / 2, atol=0.05 * spread.max())
    np.testing.assert_allclose(physics.min(0), low, atol=0.01 * spread.max())
    np.testing.assert_allclose(physics.max(0), high, atol=0.01 * spread.max())


def test_make_applies_gymnasiums_time_limits():
    for name, limit in envs_jax.MAX_EPISODE_STEPS.items():
        assert gym.spec(name).max_episode_steps == limit
        env = envs_jax.make(name)
        assert isinstance(env, envs_jax.TimeLimit) and env.max_episode_steps == limit
        assert envs_jax.make(name, max_episode_steps=7).max_episode_steps == 7
        assert not isinstance(envs_jax.make(name, max_episode_steps=0), envs_jax.TimeLimit)


def test_specs_match_gymnasium_spaces():
    for name in envs_jax.MAX_EPISODE_STEPS:
        ours, theirs = envs_jax.make(name), gym.make(name)
        obs_spec = ours.observation_spec()
        assert obs_spec.shape == theirs.observation_space.shape
        np.testing.assert_array_equal(obs_spec.minimum, theirs.observation_space.low)
        np.testing.assert_array_equal(obs_spec.maximum, theirs.observation_space.high)
        action_spec = ours.action_spec()
        if isinstance(theirs.action_space, gym.spaces.Discrete):
            assert action_spec.num_values == theirs.action_space.n
        else:
            assert action_spec.shape == theirs.action_space.shape
            np.testing.assert_array_equal(action_spec.minimum, theirs.action_space.low)
            np.testing.assert_array_equal(action_spec.maximum, theirs.action_space.high)
