"""Gymnasium environments in our `TimeStep` layout: `config.env.task = "gymnasium:<id>"`.

Any id in gymnasium's registry (one the researcher registered with `gymnasium.register`
included) is stepped as a gymnasium vector environment: a `SyncVectorEnv` in the actor thread
(`num_workers=0`), or `num_workers` worker processes, each stepping a `SyncVectorEnv` of its
share of the B environments (B / `num_workers`, or one more for the first B % `num_workers`;
`num_workers >= B`: one environment per process, as gymnasium's `AsyncVectorEnv`). The
conversion follows `sebulba.envpool_env`'s table in every autoreset mode of the vector
environment (`config.env.autoreset_mode`):

    gymnasium step k returns                   we return
    ----------------------------------------   ---------------------------------------------
    terminated                                 LAST, discount 0, the final observation
    truncated (time limit)                     LAST, discount 1, the final observation
    the step after a LAST (its action ignored) FIRST, reward 0, discount 1, the reset
                                                 observation
    anything else                              MID

    autoreset mode   where the final observation is   how the step after a LAST is made
    --------------   -----------------------------   ------------------------------------------
    next_step        the returned observation         the vector env resets on that step
    (gymnasium's default)
    same_step        info["final_obs"] (the returned  the vector env reset on step k; the
                     one is already the reset)        sub-environment holds its reset
                                                      observation for one step (`_HoldReset`)
    disabled         the returned observation         we reset the ended sub-environments
                                                      (`reset_mask`) before the next step,
                                                      which they then hold (`_HoldReset`)

so the action given on the step after a LAST never reaches the environment, in every mode, and
each episode starts from the environment's own reset. Episode statistics
(`extras["episode_return"]`, `["episode_length"]`, `["game_over"]`: every LAST ends a game)
are those of `sebulba.envpool_env` for a non-Atari task.
"""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode

from podracer.types import ArraySpec, DiscreteSpec, EnvSpec, StepType, TimeStep
from sebulba.observations import as_observations, observation_dtype

# gymnasium's autoreset modes by their config values (`sebulba.host_env.AUTORESET_MODES`, which
# the config validates against, lists the same; a test keeps the two equal).
MODES = {mode.name.lower(): mode for mode in AutoresetMode}

_FULL_RESET = "_podracer_full_reset"  # a reset option: not one that a held step follows


def registered(gym_id: str) -> bool:
    return gym_id in gymnasium.registry


def unknown_id_hint(gym_id: str) -> str:
    import difflib

    close = difflib.get_close_matches(gym_id, list(gymnasium.registry), n=3)
    return (f"did you mean {', '.join('gymnasium:' + c for c in close)}?" if close else
            "see gymnasium.pprint_registry(), or gymnasium.register(...) your environment "
            "before the run starts")


def _spec_of(space: Any, name: str) -> ArraySpec | DiscreteSpec:
    if isinstance(space, gymnasium.spaces.Discrete):
        if int(space.start) != 0:
            raise ValueError(f"the {name} space {space} starts at {space.start}, not 0")
        return DiscreteSpec(int(space.n), np.int32, name)
    if isinstance(space, gymnasium.spaces.Box):
        return ArraySpec(tuple(space.shape), space.dtype, space.low, space.high, name)
    raise ValueError(f"the {name} space {space} is neither Discrete nor Box")


def env_spec(gym_id: str, kwargs: Mapping[str, Any] | None = None) -> EnvSpec:
    """The agent-facing spec of `gymnasium.make(gym_id, **kwargs)` (one environment is made and
    closed). Raises ValueError for a space no agent reads (not Discrete or Box)."""
    env = gymnasium.make(gym_id, **dict(kwargs or {}))
    try:
        observation = _spec_of(env.observation_space, "observation")
        action = _spec_of(env.action_space, "action")
    finally:
        env.close()
    if isinstance(observation, DiscreteSpec):
        raise TypeError(f"the observation space {env.observation_space} is not a Box")
    observation = ArraySpec(observation.shape, observation_dtype(observation.dtype),
                            name="observation")
    return EnvSpec(observation=observation, action=action)


def run_description(gym_id: str, kwargs: Mapping[str, Any], num_workers: int,
                    autoreset_mode: str) -> dict[str, Any]:
    """What a run records about its environments: the id, its options, how it is stepped, and
    gymnasium's version."""
    return {
        "kind": "gymnasium",
        "task": f"gymnasium:{gym_id}",
        "gymnasium_id": gym_id,
        "gymnasium_version": gymnasium.__version__,
        "gymnasium_kwargs": dict(kwargs),
        "num_workers": num_workers,
        "autoreset_mode": autoreset_mode,
    }


class _HoldReset(gymnasium.Wrapper):
    """After a reset that follows an episode's end (not a full reset of the vector env), the
    next `step` returns the reset observation again, reward 0, without stepping: the step after
    a LAST whose action our layout ignores (modes same_step and disabled)."""

    def __init__(self, env: gymnasium.Env):
        super().__init__(env)
        self._held: Any = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        options = dict(options or {})
        full = options.pop(_FULL_RESET, False)
        obs, info = self.env.reset(seed=seed, options=options or None)
        self._held = None if full else obs
        return obs, info

    def step(self, action):
        if self._held is not None:
            obs, self._held = self._held, None
            return obs, 0.0, False, False, {}
        return self.env.step(action)


def _make_vector_env(spec: gymnasium.envs.registration.EnvSpec, num_envs: int, mode: str,
                     kwargs: Mapping[str, Any]) -> gymnasium.vector.VectorEnv:
    wrappers = [] if mode == "next_step" else [_HoldReset]
    return gymnasium.make_vec(spec, num_envs=num_envs, vectorization_mode="sync",
                              vector_kwargs={"autoreset_mode": MODES[mode]},
                              wrappers=wrappers, **dict(kwargs))


def seeds(seed: int, num_envs: int, resets: int = 0) -> list[int]:
    """The seeds of a batch's environments at its full reset number `resets` (0 first)."""
    state = np.random.SeedSequence([seed, resets]).generate_state(num_envs)
    return [int(s) for s in state % (2**31 - 1)]


def _results(obs, reward, terminated, truncated, info) -> tuple:
    final = info.get("final_obs")
    if final is not None:  # same_step: an object array, None where no episode ended
        mask = info["_final_obs"]
        final = (mask, np.stack([final[i] if mask[i] else obs[i] for i in range(len(mask))]))
    return obs, reward, terminated, truncated, final


def _worker(pipe, payload: bytes) -> None:
    """A worker process: one `SyncVectorEnv` of its share of the environments. Answers every
    command with ("ok", result) or, if the environment raised, ("error", its traceback)."""
    import traceback

    import cloudpickle

    env = None
    try:
        spec, num_envs, mode, kwargs = cloudpickle.loads(payload)
        env = _make_vector_env(spec, num_envs, mode, kwargs)
        pipe.send(("ok", None))
        while True:
            command, data = pipe.recv()
            if command == "close":
                pipe.send(("ok", None))
                return
            try:
                result = (_results(*env.step(data)) if command == "step"
                          else env.reset(**data)[0])
            except Exception:  # noqa: BLE001 (sent to the parent, which raises it)
                pipe.send(("error", traceback.format_exc()))
                continue
            pipe.send(("ok", result))
    except (EOFError, KeyboardInterrupt):
        return
    except Exception:  # noqa: BLE001 (making the environments failed)
        pipe.send(("error", traceback.format_exc()))
    finally:
        if env is not None:
            env.close()


def _receive(pipe) -> Any:
    status, result = pipe.recv()
    if status == "error":
        raise RuntimeError(f"a gymnasium worker process failed:\n{result}")
    return result


def _context() -> multiprocessing.context.BaseContext:
    """Worker processes start from a fork server that has imported this module (and so
    gymnasium) once: never a fork of a process running JAX's threads, and no import of the
    libraries per worker."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


class _Workers:
    """`num_workers` processes (at most `num_envs`), each stepping a `SyncVectorEnv` of its
    consecutive share of the environments (sizes differing by at most one); the same
    `step`/`reset` as one vector env (only `final_obs` of the info)."""

    def __init__(self, spec, num_envs: int, num_workers: int, mode: str,
                 kwargs: Mapping[str, Any]):
        import cloudpickle

        num_workers = min(num_workers, num_envs)
        sizes = [len(part) for part in np.array_split(np.arange(num_envs), num_workers)]
        self._bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        context = _context()
        self._pipes, self._processes = [], []
        for size in sizes:
            payload = cloudpickle.dumps((spec, size, mode, dict(kwargs)))
            parent, child = context.Pipe()
            process = context.Process(target=_worker, args=(child, payload), daemon=True)
            process.start()
            child.close()
            self._pipes.append(parent)
            self._processes.append(process)
        try:
            for pipe in self._pipes:
                _receive(pipe)  # each worker has made its environments (or says why not)
        except BaseException:
            self.close()
            raise

    def _split(self, x: np.ndarray | None, i: int) -> Any:
        return None if x is None else x[self._bounds[i]:self._bounds[i + 1]]

    def reset(self, *, seed: list[int] | None = None, options: dict | None = None) -> tuple:
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        busy = []
        for i, pipe in enumerate(self._pipes):
            part = self._split(mask, i)
            if part is not None and not part.any():
                continue
            data = {"seed": self._split(seed, i), "options": dict(options)}
            if part is not None:
                data["options"]["reset_mask"] = part
            pipe.send(("reset", data))
            busy.append(i)
        outs = {i: _receive(self._pipes[i]) for i in busy}
        return (np.concatenate([outs[i] for i in busy]) if mask is None else outs), {}

    def step(self, action: np.ndarray) -> tuple:
        self.send(action)
        return self.recv()

    def send(self, action: np.ndarray) -> None:
        """Starts every worker's step of its share and returns at once."""
        for i, pipe in enumerate(self._pipes):
            pipe.send(("step", self._split(action, i)))

    def recv(self) -> tuple:
        """Waits for the step `send` started: `step`'s result."""
        parts = [_receive(pipe) for pipe in self._pipes]
        obs, reward, terminated, truncated = (np.concatenate([p[k] for p in parts])
                                              for k in range(4))
        finals = [p[4] for p in parts]
        final = None
        if any(f is not None for f in finals):
            final = (np.concatenate([f[0] if f is not None else np.zeros(len(p[0]), bool)
                                     for f, p in zip(finals, parts)]),
                     np.concatenate([f[1] if f is not None else p[0]
                                     for f, p in zip(finals, parts)]))
        return obs, reward, terminated, truncated, final

    def close(self) -> None:
        for pipe in self._pipes:
            try:
                pipe.send(("close", None))
                pipe.recv()
            except (BrokenPipeError, EOFError, OSError, RuntimeError):
                pass
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()


class _InThread:
    """A `SyncVectorEnv` with `_Workers`' interface."""

    def __init__(self, spec, num_envs: int, mode: str, kwargs: Mapping[str, Any]):
        self._env = _make_vector_env(spec, num_envs, mode, kwargs)
        self._action: np.ndarray | None = None

    def reset(self, **kwargs) -> tuple:
        return self._env.reset(**kwargs)

    def step(self, action: np.ndarray) -> tuple:
        return _results(*self._env.step(action))

    def send(self, action: np.ndarray) -> None:
        """Holds `action` for `recv`, which steps (in this thread: nothing to overlap)."""
        self._action = action

    def recv(self) -> tuple:
        action, self._action = self._action, None
        return self.step(action)

    def close(self) -> None:
        self._env.close()


class GymnasiumEnv:
    """A batch of `num_envs` gymnasium environments that speaks `TimeStep` (numpy, `[B]`), as
    `sebulba.envpool_env.EnvpoolEnv` does; see the module docstring for the layout."""

    def __init__(self, gym_id: str, num_envs: int, *, seed: int, num_workers: int = 0,
                 autoreset_mode: str = "next_step", kwargs: Mapping[str, Any] | None = None):
        if autoreset_mode not in MODES:
            raise ValueError(f"autoreset_mode {autoreset_mode!r} is not one of "
                             f"{tuple(MODES)}")
        self.task = gym_id
        self.num_envs = num_envs
        self.kwargs = dict(kwargs or {})
        self.autoreset_mode = autoreset_mode
        self._seed = seed
        self._resets = 0
        spec = gymnasium.spec(gym_id)
        self._env = (_Workers(spec, num_envs, num_workers, autoreset_mode, self.kwargs)
                     if num_workers else _InThread(spec, num_envs, autoreset_mode, self.kwargs))
        self._last = np.zeros(num_envs, bool)
        self._return = np.zeros(num_envs, np.float32)
        self._length = np.zeros(num_envs, np.int32)
        self._sent: np.ndarray | None = None  # a step under way: its reset mask, until `recv`

    @functools.cached_property
    def _spec(self) -> EnvSpec:
        return env_spec(self.task, self.kwargs)

    def spec(self) -> EnvSpec:
        return self._spec

    def reset(self) -> TimeStep:
        if self._sent is not None:  # a step under way, its result no longer wanted
            self._env.recv()
            self._sent = None
        # Each full reset seeds the environments afresh from (seed, how many resets so far).
        env_seeds = seeds(self._seed, self.num_envs, self._resets)
        self._resets += 1
        options = None if self.autoreset_mode == "next_step" else {_FULL_RESET: True}
        obs, _ = self._env.reset(seed=env_seeds, options=options)
        n = self.num_envs
        # New arrays, never changed in place: earlier timesteps' extras may hold the old ones.
        self._last = np.zeros(n, bool)
        self._return = np.zeros(n, np.float32)
        self._length = np.zeros(n, np.int32)
        return TimeStep(step_type=np.full(n, StepType.FIRST, np.int32),
                        reward=np.zeros(n, np.float32), discount=np.ones(n, np.float32),
                        observation=as_observations(obs), extras=self._extras(self._last))

    def step(self, action: np.ndarray) -> TimeStep:
        self.send(action)
        return self.recv()

    def send(self, action: np.ndarray) -> None:
        """Starts a step of the batch: in the worker processes, which step while this thread
        goes on; without workers `recv` steps."""
        if self._sent is not None:
            raise RuntimeError("send() twice without a recv() in between")
        reset = self._last  # these environments ignore `action` and start a new episode
        if self.autoreset_mode == "disabled" and reset.any():
            self._env.reset(options={"reset_mask": reset.copy()})  # held for this step
        self._env.send(np.asarray(action))
        self._sent = reset

    def recv(self) -> TimeStep:
        """Waits for the step `send` started and returns it."""
        if self._sent is None:
            raise RuntimeError("recv() without a send() before it")
        reset, self._sent = self._sent, None
        any_reset = reset.any()
        obs, reward, terminated, truncated, final = self._env.recv()
        obs = as_observations(obs)
        reward = np.asarray(reward, np.float32)
        terminated = np.asarray(terminated, bool)
        ended = terminated | np.asarray(truncated, bool)
        step_type = np.where(ended, np.int32(StepType.LAST), np.int32(StepType.MID))
        self._return = self._return + reward
        self._length = self._length + 1
        if any_reset:  # (gymnasium already gives reward 0 and no end on these steps)
            step_type[reset] = StepType.FIRST
            ended[reset] = False
            terminated = terminated & ~reset
            reward = np.where(reset, np.float32(0.0), reward)
            self._return[reset] = 0.0
            self._length[reset] = 0
        if final is not None:  # same_step: the LAST step's observation is the final one
            mask, final_obs = final
            obs = np.where(
                (mask & ended).reshape((-1,) + (1,) * (obs.ndim - 1)), final_obs, obs
            ).astype(obs.dtype)
        self._last = ended
        return TimeStep(step_type=step_type, reward=reward,
                        discount=(~terminated).astype(np.float32), observation=obs,
                        extras=self._extras(ended))

    def _extras(self, game_over: np.ndarray) -> dict[str, np.ndarray]:
        return {"episode_return": self._return, "episode_length": self._length,
                "game_over": game_over}

    def close(self) -> None:
        self._env.close()
