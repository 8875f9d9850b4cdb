"""Envpool environments in our `TimeStep` layout, and the named Atari protocols.

Sebulba's environments are envpool's C++ batched environments stepped from the host. This module
owns the conversion of envpool's gymnasium 5-tuple into the layout of `podracer.types`:

    envpool step k returns                     we return
    ----------------------------------------   ---------------------------------------------
    terminated                                 LAST, discount 0 (the final observation kept)
    truncated (time limit)                     LAST, discount 1 (bootstrap from the final obs)
    the automatic reset on the step after      FIRST, reward 0, discount 1 (the action that
      a LAST (its action is ignored)             led here is masked by `transition_mask`)
    anything else                              MID

A reset is recognised by "the previous step was LAST", not by envpool's `elapsed_step == 0`:
with episodic life an Atari life loss ends the training episode but the game continues and the
step counter is not reset.

Episode statistics are *game* statistics, unclipped: `extras["episode_return"]` sums the raw
game score (envpool's `info["reward"]` for Atari, which is the score before reward clipping)
across life losses, and `extras["game_over"]` marks the LAST step of a whole game (a true game
over or a time-limit truncation). The training reward in `TimeStep.reward` is what the protocol
asks for (clipped to its sign for Atari training).

Atari protocols are named, explicit sets of envpool options (`ATARI_PROTOCOLS`); the one a run
uses is recorded, with the envpool version, by `run_description`.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import envpool
import numpy as np

from podracer.types import ArraySpec, DiscreteSpec, EnvSpec, StepType, TimeStep
from sebulba.observations import as_observations, observation_dtype

# Both protocols: 84x84 grey frames, max-pool over the last two of 4 repeated frames, a stack of
# the last 4, and a game capped at 108K frames (27K agent steps), as in both papers.
_COMMON = {
    "img_height": 84,
    "img_width": 84,
    "gray_scale": True,
    "frame_skip": 4,
    "stack_num": 4,
    "max_episode_steps": 27_000,
}

ATARI_PROTOCOLS: dict[str, dict[str, Any]] = {
    # Espeholt et al. (2018), IMPALA, Table G.1: a life loss ends the training episode, rewards
    # clipped to [-1, 1], up to 30 no-ops at the start of a game, no sticky actions, the
    # game's minimal action set, FIRE pressed on reset for games that need it.
    "impala": dict(
        _COMMON,
        noop_max=30,
        episodic_life=True,
        reward_clip=True,
        repeat_action_probability=0.0,
        full_action_space=False,
        use_fire_reset=True,
    ),
    # Machado et al. (2018), "Revisiting the ALE": sticky actions (p = 0.25) are the only
    # stochasticity, no life-loss signal, the full 18-action set, no no-op starts (envpool's
    # minimum, noop_max=1, is one no-op frame-group), no FIRE on reset; rewards clipped for
    # training only (returns are reported unclipped).
    "machado": dict(
        _COMMON,
        noop_max=1,
        episodic_life=False,
        reward_clip=True,
        repeat_action_probability=0.25,
        full_action_space=True,
        use_fire_reset=False,
    ),
    # Atari 100k (Kaiser et al., 2020) as EfficientZero plays it (Ye et al., 2021; its released
    # code: config/atari/__init__.py and core/utils.py): 96x96 RGB frames (cv2 INTER_AREA, which
    # envpool also uses), a stack of 4, frame skip 4 with a max over the last two frames, up to 30
    # no-ops at the start of a game, a life loss ends the training episode, rewards clipped to
    # their sign for training, no sticky actions and the minimal action set ("NoFrameskip-v4"),
    # and no FIRE on reset (its wrappers have none). A game is capped at 108K frames (27K agent
    # steps), the benchmark's limit and that of EfficientZero's final evaluation; its released
    # code caps training games at 12K frames (`--config.env.kwargs.max_episode_steps=3000` to
    # match). The budget is 100K agent steps (400K frames): experiments/atari100k.py.
    "atari100k": {
        "img_height": 96,
        "img_width": 96,
        "gray_scale": False,
        "frame_skip": 4,
        "stack_num": 4,
        "max_episode_steps": 27_000,
        "noop_max": 30,
        "episodic_life": True,
        "reward_clip": True,
        "repeat_action_probability": 0.0,
        "full_action_space": False,
        "use_fire_reset": False,
    },
}
# EfficientZero's grey-scale option (`gray_scale=True`, one channel per frame; its network then
# has 32 channels instead of 64), otherwise "atari100k".
ATARI_PROTOCOLS["atari100k_grey"] = dict(ATARI_PROTOCOLS["atari100k"], gray_scale=True)


@functools.cache
def all_tasks() -> tuple[str, ...]:
    """Every task id envpool registers."""
    return tuple(envpool.list_all_envs())


@functools.cache
def is_atari(task: str) -> bool:
    """Whether `task` is one of envpool's Atari games."""
    return envpool.make_spec(task).__class__.__name__ == "AtariEnvSpec"


def unknown_task_hint(task: str) -> str:
    close = difflib.get_close_matches(task, all_tasks(), n=3)
    return f"did you mean {', '.join(close)}?" if close else "see envpool.list_all_envs()"


def make_options(task: str, protocol: str, overrides: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The envpool options for `task` under `protocol` ("" or "none" for non-Atari tasks),
    with `overrides` on top. Raises ValueError for a protocol the task cannot use."""
    options: dict[str, Any] = {}
    if is_atari(task):
        if protocol not in ATARI_PROTOCOLS:
            raise ValueError(f"Atari task {task!r} needs a protocol, one of "
                             f"{sorted(ATARI_PROTOCOLS)}; got {protocol!r}")
        options.update(ATARI_PROTOCOLS[protocol])
    elif protocol not in ("", "none"):
        raise ValueError(f"protocol {protocol!r} applies to Atari tasks only, not {task!r}")
    options.update(overrides or {})
    return options


def run_description(task: str, protocol: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """What a run records about its environments: task, protocol, options, envpool version."""
    return {
        "task": task,
        "protocol": protocol or "none",
        "envpool_version": envpool.__version__,
        "envpool_options": dict(options),
    }


def _agent_layout_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    # envpool stacks image frames channel-first; our conv torsos read [H, W, C].
    return shape[1:] + shape[:1] if len(shape) == 3 else shape


def to_agent_layout(observation: Any) -> Any:
    """[B, C, H, W] envpool images -> [B, H, W, C]; other observations unchanged.

    Works on numpy and jax arrays; the runner applies it on the actor device, inside the jitted
    actor step, so the host does no copy.
    """
    if observation.ndim == 4:
        return observation.transpose(0, 2, 3, 1)
    return observation


@contextlib.contextmanager
def _quiet_box_precision() -> Iterator[None]:
    """Silences gymnasium's "Box low's (high's) precision lowered" UserWarning: envpool gives
    float64 bounds to its float32 Box spaces, which are built when its spec is read, and the
    bounds are never used at that precision here. `catch_warnings` swaps the process's filters:
    used only where specs and environments are built, at start-up."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*Box (low|high)'s precision lowered",
                                category=UserWarning)
        yield


def env_spec(task: str, options: Mapping[str, Any] | None = None) -> EnvSpec:
    """The agent-facing spec of `task` (observations in agent layout, see `to_agent_layout`)."""
    with _quiet_box_precision():
        spec = envpool.make_spec(task, **dict(options or {}))
        obs_space, act_space = spec.observation_space, spec.action_space
    if not hasattr(act_space, "n"):
        action: DiscreteSpec | ArraySpec = ArraySpec(tuple(act_space.shape), act_space.dtype,
                                                     act_space.low, act_space.high, "action")
    else:
        action = DiscreteSpec(int(act_space.n), np.int32, "action")
    observation = ArraySpec(_agent_layout_shape(tuple(obs_space.shape)),
                            observation_dtype(obs_space.dtype), name="observation")
    return EnvSpec(observation=observation, action=action)


class EnvpoolEnv:
    """A batch of `num_envs` envpool environments that speaks `TimeStep` (numpy, `[B]`).

    Observations are returned in envpool's layout; apply `to_agent_layout` (on device) before
    handing them to an agent. `extras` holds the unclipped game statistics described in the
    module docstring.
    """

    def __init__(self, task: str, num_envs: int, *, seed: int, num_threads: int = 0,
                 options: Mapping[str, Any] | None = None):
        self.task = task
        self.num_envs = num_envs
        self.options = dict(options or {})
        self._atari = is_atari(task)
        with _quiet_box_precision():
            self._env = envpool.make(task, env_type="gymnasium", num_envs=num_envs, seed=seed,
                                     num_threads=num_threads, **self.options)
            # Built (and kept) by envpool when first read, else at the first reset's.
            self._env.observation_space, self._env.action_space  # noqa: B018
        self._sent = False  # a step under way, until `recv`
        self._last = np.zeros(num_envs, bool)  # previous step was LAST: this one is a reset
        self._game_over = np.zeros(num_envs, bool)  # previous step ended a whole game
        self._return = np.zeros(num_envs, np.float32)
        self._length = np.zeros(num_envs, np.int32)

    def spec(self) -> EnvSpec:
        return env_spec(self.task, self.options)

    def reset(self) -> TimeStep:
        if self._sent:  # a step under way, its result no longer wanted
            self._env.recv(reset=False, return_info=True)
            self._sent = False
        obs, _ = self._env.reset()
        obs = as_observations(obs)
        self._last[:] = False
        self._game_over[:] = False
        self._return[:] = 0.0
        self._length[:] = 0
        n = self.num_envs
        return TimeStep(
            step_type=np.full(n, StepType.FIRST, np.int32),
            reward=np.zeros(n, np.float32),
            discount=np.ones(n, np.float32),
            observation=obs,
            extras=self._extras(np.zeros(n, bool)),
        )

    def step(self, action: np.ndarray) -> TimeStep:
        self.send(action)
        return self.recv()

    def send(self, action: np.ndarray) -> None:
        """Starts a step of the whole batch on envpool's threads and returns at once."""
        if self._sent:
            raise RuntimeError("send() twice without a recv() in between")
        self._env.send(np.asarray(action))
        self._sent = True

    def recv(self) -> TimeStep:
        """Waits for the step `send` started and returns it."""
        if not self._sent:  # envpool's recv would wait for ever
            raise RuntimeError("recv() without a send() before it")
        self._sent = False
        obs, reward, terminated, truncated, info = self._env.recv(reset=False, return_info=True)
        obs = as_observations(obs)
        reset = self._last  # these environments ignored `action` and started a new episode
        ended = (terminated | truncated) & ~reset
        step_type = np.where(reset, StepType.FIRST,
                             np.where(ended, StepType.LAST, StepType.MID)).astype(np.int32)
        discount = np.where(terminated & ~reset, 0.0, 1.0).astype(np.float32)
        reward = np.where(reset, 0.0, reward).astype(np.float32)

        # GAME STATISTICS (unclipped; a game spans life losses under episodic life)
        raw_reward = info["reward"] if self._atari else reward
        real_end = info["terminated"].astype(bool) if self._atari else terminated
        game_over = ended & (real_end | truncated)
        new_game = self._game_over
        self._return = np.where(new_game, 0.0, self._return).astype(np.float32)
        self._length = np.where(new_game, 0, self._length).astype(np.int32)
        self._return += np.where(reset, 0.0, raw_reward).astype(np.float32)
        self._length += (~reset).astype(np.int32)

        self._last = ended
        self._game_over = game_over
        return TimeStep(step_type=step_type, reward=reward, discount=discount, observation=obs,
                        extras=self._extras(game_over))

    def _extras(self, game_over: np.ndarray) -> dict[str, np.ndarray]:
        return {
            "episode_return": self._return.copy(),  # [B] unclipped score of the current game
            "episode_length": self._length.copy(),  # [B] agent steps in the current game
            "game_over": game_over.copy(),  # [B] this step ended a whole game
        }

    def close(self) -> None:
        self._env.close()
