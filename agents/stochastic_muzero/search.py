"""Stochastic MuZero's search: mctx's `stochastic_muzero_policy` on the learnt model.

Decision nodes (states) choose actions by PUCT with MuZero's value term (`qtransform` with
`q_transform` and `unvisited_q`, applied by mctx to the decision part of the tree); chance
nodes (afterstates) choose the outcome c maximising sigma(c) / (N(c) + 1) (mctx, as the
paper). The edge into an afterstate has reward 0 and discount 1; the edge out of it, on code
c, has g's reward and MuZero's discount (gamma (1 - P(end)) with a terminal head). Each
simulation expands one node, a state or an afterstate; mctx evaluates both recurrent
functions at every expansion and keeps the one the node's kind calls for.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import mctx

from agents.muzero.search import SearchConfig, qtransform, root_output, value_to_scalar
from agents.stochastic_muzero.networks import StochasticMuZeroNetwork
from podracer.types import Array, Params, PRNGKey


def make_decision_recurrent_fn(network: StochasticMuZeroNetwork, support_size: int):
    """mctx's `decision_recurrent_fn`: (params, key, action [B], state [B, ...]) ->
    (DecisionRecurrentFnOutput with sigma's logits [B, C] and Q [B], the afterstate)."""

    def decision_recurrent_fn(params, key, action, state):
        del key
        afterstate = network.apply(params, state, action, method="afterstate")
        chance_logits, q_logits = network.apply(params, afterstate,
                                                method="afterstate_predict")
        return mctx.DecisionRecurrentFnOutput(
            chance_logits=chance_logits,
            afterstate_value=value_to_scalar(q_logits, support_size)), afterstate

    return decision_recurrent_fn


def make_chance_recurrent_fn(network: StochasticMuZeroNetwork, support_size: int,
                             discount: float):
    """mctx's `chance_recurrent_fn`: (params, key, chance outcome [B] int, afterstate) ->
    (ChanceRecurrentFnOutput with f's prior [B, A] and value, g's reward and the step's
    discount, the next state)."""

    def chance_recurrent_fn(params, key, outcome, afterstate):
        del key
        code = jax.nn.one_hot(outcome, network.num_chance_outcomes)
        reward_logits, latent = network.apply(params, afterstate, code, method="dynamics")
        prior_logits, value_logits = network.apply(params, latent, method="predict")
        step_discount = jnp.full(outcome.shape, discount, jnp.float32)
        if network.terminal_head:  # gamma (1 - P(end)), as MuZero's search
            end_logit = network.apply(params, latent, method="terminal_logit")
            step_discount = step_discount * jax.nn.sigmoid(-end_logit)
        return mctx.ChanceRecurrentFnOutput(
            action_logits=prior_logits, value=value_to_scalar(value_logits, support_size),
            reward=value_to_scalar(reward_logits, support_size),
            discount=step_discount), latent

    return chance_recurrent_fn


def search_with(root: mctx.RootFnOutput, decision_fn, chance_fn, params: Params,
                key: PRNGKey, search_config: SearchConfig, *, evaluation: bool,
                temperature: Array | float | None = None) -> mctx.PolicyOutput:
    """`mctx.stochastic_muzero_policy` from `root` with the model's two recurrent functions:
    Dirichlet noise at the root when acting (`evaluation` turns it off), PUCT's value term
    `qtransform` with `search_config.q_transform` and `.unvisited_q`, and `temperature`
    (possibly traced; None: `search_config.temperature`) on the visit counts."""
    return mctx.stochastic_muzero_policy(
        params, key, root, decision_fn, chance_fn,
        num_simulations=search_config.num_simulations,
        dirichlet_fraction=0.0 if evaluation else float(search_config.dirichlet_fraction),
        dirichlet_alpha=float(search_config.dirichlet_alpha),
        temperature=search_config.temperature if temperature is None else temperature,
        qtransform=functools.partial(qtransform, scope=search_config.q_transform,
                                     unvisited=search_config.unvisited_q,
                                     mean_q_method=search_config.mean_q_method),
    )


def run_search(network: StochasticMuZeroNetwork, params: Params, observation: Array,
               key: PRNGKey, search_config: SearchConfig, *, evaluation: bool,
               temperature: Array | float | None = None) -> mctx.PolicyOutput:
    """One batched search from `observation` ([B, ...]): MuZero's root (h, then f), then
    `search_with` on the afterstate and chance functions. `search_config.search` must be
    "muzero" (PUCT: mctx has no Gumbel search over chance nodes)."""
    root = root_output(network, params, observation, search_config.support_size)
    return search_with(
        root, make_decision_recurrent_fn(network, search_config.support_size),
        make_chance_recurrent_fn(network, search_config.support_size, search_config.discount),
        params, key, search_config, evaluation=evaluation, temperature=temperature)
