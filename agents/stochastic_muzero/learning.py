"""Stochastic MuZero's learning: MuZero's learner (`agents.muzero.learning`) with this
package's unroll and chance loss.

    learner_update   MuZero's update, given o_0..o_K as inputs (the encoder reads each
                     transition), the afterstate unroll, the chance loss as its extra loss,
                     and Reanalyse through the stochastic search
    learner_step     insert a trajectory, then `updates_per_step` updates once ready
                     (MuZero's)

Static settings are the frozen `LearnConfig` (MuZero's and these), which `make_agent` builds
once from the agent's config.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from agents.muzero import learning as mz
from agents.stochastic_muzero import losses
from agents.stochastic_muzero import search as smz_search
from agents.stochastic_muzero.networks import StochasticMuZeroNetwork
from podracer import position_replay as pr
from podracer.types import Metrics, PRNGKey, Trajectory

METRIC_NAMES = ("afterstate_value_loss", "chance_loss", "commitment_loss",
                "chance_code_entropy")


@dataclasses.dataclass(frozen=True)
class LearnConfig:
    """The static settings of Stochastic MuZero's learner: MuZero's (`muzero`) and the agent
    config's fields of the same names (its `default_config` documents each)."""

    muzero: mz.LearnConfig
    prior_to_encoder: bool  # `chance_prior_to_encoder`
    rollout_length: int  # T of the trajectories


def learner_update(network: StochasticMuZeroNetwork, optimizer: optax.GradientTransformation,
                   replay: pr.PositionReplay, learn: LearnConfig, state: mz.LearnerState,
                   key: PRNGKey, *, history: int, axis_name: str | None
                   ) -> tuple[mz.LearnerState, Metrics]:
    """One Stochastic MuZero update: MuZero's (`agents.muzero.learning.learner_update`) on the
    afterstate unroll (`losses.unroll_model`) with `losses.chance_loss` added to each
    sample's loss, weighted by the state's `afterstate_value_cost`, `chance_cost` and
    `commitment_cost`."""
    base = learn.muzero
    k = base.unroll_steps
    hp = state.hparams

    def targets_fn(windows, key):
        search = functools.partial(_reanalyse_search, network, base)
        return mz.batch_targets(network, state.target_params, windows, key, base,
                                history=history, search=search), {}

    def inputs_fn(windows, key):  # o_0 .. o_K: the root and the encoder's transitions
        del key
        steps = jnp.broadcast_to(jnp.arange(k + 1), (base.batch_size, k + 1))
        return mz.observations_at(windows, history + steps, history=history)

    def unroll_fn(params, observations, actions):
        return losses.unroll_model(network, params, observations, actions)

    def extra_loss_fn(params, out, observations, windows, targets):
        del params, observations
        step_types = windows["step_type"][:, history:].astype(jnp.int32)
        chance_mask = jax.vmap(functools.partial(losses.transition_mask, num_unroll=k))(
            step_types)
        per_example = jax.vmap(functools.partial(
            losses.chance_loss, support_size=base.support_size,
            afterstate_value_cost=hp["afterstate_value_cost"], chance_cost=hp["chance_cost"],
            commitment_cost=hp["commitment_cost"],
            prior_to_encoder=learn.prior_to_encoder))(
                out.afterstate_value_logits, out.chance_logits, out.encodings, targets.value,
                targets.value_mask, chance_mask)
        metrics = {
            "afterstate_value_loss": jnp.mean(per_example.afterstate_value_loss) / max(k, 1),
            "chance_loss": jnp.mean(per_example.chance_loss) / max(k, 1),
            "commitment_loss": jnp.mean(per_example.commitment_loss) / max(k, 1),
            "chance_code_entropy": losses.code_entropy(out.codes, chance_mask),
        }
        return per_example.loss, metrics

    return mz.learner_update(network, optimizer, replay, base, state, key, history=history,
                             axis_name=axis_name, targets_fn=targets_fn, inputs_fn=inputs_fn,
                             unroll_fn=unroll_fn, extra_loss_fn=extra_loss_fn)


def _reanalyse_search(network, base: mz.LearnConfig, params, observation, key):
    return smz_search.run_search(network, params, observation, key, base.reanalyse_search,
                                 evaluation=False)


def learner_step(network: StochasticMuZeroNetwork, optimizer: optax.GradientTransformation,
                 replay: pr.PositionReplay, learn: LearnConfig, state: mz.LearnerState,
                 trajectory: Trajectory, key: PRNGKey, *, history: int, frames_once: bool,
                 metric_names: tuple[str, ...], axis_name: str | None
                 ) -> tuple[mz.LearnerState, Metrics]:
    """`Agent.learner_step`: the trajectory's timesteps into the replay, then MuZero's
    `learner_step` of `learner_update`s."""
    mz.check_trajectory(state, trajectory, rollout_length=learn.rollout_length)
    steps, sampleable = mz.to_replay_steps(trajectory, frames_once=frames_once,
                                           reward_scale=learn.muzero.reward_scale)
    update = lambda s, k: learner_update(network, optimizer, replay, learn, s, k,
                                         history=history, axis_name=axis_name)
    return mz.learner_step(update, replay, state, steps, sampleable, key,
                           updates_per_step=learn.muzero.updates_per_step,
                           min_replay_items=learn.muzero.min_replay_items,
                           metric_names=metric_names, axis_name=axis_name)
