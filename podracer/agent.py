"""The agent interface: the one seam that Anakin and Sebulba both plug into.

An agent is a bundle of pure functions over explicit pytrees. The runners never branch on
which agent they run: Anakin calls `actor_step` and `learner_step` inside one compiled
program; Sebulba calls `actor_step` on the actor devices and `learner_step`, replicated, on the
learner devices. docs/architecture.md describes the interface and how both runners use it.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Protocol

import jax

from podracer.types import Array, EnvSpec, Extras, Metrics, Params, PRNGKey, TimeStep, Trajectory

LearnerState = Any
ActorState = Any


class InitFn(Protocol):
    def __call__(self, key: PRNGKey, env_spec: EnvSpec) -> LearnerState: ...


class InitActorStateFn(Protocol):
    def __call__(self, batch_size: int) -> ActorState: ...


class ActorStepFn(Protocol):
    def __call__(
        self,
        params: Params,
        actor_state: ActorState,
        timestep: TimeStep,
        key: PRNGKey,
        *,
        evaluation: bool = False,
    ) -> tuple[Array, ActorState, Extras]:
        """Chooses actions for a batch `[B]` of timesteps.

        `evaluation=True` asks for the greedy/deterministic policy. `extras` holds what the
        learner needs (behaviour logits, search policy, root value, ...), each `[B, ...]`.
        Sebulba sends only the observation and the step type to the actor device at each step:
        there `timestep.reward` and `timestep.discount` are `None`.
        """


class LearnerStepFn(Protocol):
    def __call__(
        self,
        learner_state: LearnerState,
        trajectory: Trajectory,
        key: PRNGKey,
        *,
        axis_name: str | None,
    ) -> tuple[LearnerState, Metrics]:
        """Consumes a time-major `[T+1, B]` trajectory and updates the learner.

        Gradients (and anything else that must agree across replicas) are averaged over the
        device axis `axis_name`; `None` means no replication. Metrics are scalars.
        """


class ActorParamsFn(Protocol):
    def __call__(self, learner_state: LearnerState) -> Params: ...


class SetHparamsFn(Protocol):
    def __call__(self, learner_state: LearnerState, hparams: dict[str, Array]) -> LearnerState:
        """Returns `learner_state` with the named scalar hyperparameters (agent config field
        names) replaced by `hparams`' values.

        The values may be traced, which is how a runner `vmap`s one compiled program over
        runs with different hyperparameters: an agent that supports this keeps those
        hyperparameters in its learner state (e.g. with `optax.inject_hyperparams`) and its
        functions read them only from there, never as constants from its config. A runner
        may therefore reuse programs compiled for other values of them.
        """


class Agent(NamedTuple):
    """The three pure functions of docs/architecture.md plus small accessors.

    `set_hparams` and `sweepable` are optional: an agent without them can still be swept over
    seeds, but not over hyperparameters. What a run records and checks on resume beyond the
    config (the agent's choices for fields left to it, fields added after runs were made
    without them) is declared where the agent is registered (`agents.register`).
    """

    init: InitFn
    actor_step: ActorStepFn
    learner_step: LearnerStepFn
    init_actor_state: InitActorStateFn
    actor_params: ActorParamsFn
    set_hparams: SetHparamsFn | None = None
    sweepable: tuple[str, ...] = ()  # the agent config fields `set_hparams` accepts


def parameter_count(agent: Agent, env_spec: EnvSpec) -> int:
    """The weights the actors act with: the sizes of the arrays in `agent.actor_params` of a
    fresh learner state for `env_spec`, scalars left out (settings sent along with the weights,
    such as MuZero's acting temperature). Counted from shapes alone: nothing is initialised or
    compiled. The runners print it, so that widths resolved from the observations show."""
    params = jax.eval_shape(lambda key: agent.actor_params(agent.init(key, env_spec)),
                            jax.random.PRNGKey(0))
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params) if leaf.ndim)
