"""Environments beyond one array observation and one scalar reward, through Anakin as a config
runs them: a dict observation is flattened by `wrap_for_training` and trains; per-agent rewards
and per-entry actions are refused by validation, naming the reason, before anything compiles."""

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fail_if_anakin_builds_programs

import anakin
import envs_jax
from envs_jax.wrappers import Wrapper
from experiments.configs import vtrace_catch
from podracer.config import ConfigError
from podracer.types import ArraySpec


class _DictObservation(Wrapper):
    """Catch with its board split into a dict of two entries (the rows above the paddle's,
    and the paddle's row)."""

    def reset(self, key):
        state, timestep = self.env.reset(key)
        return state, self._split(timestep)

    def step(self, state, action):
        state, timestep = self.env.step(state, action)
        return state, self._split(timestep)

    @staticmethod
    def _split(timestep):
        board = timestep.observation
        return timestep.replace(observation={"above": board[:-1], "paddle": board[-1]})

    def observation_spec(self):
        spec = self.env.observation_spec()
        rows, cols = spec.shape
        return {"above": ArraySpec((rows - 1, cols), spec.dtype),
                "paddle": ArraySpec((cols,), spec.dtype)}


class _PerAgentReward(Wrapper):
    """Catch whose reward arrives once per agent of two."""

    def reset(self, key):
        state, timestep = self.env.reset(key)
        return state, timestep.replace(reward=jnp.stack([timestep.reward] * 2))

    def step(self, state, action):
        state, timestep = self.env.step(state, action)
        return state, timestep.replace(reward=jnp.stack([timestep.reward] * 2))

    def reward_spec(self):
        return ArraySpec((2,), np.float32)


class _PerEntryActions(Wrapper):
    """Catch that says it takes one discrete action for each of two entries."""

    def action_spec(self):
        return ArraySpec((2,), np.int32)


envs_jax.register("test_dict_catch", lambda: _DictObservation(envs_jax.make("catch")))
envs_jax.register("test_two_agent_catch", lambda: _PerAgentReward(envs_jax.make("catch")))
envs_jax.register("test_two_action_catch", lambda: _PerEntryActions(envs_jax.make("catch")))


def _config(name):
    config = vtrace_catch.get_config()
    config.env.name = name
    config.num_devices, config.num_envs, config.rollout_length = 1, 64, 20
    config.updates_per_chunk, config.total_env_steps = 50, 320_000
    config.eval_every_updates = config.checkpoint_every_updates = 0
    return config


def test_a_dict_observation_is_flattened_and_learns():
    result = anakin.train(_config("test_dict_catch"))
    # Catch learned from the flattened board as from the board itself (tests/test_anakin.py).
    assert result.final_metrics["episode_return"] >= 0.8, result.history


def test_per_agent_rewards_are_refused_naming_the_reason(monkeypatch):
    fail_if_anakin_builds_programs(monkeypatch)
    with pytest.raises(ConfigError, match="one reward per agent \\(shape \\(2,\\)\\)"):
        anakin.train(_config("test_two_agent_catch"))


def test_per_entry_actions_are_refused_naming_the_reason(monkeypatch):
    fail_if_anakin_builds_programs(monkeypatch)
    with pytest.raises(ConfigError, match="one discrete action per entry \\(shape \\(2,\\)\\)"):
        anakin.train(_config("test_two_action_catch"))
