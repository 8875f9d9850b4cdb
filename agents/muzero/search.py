"""MuZero's search: the learnt model as mctx's `root_fn` and `recurrent_fn`, and one search.

Acting searches from each observation (PUCT `muzero_policy` with Dirichlet noise at the root,
or `gumbel_muzero_policy`); Reanalyse searches again with the target network.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import mctx

from agents.muzero import targets as tgt
from agents.muzero.networks import MuZeroNetwork
from podracer.types import Array, Params, PRNGKey


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """The settings of one search: the agent config's fields of the same names (MuZero's
    `default_config` documents each), built once by `make_agent`."""

    search: str  # "muzero" (PUCT with Dirichlet noise) | "gumbel"
    num_simulations: int
    support_size: int  # S of the categorical value and reward heads
    discount: float  # the model's discount between search steps
    dirichlet_alpha: float  # PUCT
    dirichlet_fraction: float  # PUCT, acting (evaluation uses 0)
    temperature: float  # PUCT's acting temperature of the visit counts
    q_transform: str  # PUCT's value term: "parent_and_siblings" | "tree_min_max"
    unvisited_q: str  # PUCT: "min" | "parent_mean"
    max_num_considered_actions: int  # Gumbel
    gumbel_scale: float  # Gumbel, acting (evaluation uses 0)
    gumbel_value_scale: float = 0.1  # Gumbel: c_scale of sigma(q)
    gumbel_maxvisit_init: float = 50.0  # Gumbel: c_visit of sigma(q)
    gumbel_q_floor: float = 1e-8  # Gumbel: the least Q range q is normalised by (mctx's)
    mean_q_method: str = "walk"  # PUCT, unvisited_q="parent_mean": `mean_q`'s `method`


def value_to_scalar(logits: Array, support_size: int) -> Array:
    """[..., B] categorical logits on the h-transformed support (B evenly spaced points of
    [-S, S]) -> [...] scalar values."""
    return tgt.probs_to_scalar(jax.nn.softmax(logits), support_size)


def make_recurrent_fn(network: MuZeroNetwork, support_size: int, discount: float):
    """mctx's `recurrent_fn`: one step of the learnt model from `embedding` ([B, ...]) with
    `action` ([B]) -> (RecurrentFnOutput with [B] reward, discount, value and [B, A] prior
    logits, next embedding). Consumes no randomness."""

    def recurrent_fn(params, key, action, embedding):
        del key
        reward_logits, latent = network.apply(params, embedding, action, method="dynamics")
        prior_logits, value_logits = network.apply(params, latent, method="predict")
        # MuZero's model does not predict episode ends: it plans as if the episode went on,
        # and terminal states are handled by the value targets instead (the absorbing state
        # after a terminal is trained to value 0). With a terminal head the step's discount
        # is gamma (1 - P(end)), so a move the model expects to end the game is worth its
        # reward and little more.
        step_discount = jnp.full(action.shape, discount, jnp.float32)
        if network.terminal_head:
            end_logit = network.apply(params, latent, method="terminal_logit")
            step_discount = step_discount * jax.nn.sigmoid(-end_logit)
        output = mctx.RecurrentFnOutput(
            reward=value_to_scalar(reward_logits, support_size),
            discount=step_discount,
            prior_logits=prior_logits,
            value=value_to_scalar(value_logits, support_size),
        )
        return output, latent

    return recurrent_fn


def root_output(network: MuZeroNetwork, params: Params, observation: Array,
                support_size: int) -> mctx.RootFnOutput:
    """The search root of each observation `[B, ...]`: h(o), then f's prior and value."""
    latent = network.apply(params, observation, method="represent")
    prior_logits, value_logits = network.apply(params, latent, method="predict")
    return mctx.RootFnOutput(prior_logits=prior_logits,
                             value=value_to_scalar(value_logits, support_size),
                             embedding=latent)


def run_search(network: MuZeroNetwork, params: Params, observation: Array, key: PRNGKey,
               search_config: SearchConfig, *, evaluation: bool,
               temperature: Array | float | None = None) -> mctx.PolicyOutput:
    """One batched search from `observation` ([B, ...]) with `search_config`. `evaluation`
    turns the root noise off. `key` is consumed by mctx (root noise, Gumbel draws, action
    sampling). `temperature` (possibly traced; None: `search_config.temperature`) is the
    acting temperature of the visit counts."""
    root = root_output(network, params, observation, search_config.support_size)
    recurrent_fn = make_recurrent_fn(network, search_config.support_size,
                                     search_config.discount)
    return search_with(root, recurrent_fn, params, key, search_config, evaluation=evaluation,
                       temperature=temperature)


SEARCHES = ("muzero", "gumbel")
Q_TRANSFORMS = ("parent_and_siblings", "tree_min_max")
UNVISITED_Q = ("min", "parent_mean")
TREE_MIN_MAX_FLOOR = 0.01  # EfficientZero's `value_delta_max`
MEAN_Q_METHODS = ("walk", "jumps")  # how `mean_q` composes a node's path to the root


def _mean_q_maps(tree: mctx.Tree) -> tuple[Array, Array, Array]:
    """([N], [N], []) per node of an unbatched tree, its mean Q as an affine map of its
    parent's, m_i = a_i m_parent + b_i with a_i = 1 / (n_i + 1) and b_i = S_i a_i (S_i the sum
    and n_i the number of node i's visited children's Q = r + gamma v), and the root's mean
    (the mean of its visited children's Q, 0 when none is visited)."""
    visited = tree.children_visits > 0
    every_q = tree.children_rewards + tree.children_discounts * tree.children_values
    sums = jnp.sum(jnp.where(visited, every_q, 0.0), axis=-1)
    counts = jnp.sum(visited, axis=-1).astype(sums.dtype)
    root_mean = jnp.where(counts[0] > 0, sums[0] / jnp.maximum(counts[0], 1.0), 0.0)
    scale = 1.0 / (counts + 1.0)
    return scale, sums * scale, root_mean


def mean_q(tree: mctx.Tree, node_index: Array, method: str = "walk") -> Array:
    """[] EfficientZero's mean Q of a node (`core/ctree/cnode.cpp: get_mean_q`), for one
    unbatched tree: at the root, the mean of its visited children's Q = r + gamma v (0 when
    none is visited); below it, (mean Q of the parent + the sum of the visited children's
    Q) / (their number + 1), recursively along the path from the root.

    `method="walk"` composes the maps m_i = a_i m_parent + b_i (`_mean_q_maps`) in one walk up
    from the node to the root: a loop as many steps long as the node is deep, each step a few
    scalar reads. `"jumps"` composes every node's map with its ancestor's 2^k levels up
    (pointer jumping): ceil(log2(the tree's greatest possible depth)) rounds of whole-tree
    reads, with no loop whose length depends on the tree. On CPU the walk is the faster
    (docs/benchmarks.md); on a GPU, where each iteration of such a loop waits for the host
    and a search asks for a mean Q at every step down, the device check times both."""
    if method not in MEAN_Q_METHODS:
        raise ValueError(f"mean_q: method must be one of {MEAN_Q_METHODS}, got {method!r}")
    scale, offset, root_mean = _mean_q_maps(tree)
    if method == "walk":
        def up(carry):  # node -> its parent; the maps from here down composed
            node, product, total = carry
            return tree.parents[node], product * scale[node], total + offset[node] * product

        _, product, total = jax.lax.while_loop(  # the root is node 0, every parent below its child
            lambda carry: carry[0] > 0, up,
            (jnp.asarray(node_index, jnp.int32), jnp.ones((), scale.dtype),
             jnp.zeros((), scale.dtype)))
        return total + root_mean * product
    num_nodes = tree.parents.shape[-1]
    is_root = jnp.arange(num_nodes) == 0
    # m_i = a_i m_(jump_i) + b_i; the root's map is the constant one to its mean.
    a, b = jnp.where(is_root, 0.0, scale), jnp.where(is_root, root_mean, offset)
    jump = jnp.where(is_root, 0, jnp.maximum(tree.parents, 0))  # unexpanded nodes: -1
    for _ in range(max(num_nodes - 2, 0).bit_length()):  # 2^rounds >= the deepest depth
        a, b, jump = a * a[jump], a * b[jump] + b, jump[jump]
    return a[node_index] * root_mean + b[node_index]


def visited_q_bounds(tree: mctx.Tree) -> tuple[Array, Array]:
    """([], []) the minimum and maximum Q = r + gamma v over every visited edge of an
    unbatched tree (inf and -inf before any edge is visited): the range `tree_min_max`
    normalises by."""
    visited = tree.children_visits > 0
    every_q = tree.children_rewards + tree.children_discounts * tree.children_values
    return (jnp.min(jnp.where(visited, every_q, jnp.inf)),
            jnp.max(jnp.where(visited, every_q, -jnp.inf)))


def qtransform(tree: mctx.Tree, node_index: Array, *, scope: str = "parent_and_siblings",
               unvisited: str = "min", floor: float = TREE_MIN_MAX_FLOOR,
               mean_q_method: str = "walk") -> Array:
    """[A] PUCT's value term of the children of `node_index` in an unbatched mctx tree,
    in [0, 1].

    `scope="parent_and_siblings"` with `unvisited="min"` is mctx's
    `qtransform_by_parent_and_siblings` itself. `scope="tree_min_max"` normalises by the
    minimum and maximum Q = r + gamma v over every visited edge of the tree, dividing by
    max(max - min, `floor`) when max > min and leaving Q as it is otherwise, then clipping
    to [0, 1] (EfficientZero's `CMinMaxStats::normalize` and `cucb_score`; MuZero's
    pseudocode without the floor). `unvisited="parent_mean"` gives unvisited children the
    node's `mean_q` (EfficientZero, computed by `mean_q_method`) instead of the minimum.
    """
    if scope == "parent_and_siblings" and unvisited == "min":
        return mctx.qtransform_by_parent_and_siblings(tree, node_index)
    qvalues = tree.qvalues(node_index)
    visits = tree.children_visits[node_index]
    if scope == "tree_min_max":
        low, high = visited_q_bounds(tree)
        completed = jnp.where(visits > 0, qvalues, mean_q(tree, node_index, mean_q_method)
                              if unvisited == "parent_mean" else low)
        spread = high - low
        normalised = jnp.where(spread > 0, (completed - low) / jnp.maximum(spread, floor),
                               completed)
        if unvisited == "min":  # 0, also before the tree has a range
            normalised = jnp.where(visits > 0, normalised, 0.0)
        return jnp.clip(normalised, 0.0, 1.0)
    node_value = tree.node_values[node_index]
    safe = jnp.where(visits > 0, qvalues, node_value)
    low = jnp.minimum(node_value, jnp.min(safe))
    high = jnp.maximum(node_value, jnp.max(safe))
    completed = jnp.where(visits > 0, qvalues, mean_q(tree, node_index, mean_q_method))
    return jnp.clip((completed - low) / jnp.maximum(high - low, 1e-8), 0.0, 1.0)


def search_with(root: mctx.RootFnOutput, recurrent_fn, params: Params, key: PRNGKey,
                search_config: SearchConfig, *, evaluation: bool,
                temperature: Array | float | None = None) -> mctx.PolicyOutput:
    """The search `search_config.search` from `root` with the model `recurrent_fn` (any
    agent's: MuZero's, or EfficientZero's with its value prefix); see `run_search`. PUCT's
    value term is `qtransform` with `search_config.q_transform` and `.unvisited_q`;
    `temperature` (possibly traced; None: `search_config.temperature`) is the acting
    temperature of the visit counts. Gumbel's Q transform is mctx's
    `qtransform_completed_by_mix_value`: the mixed value completes unvisited children and Q
    is min-max normalised over the node's completed Q, dividing by at least
    `search_config.gumbel_q_floor` (so the scale of rewards changes sigma only where the
    children's Q differ by less than the floor), at `search_config.gumbel_value_scale` and
    `.gumbel_maxvisit_init`."""
    if search_config.search == "gumbel":
        return mctx.gumbel_muzero_policy(
            params, key, root, recurrent_fn,
            num_simulations=search_config.num_simulations,
            max_num_considered_actions=search_config.max_num_considered_actions,
            gumbel_scale=0.0 if evaluation else search_config.gumbel_scale,
            qtransform=functools.partial(
                mctx.qtransform_completed_by_mix_value,
                value_scale=search_config.gumbel_value_scale,
                maxvisit_init=search_config.gumbel_maxvisit_init,
                epsilon=search_config.gumbel_q_floor),
        )
    return mctx.muzero_policy(
        params, key, root, recurrent_fn,
        num_simulations=search_config.num_simulations,
        dirichlet_fraction=0.0 if evaluation else search_config.dirichlet_fraction,
        dirichlet_alpha=search_config.dirichlet_alpha,
        temperature=search_config.temperature if temperature is None else temperature,
        qtransform=functools.partial(qtransform, scope=search_config.q_transform,
                                     unvisited=search_config.unvisited_q,
                                     mean_q_method=search_config.mean_q_method),
    )
