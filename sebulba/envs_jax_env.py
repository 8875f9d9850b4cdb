"""`envs_jax` environments stepped on the host: `config.env.task = "envs_jax:<name>"`.

Any name `envs_jax.make` accepts (native, a researcher's `envs_jax.register`ed one, or an
adapter's `"gymnax:<name>"`), wrapped with `envs_jax.wrap_for_training` and batched with
`jax.vmap`; one jitted call steps all B environments on the host CPU device and the
`TimeStep` comes back as numpy arrays. `wrap_for_training`'s automatic reset already follows
`sebulba.envpool_env`'s table (LAST keeps the final observation, discount 0 on a terminal and 1
on a time-limit truncation; the step after it is FIRST with reward 0 and discount 1, its action
ignored), and its `EpisodeStatistics` give `episode_return` and `episode_length`;
`extras["game_over"]` marks every LAST.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

import envs_jax
from podracer.types import EnvSpec, TimeStep


def known(name: str) -> bool:
    """Whether `envs_jax.make` can build `name` here: a native name, or one in an installed
    adapter namespace (whose library checks the rest)."""
    namespace, sep, _ = name.partition(":")
    if sep:
        return namespace in envs_jax.namespaces() and envs_jax.missing_extra(name) is None
    return name in envs_jax.registered(adapters=False)


def unknown_name_hint(name: str) -> str:
    import difflib

    extra = envs_jax.missing_extra(name)
    if extra:
        return f"pip install -e '.[{extra}]' for {name!r}"
    close = difflib.get_close_matches(name, envs_jax.registered(adapters=False), n=3)
    return (f"did you mean {', '.join('envs_jax:' + c for c in close)}?" if close else
            "see envs_jax.registered(), or envs_jax.register(...) your environment before the "
            "run starts")


def make(name: str, kwargs: Mapping[str, Any] | None = None) -> envs_jax.Environment:
    """The training-wrapped environment (raises KeyError / ModuleNotFoundError / TypeError for
    a bad name or options)."""
    return envs_jax.wrap_for_training(envs_jax.make(name, **dict(kwargs or {})))


def env_spec(name: str, kwargs: Mapping[str, Any] | None = None) -> EnvSpec:
    return make(name, kwargs).spec()


def host_device() -> jax.Device:
    """Where the environments step: the host's CPU device."""
    return jax.devices("cpu")[0]


def run_description(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """What a run records about its environments: the name, its options, where it steps, the
    JAX version that compiles it, and for an adapted library's environment that library and
    its version (`envs_jax.describe`)."""
    adapted = {key: value for key, value in envs_jax.describe(name).items()
               if key in ("library", "library_version")}
    return {
        "kind": "envs_jax",
        "task": f"envs_jax:{name}",
        "envs_jax_name": name,
        "envs_jax_kwargs": dict(kwargs),
        **adapted,
        "device": str(host_device()),
        "jax_version": jax.__version__,
    }


class EnvsJaxEnv:
    """A batch of `num_envs` `envs_jax` environments that speaks `TimeStep` (numpy, `[B]`), as
    `sebulba.envpool_env.EnvpoolEnv` does."""

    def __init__(self, name: str, num_envs: int, *, seed: int,
                 kwargs: Mapping[str, Any] | None = None):
        self.task = name
        self.num_envs = num_envs
        self.kwargs = dict(kwargs or {})
        self._env = make(name, self.kwargs)
        self._device = host_device()
        self._key = jax.device_put(jax.random.PRNGKey(seed), self._device)
        self._resets = 0
        env = self._env
        self._reset = jax.jit(lambda key: jax.vmap(env.reset)(jax.random.split(key, num_envs)))
        self._step = jax.jit(jax.vmap(env.step))
        self._state: Any = None
        self._pending: TimeStep | None = None  # the step `send` dispatched, until `recv`

    @functools.cached_property
    def _spec(self) -> EnvSpec:
        return self._env.spec()

    def spec(self) -> EnvSpec:
        return self._spec

    def _to_host(self, timestep: TimeStep) -> TimeStep:
        timestep = jax.device_get(timestep)
        last = timestep.step_type == 2
        extras = {"episode_return": np.asarray(timestep.extras["episode_return"], np.float32),
                  "episode_length": np.asarray(timestep.extras["episode_length"], np.int32),
                  "game_over": np.asarray(last, bool)}
        return TimeStep(step_type=np.asarray(timestep.step_type, np.int32),
                        reward=np.asarray(timestep.reward, np.float32),
                        discount=np.asarray(timestep.discount, np.float32),
                        observation=np.asarray(timestep.observation), extras=extras)

    def reset(self) -> TimeStep:
        # Each full reset starts from its own key: (seed, how many resets so far).
        key = jax.random.fold_in(self._key, self._resets)
        self._resets += 1
        self._state, timestep = self._reset(key)
        self._pending = None
        return self._to_host(timestep)

    def step(self, action: np.ndarray) -> TimeStep:
        self.send(action)
        return self.recv()

    def send(self, action: np.ndarray) -> None:
        """Dispatches the jitted step (XLA runs it while the caller goes on)."""
        if self._pending is not None:
            raise RuntimeError("send() twice without a recv() in between")
        action = jax.device_put(np.asarray(action), self._device)
        self._state, self._pending = self._step(self._state, action)

    def recv(self) -> TimeStep:
        """Waits for the step `send` dispatched and returns it on the host."""
        if self._pending is None:
            raise RuntimeError("recv() without a send() before it")
        timestep, self._pending = self._pending, None
        return self._to_host(timestep)

    def close(self) -> None:
        self._state = None
