"""bsuite-style diagnostic environments in JAX: deep sea, memory chain, umbrella chain, bandit.

Cheap probes of one ability each (Osband et al., 2020, "Behaviour Suite for Reinforcement
Learning"): exploration (`DeepSea`), memory (`MemoryChain`), credit assignment under noise
(`UmbrellaChain`) and the simplest action selection (`Bandit`). Each follows bsuite's
`bsuite.environments.*` dynamics step for step (the tests step bsuite beside them), so results
compare with published bsuite numbers. What bsuite draws from a seeded numpy generator once per
environment (deep sea's action mapping, the bandit's arm rewards) is drawn the same way here,
so `mapping_seed=s` gives bsuite's environment for the same seed; what bsuite draws per episode
or per step is drawn from the JAX key in the state.

Differences from bsuite, by design: only deep sea's deterministic variant is provided, and no
bsuite bookkeeping (regret counters, `bsuite_info`) is kept.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.base import Environment
from podracer.types import Array, ArraySpec, DiscreteSpec, PRNGKey, StepType, TimeStep


def _timestep(step_type: Array | int, reward: Array | float, observation: Array) -> TimeStep:
    step_type = jnp.asarray(step_type, jnp.int32)
    return TimeStep(
        step_type=step_type,
        reward=jnp.asarray(reward, jnp.float32),
        # Every episode end here is a true terminal.
        discount=jnp.where(step_type == StepType.LAST, 0.0, 1.0).astype(jnp.float32),
        observation=observation,
    )


# ---------------------------------------------------------------------------------------------
# Deep sea.


@chex.dataclass(frozen=True)
class DeepSeaState:
    row: Array  # [] int32, 0 .. size (size = the episode is over)
    column: Array  # [] int32


class DeepSea(Environment[DeepSeaState]):
    """An N x N grid, descended one row a step; only always going "right" finds the reward.

    The agent starts top-left. Each step it moves down one row and one column left or right
    (clipped); which action means "right" is fixed per cell by `mapping_seed` (as bsuite's
    `mapping_seed`). Going right costs `unscaled_move_cost / size`; going right from the last
    column pays +1. Episodes last exactly `size` steps; the final observation is all zeros.
    The optimal return is `1 - unscaled_move_cost`; a dithering agent finds it with probability
    2^-N, so it probes deep exploration.
    """

    def __init__(
        self,
        size: int = 10,
        *,
        unscaled_move_cost: float = 0.01,
        randomize_actions: bool = True,
        mapping_seed: int = 0,
    ):
        if size < 1:
            raise ValueError(f"DeepSea needs size >= 1, got {size}.")
        self.size = size
        self.unscaled_move_cost = unscaled_move_cost
        if randomize_actions:
            mapping = np.random.RandomState(mapping_seed).binomial(1, 0.5, [size, size])
        else:
            mapping = np.ones([size, size])
        # Which action is "right" in each cell: a static parameter, a constant under jit.
        self.action_mapping = np.asarray(mapping, np.int32)

    def _observation(self, row: Array, column: Array) -> Array:
        rows = jnp.arange(self.size)[:, None]
        columns = jnp.arange(self.size)[None, :]
        # Row == size (the episode is over) matches no cell: the all-zero final observation.
        return ((rows == row) & (columns == column)).astype(jnp.float32)

    def reset(self, key: PRNGKey) -> tuple[DeepSeaState, TimeStep]:
        del key  # the start is always the top-left cell
        state = DeepSeaState(row=jnp.zeros((), jnp.int32), column=jnp.zeros((), jnp.int32))
        return state, _timestep(StepType.FIRST, 0.0, self._observation(state.row, state.column))

    def step(self, state: DeepSeaState, action: Array) -> tuple[DeepSeaState, TimeStep]:
        mapping = jnp.asarray(self.action_mapping)
        right = action.astype(jnp.int32) == mapping[state.row, state.column]
        at_right_edge = state.column == self.size - 1
        reward = jnp.where(right & at_right_edge, 1.0, 0.0) - jnp.where(
            right, self.unscaled_move_cost / self.size, 0.0
        )
        column = jnp.clip(state.column + jnp.where(right, 1, -1), 0, self.size - 1)
        row = state.row + 1
        step_type = jnp.where(row == self.size, StepType.LAST, StepType.MID)
        state = DeepSeaState(row=row, column=column)
        return state, _timestep(step_type, reward, self._observation(row, column))

    def observation_spec(self) -> ArraySpec:
        return ArraySpec((self.size, self.size), np.float32, 0.0, 1.0, name="position")

    def action_spec(self) -> DiscreteSpec:
        return DiscreteSpec(2, np.int32, name="action")


# ---------------------------------------------------------------------------------------------
# Memory chain.


@chex.dataclass(frozen=True)
class MemoryChainState:
    timestep: Array  # [] int32
    context: Array  # [num_bits] int32, each 0 or 1
    query: Array  # [] int32, which bit is asked for


class MemoryChain(Environment[MemoryChainState]):
    """Remember a context bit seen at the start; report it `memory_length` steps later.

    Observation `[1, num_bits + 2]`: `[1 - t / memory_length, query, context...]`, where the
    context (as +-1) shows only at t = 0 and the query only at t = memory_length - 1. As in
    bsuite, each step returns the observation of the time it started from, so the context is
    seen on FIRST and on the first step, the query on step `memory_length`, and the action on
    step `memory_length + 1` is judged: +1 if it equals the queried bit, else -1; that step
    ends the episode.
    """

    def __init__(self, memory_length: int = 5, *, num_bits: int = 1):
        if memory_length < 1 or num_bits < 1:
            raise ValueError(
                f"MemoryChain needs memory_length >= 1 and num_bits >= 1, got "
                f"{memory_length} and {num_bits}."
            )
        self.memory_length = memory_length
        self.num_bits = num_bits

    def _observation(self, state: MemoryChainState) -> Array:
        t = state.timestep
        # (L - t) / L rather than 1 - t / L: XLA turns the division into a multiplication by
        # 1/L, and only this form is exactly 0 at t = L.
        time_left = (self.memory_length - t).astype(jnp.float32) / self.memory_length
        query = jnp.where(t == self.memory_length - 1, state.query, 0).astype(jnp.float32)
        context = jnp.where(t == 0, 2 * state.context - 1, 0).astype(jnp.float32)
        return jnp.concatenate([time_left[None], query[None], context])[None, :]

    def reset(self, key: PRNGKey) -> tuple[MemoryChainState, TimeStep]:
        context_key, query_key = jax.random.split(key)
        state = MemoryChainState(
            timestep=jnp.zeros((), jnp.int32),
            context=jax.random.bernoulli(context_key, 0.5, (self.num_bits,)).astype(jnp.int32),
            query=jax.random.randint(query_key, (), 0, self.num_bits, dtype=jnp.int32),
        )
        return state, _timestep(StepType.FIRST, 0.0, self._observation(state))

    def step(self, state: MemoryChainState, action: Array) -> tuple[MemoryChainState, TimeStep]:
        observation = self._observation(state)
        done = state.timestep == self.memory_length
        correct = action.astype(jnp.int32) == state.context[state.query]
        reward = jnp.where(done, jnp.where(correct, 1.0, -1.0), 0.0)
        state = state.replace(timestep=state.timestep + 1)
        step_type = jnp.where(done, StepType.LAST, StepType.MID)
        return state, _timestep(step_type, reward, observation)

    def observation_spec(self) -> ArraySpec:
        return ArraySpec((1, self.num_bits + 2), np.float32, -1.0, 1.0, name="observation")

    def action_spec(self) -> DiscreteSpec:
        return DiscreteSpec(2, np.int32, name="action")


# ---------------------------------------------------------------------------------------------
# Umbrella chain.


@chex.dataclass(frozen=True)
class UmbrellaChainState:
    timestep: Array  # [] int32
    need_umbrella: Array  # [] int32, 0 or 1
    has_umbrella: Array  # [] int32, 0 or 1
    key: PRNGKey  # for the noise rewards and distractor bits


class UmbrellaChain(Environment[UmbrellaChainState]):
    """Only the first action matters (take the umbrella or not), and only at the end.

    Observation `[1, 3 + n_distractor]`: `[need_umbrella, has_umbrella, 1 - t / chain_length,
    random distractor bits...]`. The first action sets `has_umbrella`; step `chain_length`
    ends the episode with +1 if `has_umbrella == need_umbrella`, else -1; every step before it
    pays a random +-1 (noise the agent must see through). Probes long-term credit assignment.
    """

    def __init__(self, chain_length: int = 10, *, n_distractor: int = 0):
        if chain_length < 1 or n_distractor < 0:
            raise ValueError(
                f"UmbrellaChain needs chain_length >= 1 and n_distractor >= 0, got "
                f"{chain_length} and {n_distractor}."
            )
        self.chain_length = chain_length
        self.n_distractor = n_distractor

    def _observation(self, state: UmbrellaChainState, key: PRNGKey) -> Array:
        # Exactly 0 at the end (see MemoryChain._observation).
        time_left = (self.chain_length - state.timestep).astype(jnp.float32) / self.chain_length
        distractors = jax.random.bernoulli(key, 0.5, (self.n_distractor,)).astype(jnp.float32)
        head = jnp.stack(
            [
                state.need_umbrella.astype(jnp.float32),
                state.has_umbrella.astype(jnp.float32),
                time_left,
            ]
        )
        return jnp.concatenate([head, distractors])[None, :]

    def reset(self, key: PRNGKey) -> tuple[UmbrellaChainState, TimeStep]:
        key, need_key, has_key, obs_key = jax.random.split(key, 4)
        state = UmbrellaChainState(
            timestep=jnp.zeros((), jnp.int32),
            need_umbrella=jax.random.bernoulli(need_key).astype(jnp.int32),
            has_umbrella=jax.random.bernoulli(has_key).astype(jnp.int32),
            key=key,
        )
        return state, _timestep(StepType.FIRST, 0.0, self._observation(state, obs_key))

    def step(self, state: UmbrellaChainState, action: Array) -> tuple[UmbrellaChainState, TimeStep]:
        key, noise_key, obs_key = jax.random.split(state.key, 3)
        timestep = state.timestep + 1
        has_umbrella = jnp.where(timestep == 1, action.astype(jnp.int32), state.has_umbrella)
        done = timestep == self.chain_length
        final = jnp.where(has_umbrella == state.need_umbrella, 1.0, -1.0)
        noise = 2.0 * jax.random.bernoulli(noise_key).astype(jnp.float32) - 1.0
        state = state.replace(timestep=timestep, has_umbrella=has_umbrella, key=key)
        step_type = jnp.where(done, StepType.LAST, StepType.MID)
        return state, _timestep(
            step_type, jnp.where(done, final, noise), self._observation(state, obs_key)
        )

    def observation_spec(self) -> ArraySpec:
        return ArraySpec((1, 3 + self.n_distractor), np.float32, 0.0, 1.0, name="observation")

    def action_spec(self) -> DiscreteSpec:
        return DiscreteSpec(2, np.int32, name="action")


# ---------------------------------------------------------------------------------------------
# Bandit.


@chex.dataclass(frozen=True)
class BanditState:
    pulls: Array  # [] int32, 0 before the pull, 1 after (the episode is one step)


class Bandit(Environment[BanditState]):
    """bsuite's simple bandit: one step per episode; arm rewards are 0, 0.1, ..., 1, shuffled.

    The shuffle is fixed by `mapping_seed` (bsuite's `mapping_seed`). The observation is a
    constant `[[1.0]]`.
    """

    def __init__(self, num_actions: int = 11, *, mapping_seed: int = 0):
        if num_actions < 2:
            raise ValueError(f"Bandit needs num_actions >= 2, got {num_actions}.")
        self.num_actions = num_actions
        order = np.random.RandomState(mapping_seed).choice(
            range(num_actions), size=num_actions, replace=False
        )
        self.arm_rewards = np.linspace(0, 1, num_actions)[order].astype(np.float32)

    def reset(self, key: PRNGKey) -> tuple[BanditState, TimeStep]:
        del key
        state = BanditState(pulls=jnp.zeros((), jnp.int32))
        return state, _timestep(StepType.FIRST, 0.0, jnp.ones((1, 1), jnp.float32))

    def step(self, state: BanditState, action: Array) -> tuple[BanditState, TimeStep]:
        reward = jnp.asarray(self.arm_rewards)[action.astype(jnp.int32)]
        state = BanditState(pulls=state.pulls + 1)
        return state, _timestep(StepType.LAST, reward, jnp.ones((1, 1), jnp.float32))

    def observation_spec(self) -> ArraySpec:
        return ArraySpec((1, 1), np.float32, 1.0, 1.0, name="observation")

    def action_spec(self) -> DiscreteSpec:
        return DiscreteSpec(self.num_actions, np.int32, name="arm")
