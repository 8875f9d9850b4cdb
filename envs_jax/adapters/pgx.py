"""The pgx adapter: every pgx game as `"pgx:<id>"` (MinAtar, 2048, and board and card games).

Legal actions: `timestep.extras["action_mask"]` (bool `[num_actions]`) on every timestep. pgx
ends a game when an illegal action is played (with a penalty), so agents should sample from
the mask.

Several players (chess, go, ...): the adapter is the game as seen by whoever is to move, i.e.
self-play. The observation is from the perspective of the player to move next
(`extras["current_player"]`), and the reward is that of the player who just moved. For these
zero-sum, alternating games a plain single-agent learner is *not* correct as is (the next
state's value belongs to the opponent); this view is what a self-play agent builds on.

Termination and truncation stay apart (pgx's `truncated` becomes LAST with discount 1). pgx
takes a key per step for stochastic games (MinAtar's sticky actions, 2048's tiles,
backgammon's dice); it is kept in the state. `make(name, **kwargs)` passes `kwargs` to the
game's constructor (e.g. `sticky_action_prob=0.0` for MinAtar), which `pgx.make` does not.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.adapters._specs import concrete, specs_of
from envs_jax.base import Environment
from podracer.types import Array, ArraySpec, DiscreteSpec, PRNGKey, StepType, TimeStep


def names() -> list[str]:
    import pgx

    return list(pgx.available_envs())


def make(name: str, **kwargs: Any) -> PgxEnv:
    return PgxEnv(name, **kwargs)


@chex.dataclass(frozen=True)
class PgxState:
    pgx_state: Any  # pgx's State
    key: PRNGKey  # this episode's key; the reset and every step fold a counter into it
    steps: Array  # [] int32 steps taken in this episode


class PgxEnv(Environment[PgxState]):
    def __init__(self, name: str, **kwargs: Any):
        import pgx

        game = pgx.make(name)
        self.name = name
        self.game = type(game)(**kwargs) if kwargs else game
        self.num_players = int(self.game.num_players)

    def _extras(self, pgx_state: Any) -> dict[str, Array]:
        extras = {"action_mask": pgx_state.legal_action_mask}
        if self.num_players > 1:
            extras["current_player"] = pgx_state.current_player.astype(jnp.int32)
        return extras

    def reset(self, key: PRNGKey) -> tuple[PgxState, TimeStep]:
        # One hash per reset and per step (fold_in of a counter) rather than a split (two):
        # under automatic reset both run every step, and on cheap games hashing dominates.
        pgx_state = self.game.init(jax.random.fold_in(key, 0))
        timestep = TimeStep(
            step_type=jnp.asarray(StepType.FIRST, jnp.int32),
            reward=jnp.zeros((), jnp.float32),
            discount=jnp.ones((), jnp.float32),
            observation=pgx_state.observation,
            extras=self._extras(pgx_state),
        )
        return PgxState(pgx_state=pgx_state, key=key, steps=jnp.zeros((), jnp.int32)), timestep

    def step(self, state: PgxState, action: Array) -> tuple[PgxState, TimeStep]:
        steps = state.steps + 1
        step_key = jax.random.fold_in(state.key, steps)
        mover = state.pgx_state.current_player
        pgx_state = self.game.step(state.pgx_state, action.astype(jnp.int32), step_key)
        terminated, truncated = pgx_state.terminated, pgx_state.truncated
        last = terminated | truncated
        timestep = TimeStep(
            step_type=jnp.where(last, StepType.LAST, StepType.MID).astype(jnp.int32),
            reward=pgx_state.rewards[mover].astype(jnp.float32),
            discount=jnp.where(terminated, 0.0, 1.0).astype(jnp.float32),
            observation=pgx_state.observation,
            extras=self._extras(pgx_state),
        )
        return PgxState(pgx_state=pgx_state, key=state.key, steps=steps), timestep

    @concrete
    def observation_spec(self) -> ArraySpec:
        spec = specs_of(lambda key: self.game.init(key).observation, jax.random.PRNGKey(0))
        return ArraySpec(spec.shape, spec.dtype, name="observation")

    @concrete
    def action_spec(self) -> DiscreteSpec:
        # Not `self.game.num_actions`: pgx computes it by running `init` op by op on every
        # call (seconds for shogi or mahjong); the mask's shape is all it reads.
        mask = specs_of(lambda key: self.game.init(key).legal_action_mask, jax.random.PRNGKey(0))
        return DiscreteSpec(int(mask.shape[0]), np.int32, name="action")
