"""The brax adapter: every brax environment as `"brax:<name>"` (`"brax:ant"`, `"brax:hopper"`).

Continuous control: the action is a float32 vector in [-1, 1]^action_size (brax's convention),
the observation brax's (a vector for the built-in environments). brax's raw environments only
terminate (`done`, e.g. the ant falling over): that becomes LAST with discount 0. brax's own
time limit lives in its training wrapper (`brax.envs.create(episode_length=1000)`, which also
auto-resets and so loses the final observation); this adapter applies the same 1000-step limit
with `envs_jax.TimeLimit` instead, so a time-limit end is LAST with discount 1 and keeps the
final observation. `make(name, episode_length=N)` changes it (0 for none); other keyword
arguments go to the brax environment's constructor (e.g. `backend="mjx"`).

brax itself warns that its environments are no longer actively maintained (MuJoCo Playground
is their successor); compiling one takes 1-5 minutes on a 2-core CPU. brax 0.14.2 (the newest
release) calls `jnp.clip(x, a_min=...)` in its fluid model (`brax.fluid`, used by
`brax:swimmer`); jax 0.10 removed those keywords. `_patch_brax_fluid` gives that one module a
`jnp` whose `clip` also takes them, leaving `jax.numpy` itself untouched.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.adapters._specs import concrete, specs_of
from envs_jax.base import Environment
from podracer.types import Array, ArraySpec, PRNGKey, StepType, TimeStep

EPISODE_LENGTH = 1000  # brax.envs.create's default


def names() -> list[str]:
    from brax import envs

    # brax keeps its registry in a module-level dict; `get_environment` reads the same one.
    return sorted(envs._envs)


class _ClipKeywordsCompat:
    """`jax.numpy`, but `clip` also accepts the `a_min`/`a_max` keywords jax 0.10 removed."""

    def __getattr__(self, name: str) -> Any:
        return getattr(jnp, name)

    @staticmethod
    def clip(
        x: Array, min: Any = None, max: Any = None, *, a_min: Any = None, a_max: Any = None
    ) -> Array:
        return jnp.clip(x, a_min if min is None else min, a_max if max is None else max)


def _patch_brax_fluid() -> None:
    from brax import fluid

    if fluid.jp is jnp:
        fluid.jp = _ClipKeywordsCompat()


def make(name: str, *, episode_length: int = EPISODE_LENGTH, **kwargs: Any) -> Environment:
    from envs_jax.wrappers import TimeLimit

    _patch_brax_fluid()

    env = BraxEnv(name, **kwargs)
    return TimeLimit(env, episode_length) if episode_length else env


class BraxEnv(Environment[Any]):
    """One brax environment; its `State` is the state here (the dynamics are deterministic)."""

    def __init__(self, name: str, **kwargs: Any):
        from brax import envs

        self.name = name
        self.brax_env = envs.get_environment(name, **kwargs)

    def reset(self, key: PRNGKey) -> tuple[Any, TimeStep]:
        state = self.brax_env.reset(key)
        timestep = TimeStep(
            step_type=jnp.asarray(StepType.FIRST, jnp.int32),
            reward=jnp.zeros((), jnp.float32),
            discount=jnp.ones((), jnp.float32),
            observation=state.obs,
        )
        return state, timestep

    def step(self, state: Any, action: Array) -> tuple[Any, TimeStep]:
        state = self.brax_env.step(state, action)
        terminated = state.done > 0.5
        timestep = TimeStep(
            step_type=jnp.where(terminated, StepType.LAST, StepType.MID).astype(jnp.int32),
            reward=jnp.asarray(state.reward, jnp.float32),
            discount=jnp.where(terminated, 0.0, 1.0).astype(jnp.float32),
            observation=state.obs,
        )
        return state, timestep

    @concrete
    def observation_spec(self) -> Any:
        return specs_of(lambda key: self.brax_env.reset(key).obs, jax.random.PRNGKey(0))

    @concrete
    def action_spec(self) -> ArraySpec:
        size = int(self.brax_env.action_size)
        return ArraySpec(
            (size,),
            np.float32,
            -np.ones(size, np.float32),
            np.ones(size, np.float32),
            name="action",
        )
