"""Sebulba on any host environment (`sebulba.host_env`): `gymnasium:<id>` and `envs_jax:<name>`
tasks beside envpool's, in the one `TimeStep` layout of `sebulba.envpool_env`'s table.

Expected values come from stepping the environments directly: gymnasium's single environments
(`gymnasium.make`, seeded as the batch seeds them) with the layout's rule applied by hand (an
end is LAST with the final observation, discount 0 on termination and 1 on truncation; the next
step is FIRST, reward 0, discount 1, from the environment's own reset, its action unused), and
`envs_jax.wrap_for_training` vmapped and jitted by hand. The learning thresholds come from the
environments: `Cue` (defined here) pays 1 per step for naming the cue it shows, so a uniform
policy scores CUE_STEPS / 2 and a perfect one CUE_STEPS; Catch scores -1 or +1 per game, a
uniform policy about -0.6.
"""

import itertools
import os
import sys
import time

import gymnasium
import jax
import numpy as np
import pytest

import envs_jax
import sebulba
from experiments.configs import sebulba_vtrace_cartpole
from podracer import metrics as metrics_lib
from podracer.config import ConfigError
from podracer.types import StepType
from sebulba import envs_jax_env, gymnasium_env, host_env
from sebulba.envpool_env import EnvpoolEnv
from sebulba.gymnasium_env import GymnasiumEnv

CUE_STEPS = 5


class Cue(gymnasium.Env):
    """Each step shows one of two cues (one-hot); naming it (action = cue) pays 1, the other
    action 0. An episode ends (terminated) after CUE_STEPS steps."""

    observation_space = gymnasium.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def _observe(self):
        self._cue = int(self.np_random.integers(2))
        return np.eye(2, dtype=np.float32)[self._cue]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == self._cue)
        self._t += 1
        return self._observe(), reward, self._t >= CUE_STEPS, False, {}


gymnasium.register("PodracerCue-v0", entry_point=Cue)


class Broken(Cue):
    """Cue whose third step raises."""

    def step(self, action):
        if self._t == 2:
            raise ValueError("boom at the third step")
        return super().step(action)


gymnasium.register("PodracerBroken-v0", entry_point=Broken)


class Cue64(Cue):
    """Cue with float64 observations, gymnasium's default dtype for a Box."""

    observation_space = gymnasium.spaces.Box(0.0, 1.0, (2,), np.float64)

    def _observe(self):
        return super()._observe().astype(np.float64)


gymnasium.register("PodracerCue64-v0", entry_point=Cue64)


class Marked(Cue):
    """Cue that leaves a file in `directory` at every step, named by process, env and step."""

    def __init__(self, directory):
        self._directory = directory

    def step(self, action):
        name = f"stepped-{os.getpid()}-{id(self)}-{self._t}"
        open(os.path.join(self._directory, name), "w").close()
        return super().step(action)


gymnasium.register("PodracerMarked-v0", entry_point=Marked)


# ---------------------------------------------------------------------------------------------
# The layout, checked against stepping the environments directly


def _reference_gymnasium(gym_id, num_envs, seed, actions, **kwargs):
    """[T+1] of (step type, reward, discount, observation, episode return, game over) per
    environment, from single gymnasium environments with the layout's rule applied by hand."""
    envs = [gymnasium.make(gym_id, **kwargs) for _ in range(num_envs)]
    seeds = gymnasium_env.seeds(seed, num_envs)
    obs = [env.reset(seed=s)[0] for env, s in zip(envs, seeds)]
    out = [[(StepType.FIRST, 0.0, 1.0, o, 0.0, False)] for o in obs]
    returns = [0.0] * num_envs
    for action in actions:
        for i, env in enumerate(envs):
            if out[i][-1][0] == StepType.LAST:  # the reset step: its action unused
                returns[i] = 0.0
                out[i].append((StepType.FIRST, 0.0, 1.0, env.reset()[0], 0.0, False))
                continue
            o, r, term, trunc, _ = env.step(int(action[i]))
            returns[i] += r
            end = term or trunc
            out[i].append((StepType.LAST if end else StepType.MID, r, 0.0 if term else 1.0, o,
                           returns[i], end))
    return out


def _compare(timesteps, reference):
    kinds = set()
    for t, ts in enumerate(timesteps):
        for i, (step_type, reward, discount, obs, ret, over) in enumerate(
                r[t] for r in reference):
            assert ts.step_type[i] == step_type, (t, i)
            assert ts.reward[i] == np.float32(reward) and ts.discount[i] == discount, (t, i)
            np.testing.assert_array_equal(ts.observation[i], obs)
            assert ts.extras["episode_return"][i] == np.float32(ret), (t, i)
            assert ts.extras["game_over"][i] == over, (t, i)
            if step_type == StepType.LAST:
                kinds.add("terminated" if discount == 0.0 else "truncated")
    return kinds


def _actions(num_steps, num_envs):
    """Env 0 always pushes right (its pole falls: terminations); env 1 alternates (its pole
    stays up: truncations at the limit); the others play a fixed random sequence."""
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, (num_steps, num_envs)).astype(np.int32)
    actions[:, 0] = 1
    actions[:, 1] = np.arange(num_steps) % 2
    return actions


@pytest.mark.parametrize("num_workers", [0, 3])  # 3: shares of 2, 1 and 1
@pytest.mark.parametrize("mode", host_env.AUTORESET_MODES)
def test_gymnasium_cartpole_matches_stepping_it_directly(mode, num_workers):
    num_envs, actions = 4, _actions(40, 4)
    env = GymnasiumEnv("CartPole-v1", num_envs, seed=5, num_workers=num_workers,
                       autoreset_mode=mode, kwargs={"max_episode_steps": 12})
    try:
        timesteps = [env.reset()] + [env.step(a) for a in actions]
    finally:
        env.close()
    reference = _reference_gymnasium("CartPole-v1", num_envs, 5, actions, max_episode_steps=12)
    assert _compare(timesteps, reference) == {"terminated", "truncated"}
    # The final observation is kept: a terminated pole is past CartPole's limits on its LAST.
    last = np.array([t.step_type[0] == StepType.LAST for t in timesteps])
    final = np.array([t.observation[0] for t in timesteps])[last]
    assert np.all((np.abs(final[:, 2]) > 12 * 2 * np.pi / 360) | (np.abs(final[:, 0]) > 2.4))


def test_a_failing_environment_in_a_worker_process_raises_its_error_here():
    env = GymnasiumEnv("PodracerBroken-v0", 2, seed=0, num_workers=1)
    try:
        env.reset()
        env.step(np.zeros(2, np.int32))
        env.step(np.zeros(2, np.int32))
        with pytest.raises(RuntimeError, match="boom at the third step"):
            env.step(np.zeros(2, np.int32))
    finally:
        env.close()


def test_a_full_reset_starts_every_environment_afresh_in_every_mode():
    for mode in host_env.AUTORESET_MODES:
        env = GymnasiumEnv("PodracerCue-v0", 2, seed=1, autoreset_mode=mode)
        try:
            env.reset()
            for _ in range(CUE_STEPS + 2):  # past an end and its reset step
                env.step(np.zeros(2, np.int32))
            first = env.reset()
            second = env.step(np.zeros(2, np.int32))  # a MID step, not a held reset
        finally:
            env.close()
        assert (first.step_type == StepType.FIRST).all(), mode
        assert (second.step_type == StepType.MID).all(), mode
        assert (second.extras["episode_length"] == 1).all(), mode


def test_envs_jax_matches_stepping_it_directly():
    num_envs, seed = 4, 3
    actions = _actions(40, num_envs)
    env = envs_jax_env.EnvsJaxEnv("CartPole-v1", num_envs, seed=seed,
                                  kwargs={"max_episode_steps": 12})
    timesteps = [env.reset()] + [env.step(a) for a in actions]
    direct = envs_jax.wrap_for_training(envs_jax.make("CartPole-v1", max_episode_steps=12))
    keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), 0), num_envs)
    state, ts = jax.jit(jax.vmap(direct.reset))(keys)
    expected = [ts]
    step = jax.jit(jax.vmap(direct.step))  # the same compiled step: the same bits
    for a in actions:
        state, ts = step(state, a)
        expected.append(ts)
    kinds = set()
    for got, want in zip(timesteps, expected):
        np.testing.assert_array_equal(got.step_type, want.step_type)
        np.testing.assert_array_equal(got.reward, want.reward)
        np.testing.assert_array_equal(got.discount, want.discount)
        np.testing.assert_allclose(got.observation, want.observation, rtol=0, atol=0)
        np.testing.assert_array_equal(got.extras["episode_return"], want.extras["episode_return"])
        np.testing.assert_array_equal(got.extras["game_over"], want.step_type == StepType.LAST)
        last = got.step_type == StepType.LAST
        kinds |= {"terminated" if d == 0 else "truncated" for d in got.discount[last]}
    assert kinds == {"terminated", "truncated"}
    # The step after a LAST is FIRST: reward 0, discount 1, statistics restarted.
    for prev, ts in itertools.pairwise(timesteps):
        after = prev.step_type == StepType.LAST
        assert (ts.step_type[after] == StepType.FIRST).all()
        assert (ts.reward[after] == 0).all() and (ts.discount[after] == 1).all()
        assert (ts.extras["episode_return"][after] == 0).all()


def _layout_invariants(env, steps=60, max_episode_steps=None):
    """What every kind promises: FIRST after LAST (and only there), reward 0 and discount 1 on
    FIRST, discount 0 only on LAST, statistics that count the episode's steps; with
    `max_episode_steps`, episodes end by then and some do end within the steps taken."""
    ts = env.reset()
    ended = 0
    for t in range(steps):
        prev, ts = ts, env.step(np.full(env.num_envs, t % 3 == 0, np.int32))
        assert np.array_equal(ts.step_type == StepType.FIRST, prev.step_type == StepType.LAST)
        first = ts.step_type == StepType.FIRST
        assert (ts.reward[first] == 0).all() and (ts.discount[first] == 1).all()
        assert (ts.discount[ts.step_type != StepType.LAST] == 1).all()
        expected_length = np.where(first, 0, prev.extras["episode_length"] + 1)
        assert np.array_equal(ts.extras["episode_length"], expected_length)
        assert np.array_equal(ts.extras["game_over"], ts.step_type == StepType.LAST)
        for x in (ts.step_type, ts.reward, ts.discount, ts.observation):
            assert isinstance(x, np.ndarray)
        ended += int(np.sum(ts.step_type == StepType.LAST))
        if max_episode_steps is not None:
            assert ts.extras["episode_length"].max() <= max_episode_steps
    env.close()
    assert ended > 0  # the invariants about episode ends were exercised


@pytest.mark.parametrize("kind", host_env.KINDS)
def test_every_kind_gives_the_same_layout_on_cartpole(kind):
    name = {"envpool": "CartPole-v1", "gymnasium": "CartPole-v1", "envs_jax": "CartPole-v1"}
    options = {"max_episode_steps": 10}
    env = host_env.make(kind, name[kind], 6, seed=0, options=options,
                        stepping=host_env.Stepping(num_threads=1))
    assert env.spec().observation.shape == (4,) and env.spec().action.num_values == 2
    _layout_invariants(env, max_episode_steps=10)


@pytest.mark.parametrize("kind, num_workers", [(kind, 0) for kind in host_env.KINDS]
                         + [("gymnasium", 2)])
def test_every_kinds_step_splits_into_send_and_recv_with_the_same_timesteps(kind, num_workers):
    # Two batches of one seed: one stepped whole, the other split in two with a third batch's
    # step in flight in between (as an actor with two batches runs them).
    def make(seed):
        return host_env.make(kind, "CartPole-v1", 3, seed=seed,
                             options={"max_episode_steps": 10},
                             stepping=host_env.Stepping(num_threads=1, num_workers=num_workers))

    whole, split, other = make(5), make(5), make(6)
    (send, recv), (send_other, recv_other) = (host_env.split_step(split),
                                              host_env.split_step(other))
    whole.reset(), split.reset(), other.reset()
    send_other(np.zeros(3, np.int32))
    for t in range(25):
        action = np.array([t % 2, 1, t % 3 == 0], np.int32)
        expected = whole.step(action)
        send(action)
        recv_other()
        send_other(np.ones(3, np.int32))
        got = recv()
        for field in ("step_type", "reward", "discount", "observation"):
            np.testing.assert_array_equal(getattr(got, field), getattr(expected, field))
    recv_other()
    # A second send, or a recv with nothing sent, is refused (envpool's recv would wait).
    with pytest.raises(RuntimeError, match="without a send"):
        recv()
    send(np.zeros(3, np.int32))
    with pytest.raises(RuntimeError, match="twice"):
        send(np.zeros(3, np.int32))
    recv()
    for env in (whole, split, other):
        env.close()


def test_gymnasium_workers_step_between_send_and_recv(tmp_path):
    # With worker processes the batch steps as soon as it is sent, before anyone receives it:
    # the two environments' marks appear while `recv` has not been called.
    env = GymnasiumEnv("PodracerMarked-v0", 2, seed=0, num_workers=2,
                       kwargs={"directory": str(tmp_path)})
    send, recv = host_env.split_step(env)
    try:
        env.reset()
        send(np.zeros(2, np.int32))
        deadline = time.monotonic() + 60
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(list(tmp_path.iterdir())) == 2
        assert (recv().step_type == StepType.MID).all()
        with pytest.raises(RuntimeError, match="without a send"):
            env.recv()
    finally:
        env.close()


def test_a_batch_without_send_and_recv_steps_in_recv_and_refuses_misuse():
    stepped = []

    class Stepped:
        num_envs = 1

        def step(self, action):
            stepped.append(action)
            return f"timestep {action}"

    send, recv = host_env.split_step(Stepped())
    send(4)
    assert stepped == []
    assert recv() == "timestep 4" and stepped == [4]
    with pytest.raises(RuntimeError, match="without a send"):
        recv()
    send(5)
    with pytest.raises(RuntimeError, match="twice"):
        send(6)


def test_envpool_is_made_as_before():
    env = host_env.make("envpool", "CartPole-v1", 4, seed=7, options={},
                        stepping=host_env.Stepping(num_threads=1))
    reference = EnvpoolEnv("CartPole-v1", 4, seed=7, num_threads=1)
    try:
        a, b = env.reset(), reference.reset()
        for t in range(30):
            np.testing.assert_array_equal(a.observation, b.observation)
            np.testing.assert_array_equal(a.step_type, b.step_type)
            a = env.step(np.full(4, t % 2, np.int32))
            b = reference.step(np.full(4, t % 2, np.int32))
    finally:
        env.close()
        reference.close()
    assert host_env.agent_layout("envpool") is sebulba.envpool_env.to_agent_layout
    x = np.zeros((2, 4, 3, 5))
    assert host_env.agent_layout("gymnasium")(x) is x and host_env.agent_layout("envs_jax")(x) is x


# ---------------------------------------------------------------------------------------------
# Config validation: the field and the fix, before anything compiles


def _config(task, **env_fields):
    config = sebulba_vtrace_cartpole.get_config()
    config.env.task = task
    for field, value in env_fields.items():
        config.env[field] = value
    return config


@pytest.mark.parametrize("task,field,fix", [
    ("gymnasium:CartPol-v1", "env.task", "gymnasium:CartPole-v1"),
    ("envs_jax:cach", "env.task", "envs_jax:catch"),
    ("CartPol-v1", "env.task", "gymnasium:<id>"),
])
def test_a_bad_task_is_named_with_the_fix(task, field, fix):
    with pytest.raises(ConfigError) as info:
        sebulba.validate(_config(task), num_local_devices=1, num_processes=1)
    assert info.value.field == field and fix in str(info.value)


def test_bad_gymnasium_and_envs_jax_fields_are_named():
    cases = [
        (_config("gymnasium:CartPole-v1", num_workers=-1), "env.num_workers"),
        (_config("gymnasium:CartPole-v1", autoreset_mode="sometimes"), "env.autoreset_mode"),
        (_config("gymnasium:CartPole-v1", protocol="impala"), "env.protocol"),
        (_config("envs_jax:catch", protocol="impala"), "env.protocol"),
        (_config("gymnasium:CartPole-v1", kwargs={"no_such_option": 1}), "env.kwargs"),
        (_config("envs_jax:catch", kwargs={"rows": "many"}), "env.kwargs"),
        (_config("envs_jax:catch", eval_kwargs={"rows": 3}), "env.eval_kwargs"),
    ]
    for config, field in cases:
        with pytest.raises(ConfigError) as info:
            sebulba.validate(config, num_local_devices=1, num_processes=1)
        assert info.value.field == field, (field, str(info.value))


def test_validation_records_the_kind_and_its_stepping():
    config = _config("gymnasium:PodracerCue-v0", num_workers=4, autoreset_mode="same_step")
    env = sebulba.validate(config, num_local_devices=1, num_processes=1).environment
    assert (env.kind, env.name) == ("gymnasium", "PodracerCue-v0")
    assert env.stepping.num_workers == 4 and env.stepping.autoreset_mode == "same_step"
    assert env.spec.observation.shape == (2,) and env.spec.action.num_values == 2
    env = sebulba.validate(_config("envs_jax:catch"), num_local_devices=1,
                           num_processes=1).environment
    assert (env.kind, env.name) == ("envs_jax", "catch")
    assert env.spec == envs_jax.wrap_for_training(envs_jax.make("catch")).spec()


def test_continuous_actions_and_float64_observations():
    """PPO's continuous tasks validate from either kind (bounds of several entries compared
    as arrays); float64 observations arrive as float32, as the spec says."""
    from experiments.configs import sebulba_ppo_pendulum

    for task in ("gymnasium:Pendulum-v1", "envs_jax:Pendulum-v1"):
        config = sebulba_ppo_pendulum.get_config()
        config.env.task = task
        spec = sebulba.validate(config, num_local_devices=1, num_processes=1).environment.spec
        assert spec.action.shape == (1,) and spec.observation.shape == (3,)
    env = GymnasiumEnv("PodracerCue64-v0", 2, seed=0)
    try:
        assert env.spec().observation.dtype == np.float32
        assert env.reset().observation.dtype == np.float32
        assert env.step(np.zeros(2, np.int32)).observation.dtype == np.float32
    finally:
        env.close()


def test_without_gymnasium_a_gymnasium_task_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)  # `import gymnasium` now fails
    monkeypatch.delitem(sys.modules, "sebulba.gymnasium_env")
    monkeypatch.delattr(sebulba, "gymnasium_env")
    with pytest.raises(ModuleNotFoundError, match="pip install gymnasium"):
        host_env.gymnasium_module()
    with pytest.raises(ConfigError) as info:
        sebulba.validate(_config("gymnasium:CartPole-v1"), num_local_devices=1, num_processes=1)
    assert info.value.field == "env.task" and "pip install gymnasium" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Learning, evaluation and checkpoints under Sebulba


def _run_config(task, **overrides):
    config = sebulba_vtrace_cartpole.get_config()
    config.env.task = task
    config.actor_device_ids = (0,)
    config.learner_device_ids = (1,)
    config.checkpoint_every_updates = 0
    config.eval_every_updates = 0
    config.timeout_s = 120.0
    for field, value in overrides.items():
        config[field] = value
    return config


def test_vtrace_learns_a_gymnasium_environment_defined_here():
    """Cue: uniform play scores CUE_STEPS / 2 = 2.5 a game, perfect play 5; the late games
    score >= 4.5 (the first records are near 2.5)."""
    config = _run_config("gymnasium:PodracerCue-v0", envs_per_actor_thread=16,
                         rollout_length=10, total_env_steps=16 * 10 * 150,
                         log_every_updates=10)
    config.agent.learning_rate = 3e-3
    config.agent.hidden_sizes = (32,)
    result = sebulba.train(config)
    returns = [r["episode_return"] for r in result.history if r["episodes"]]
    assert returns[0] < 3.5, returns
    assert np.mean(returns[-3:]) >= 4.5, returns
    assert result.run_info["environment"]["kind"] == "gymnasium"
    assert result.run_info["environment"]["gymnasium_version"] == gymnasium.__version__


def test_vtrace_learns_envs_jax_catch():
    """Catch: -1 or +1 a game, uniform play about -0.6; after 100K steps the last record's
    games score >= 0.8 (seed 0 reaches 0.89 at 80K and 0.98 at 100K)."""
    config = _run_config("envs_jax:catch", envs_per_actor_thread=32, rollout_length=16,
                         total_env_steps=100_000, log_every_updates=20)
    config.agent.learning_rate = 3e-3
    result = sebulba.train(config)
    returns = [r["episode_return"] for r in result.history if r["episodes"]]
    assert returns[0] < 0.0, returns
    assert returns[-1] >= 0.8, returns
    assert result.run_info["environment"] == envs_jax_env.run_description("catch", {})
    # V-trace's default MLP for Catch's 10 x 5 board, by hand: 50*64+64 + 64*64+64 (torso),
    # 64*3+3 (policy), 64+1 (value).
    assert result.run_info["parameters"] == 7_684


def test_an_adapted_envs_jax_environment_records_its_librarys_version(monkeypatch):
    # bsuite stands in for an adapted library: the test extra pins it at 0.3.6 (pyproject).
    monkeypatch.setitem(envs_jax.registry._NAMESPACES, "stand_in", envs_jax.registry._Namespace(
        library="bsuite", adapter="unused", extra="test"))
    record = envs_jax_env.run_description("stand_in:anything", {})
    assert (record["library"], record["library_version"]) == ("bsuite", "0.3.6")
    assert "library" not in envs_jax_env.run_description("catch", {})


def test_gymnasium_workers_evaluate_checkpoint_and_resume(tmp_path):
    """Cue in 2 worker processes (the evaluation batch of 3 split 2 + 1): greedy evaluation
    every 2 updates, a checkpoint at the end of 4 updates, and a second run on the same workdir
    that resumes there and goes to 6."""
    config = _run_config("gymnasium:PodracerCue-v0", envs_per_actor_thread=8,
                         rollout_length=5, total_env_steps=8 * 5 * 4, log_every_updates=1,
                         eval_every_updates=2, eval_episodes=3, eval_max_steps=20)
    config.env.num_workers = 2
    config.env.autoreset_mode = "same_step"
    first = sebulba.train(config, str(tmp_path))
    assert first.final_metrics["updates"] == 4
    evaluations = [r for r in first.history if "eval_return" in r]
    assert [r["updates"] for r in evaluations] == [2, 4]
    # Greedy play of whole games: every evaluation episode ended, 5 steps each.
    assert all(r["eval_finished"] == 1.0 and r["eval_length"] == CUE_STEPS
               for r in evaluations)
    assert all(0 <= r["eval_return"] <= CUE_STEPS for r in evaluations)
    config.total_env_steps = 8 * 5 * 6
    second = sebulba.train(config, str(tmp_path))
    assert second.resumed_from_updates == 4 and second.final_metrics["updates"] == 6
    records = metrics_lib.read_records(str(tmp_path))
    assert [r["updates"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert second.run_info["environment"]["num_workers"] == 2


def test_the_config_accepts_exactly_gymnasiums_autoreset_modes():
    from gymnasium.vector import AutoresetMode

    from sebulba import gymnasium_env

    assert set(host_env.AUTORESET_MODES) == set(gymnasium_env.MODES)
    assert set(gymnasium_env.MODES.values()) == set(AutoresetMode)
