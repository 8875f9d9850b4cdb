"""The host environments Sebulba's actors and evaluation step, of three kinds, named by
`config.env.task`:

    config.env.task          stepped as                                   module
    ----------------------   ------------------------------------------   ---------------------
    "<envpool task id>"      envpool's C++ batch (`env.num_threads`)      `sebulba.envpool_env`
    "gymnasium:<id>"         a gymnasium vector environment, in the       `sebulba.gymnasium_env`
                             actor thread or `env.num_workers` processes
    "envs_jax:<name>"        `envs_jax.make(name)`, one jitted, vmapped   `sebulba.envs_jax_env`
                             step on the host CPU device

Every kind is a `HostEnv`: `reset()` and `step(action)` return `TimeStep`s of numpy `[B]`
arrays in the layout of `sebulba.envpool_env`'s table (LAST keeps the final observation with
discount 0 on termination and 1 on truncation; the step after it is FIRST, reward 0, discount
1, its action ignored), with `extras["episode_return"]`, `["episode_length"]` and
`["game_over"]`. Only envpool's observations need `to_agent_layout` (its images are
channel-first); the other kinds' are already the agent's (`agent_layout(kind)`).

A step can also be split in two, `send(action)` then `recv()`, as envpool's own API is: between
the two the batch steps on its own (envpool's C++ threads, gymnasium's worker processes, XLA's
threads for envs_jax), so an actor thread with several batches (`config.env.batches`) chooses
one batch's actions while another steps. A gymnasium batch without workers steps in `recv`,
overlapping nothing; `split_step(env)` gives the two to any `HostEnv`, stepping in `recv` for
one that lacks them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from podracer.types import EnvSpec, TimeStep

KINDS = ("envpool", "gymnasium", "envs_jax")
AUTORESET_MODES = ("next_step", "same_step", "disabled")  # gymnasium's, as config values
GYMNASIUM_INSTALL = ("pip install gymnasium (a main dependency, pinned in pyproject.toml: "
                     "pip install -e . installs it)")


class HostEnv(Protocol):
    """A batch of `num_envs` environments on the host that speaks `TimeStep`."""

    num_envs: int

    def spec(self) -> EnvSpec: ...

    def reset(self) -> TimeStep: ...

    def step(self, action: Any) -> TimeStep: ...

    def close(self) -> None: ...


def split_step(env: HostEnv) -> tuple[Callable[[Any], None], Callable[[], TimeStep]]:
    """`env`'s step as `(send, recv)`: `send(action)` starts it and returns, `recv()` waits for
    it and returns its `TimeStep`. An environment with `send` and `recv` methods of its own
    steps between the two calls; for one without them, `recv` steps."""
    if hasattr(env, "send") and hasattr(env, "recv"):
        return env.send, env.recv
    pending: list[Any] = []

    def send(action: Any) -> None:
        if pending:
            raise RuntimeError("send() twice without a recv() in between")
        pending.append(action)

    def recv() -> TimeStep:
        if not pending:
            raise RuntimeError("recv() without a send() before it")
        return env.step(pending.pop())

    return send, recv


def parse_task(task: str) -> tuple[str, str]:
    """("envpool", task) | ("gymnasium", id) | ("envs_jax", name) for `config.env.task`."""
    for kind in ("gymnasium", "envs_jax"):
        prefix = kind + ":"
        if task.startswith(prefix):
            return kind, task[len(prefix):]
    return "envpool", task


def gymnasium_module():
    """`sebulba.gymnasium_env`, imported on first use; a clear error without gymnasium."""
    try:
        from sebulba import gymnasium_env
    except ModuleNotFoundError as e:
        if e.name != "gymnasium":
            raise
        raise ModuleNotFoundError(
            f"'gymnasium:' tasks need gymnasium: {GYMNASIUM_INSTALL}", name="gymnasium") from e
    return gymnasium_env


def agent_layout(kind: str) -> Callable[[Any], Any]:
    """The function that puts a batch of `kind`'s observations in the agent's layout (on
    device, inside the jitted actor step)."""
    if kind == "envpool":
        from sebulba import envpool_env

        return envpool_env.to_agent_layout
    return _identity


def _identity(observation: Any) -> Any:
    return observation


@dataclasses.dataclass(frozen=True)
class Stepping:
    """How a kind's batches are stepped (the config fields that apply to it)."""

    num_threads: int = 0  # envpool: C++ threads per batch (0: envpool's default)
    num_workers: int = 0  # gymnasium: worker processes per batch (0: in the actor thread)
    autoreset_mode: str = "next_step"  # gymnasium: the vector environment's autoreset mode


def make(kind: str, name: str, num_envs: int, *, seed: int, options: Mapping[str, Any],
         stepping: Stepping) -> HostEnv:
    """A batch of `num_envs` environments of `kind`, seeded with `seed`."""
    if kind == "envpool":
        from sebulba import envpool_env

        return envpool_env.EnvpoolEnv(name, num_envs, seed=seed,
                                      num_threads=stepping.num_threads, options=options)
    if kind == "gymnasium":
        return gymnasium_module().GymnasiumEnv(
            name, num_envs, seed=seed, num_workers=stepping.num_workers,
            autoreset_mode=stepping.autoreset_mode, kwargs=options)
    if kind == "envs_jax":
        from sebulba import envs_jax_env

        return envs_jax_env.EnvsJaxEnv(name, num_envs, seed=seed, kwargs=options)
    raise ValueError(f"unknown host environment kind {kind!r}; one of {KINDS}")


def run_description(kind: str, name: str, protocol: str, options: Mapping[str, Any],
                    stepping: Stepping) -> dict[str, Any]:
    """What a run records about its environments (the kind, its options and versions)."""
    if kind == "envpool":
        from sebulba import envpool_env

        return {"kind": "envpool", **envpool_env.run_description(name, protocol, options)}
    if kind == "gymnasium":
        return gymnasium_module().run_description(name, options, stepping.num_workers,
                                                  stepping.autoreset_mode)
    from sebulba import envs_jax_env

    return envs_jax_env.run_description(name, options)
