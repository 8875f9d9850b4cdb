"""Catch, the game of the Podracer colab (and bsuite): catch a falling ball with a paddle.

A 10x5 board. The ball starts in row 0 at a random column; the paddle sits in the bottom row,
starting in the middle column. Each step the paddle moves left, stays or moves right (actions
0, 1, 2; clipped at the walls) and the ball falls one row. When the ball reaches the bottom
row the episode ends (a true terminal) with reward +1 if the paddle is under it, else -1.
Episodes last `rows - 1` steps. The observation is the board: 1.0 at the ball and the paddle.

With `drift_probability` p > 0 (`stochastic_catch`: 0.25), each step, after the ball falls,
it also moves one column left with probability p/2 or right with probability p/2 (a move into
a wall leaves it where it is): the outcome of an action is random, and the catch is decided
where the ball lands after its last drift. p = 0 is Catch, whose key is never consumed.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.base import Environment
from podracer.types import Array, ArraySpec, DiscreteSpec, PRNGKey, StepType, TimeStep


@chex.dataclass(frozen=True)
class CatchState:
    ball_x: Array  # [] int32
    ball_y: Array  # [] int32
    paddle_x: Array  # [] int32
    key: PRNGKey  # [2] uint32


class Catch(Environment[CatchState]):
    def __init__(self, rows: int = 10, columns: int = 5, drift_probability: float = 0.0):
        if rows < 2 or columns < 1:
            raise ValueError(f"Catch needs rows >= 2 and columns >= 1, got {rows}x{columns}.")
        if not 0.0 <= drift_probability <= 1.0:
            raise ValueError("Catch's drift_probability is a probability in [0, 1], got "
                             f"{drift_probability}.")
        self.rows = rows
        self.columns = columns
        self.drift_probability = float(drift_probability)

    def _observation(self, state: CatchState) -> Array:
        # Comparisons against iotas rather than scatters: under vmap they stay elementwise,
        # which XLA fuses into one cheap loop (a batched scatter does not).
        y = jnp.arange(self.rows)[:, None]
        x = jnp.arange(self.columns)[None, :]
        ball = (y == state.ball_y) & (x == state.ball_x)
        paddle = (y == self.rows - 1) & (x == state.paddle_x)
        return (ball | paddle).astype(jnp.float32)

    def reset(self, key: PRNGKey) -> tuple[CatchState, TimeStep]:
        # One hash per reset: under automatic reset a reset is computed on every step, so this
        # is the environment's hot path. The modulo bias (< 1e-9) is immaterial. Without
        # drift the dynamics are deterministic, and the key kept in the state is never
        # consumed again.
        bits = jax.random.bits(key, (), jnp.uint32)
        state = CatchState(
            ball_x=(bits % self.columns).astype(jnp.int32),
            ball_y=jnp.zeros((), jnp.int32),
            paddle_x=jnp.asarray(self.columns // 2, jnp.int32),
            key=key,
        )
        timestep = TimeStep(
            step_type=jnp.asarray(StepType.FIRST, jnp.int32),
            reward=jnp.zeros((), jnp.float32),
            discount=jnp.ones((), jnp.float32),
            observation=self._observation(state),
        )
        return state, timestep

    def step(self, state: CatchState, action: Array) -> tuple[CatchState, TimeStep]:
        paddle_x = jnp.clip(state.paddle_x + action.astype(jnp.int32) - 1, 0, self.columns - 1)
        ball_y = state.ball_y + 1
        state = state.replace(ball_y=ball_y, paddle_x=paddle_x)
        if self.drift_probability > 0:
            key, draw_key = jax.random.split(state.key)
            u = jax.random.uniform(draw_key)
            half = self.drift_probability / 2
            move = jnp.where(u < half, -1, jnp.where(u < 2 * half, 1, 0))
            ball_x = jnp.clip(state.ball_x + move, 0, self.columns - 1).astype(jnp.int32)
            state = state.replace(ball_x=ball_x, key=key)
        done = ball_y == self.rows - 1
        caught = state.ball_x == paddle_x
        timestep = TimeStep(
            step_type=jnp.where(done, StepType.LAST, StepType.MID).astype(jnp.int32),
            reward=jnp.where(done, jnp.where(caught, 1.0, -1.0), 0.0).astype(jnp.float32),
            discount=jnp.where(done, 0.0, 1.0).astype(jnp.float32),
            observation=self._observation(state),
        )
        return state, timestep

    def observation_spec(self) -> ArraySpec:
        return ArraySpec((self.rows, self.columns), np.float32, 0.0, 1.0, name="board")

    def action_spec(self) -> DiscreteSpec:
        return DiscreteSpec(3, np.int32, name="left_stay_right")


STOCHASTIC_DRIFT = 0.25  # `stochastic_catch`'s drift probability


def stochastic_catch(rows: int = 10, columns: int = 5,
                     drift_probability: float = STOCHASTIC_DRIFT) -> Catch:
    """Catch whose ball drifts a column with probability `drift_probability` each step."""
    return Catch(rows, columns, drift_probability)
