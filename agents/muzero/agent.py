"""MuZero as the three pure functions of `podracer.agent.Agent`, assembled from the package's
pieces: networks (`networks.py`), search (`search.py`), targets (`targets.py`), losses
(`losses.py`) and the learner update (`learning.py`), on a replay of positions
(`podracer.position_replay`).

Acting runs an mctx search from each observation. `learner_step` appends the trajectory's new
timesteps to the replay, then performs `updates_per_step` updates (an explicit replay ratio,
so results do not depend on how fast the hardware is), each on positions sampled with
per-position priorities, unrolled K steps with n-step targets that reach across trajectory
edges.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import MappingProxyType

import jax
import jax.numpy as jnp
import ml_collections
import optax

from agents.actor_critic import validate_hidden_sizes
from agents.hparams import replace_hparams
from agents.muzero import learning
from agents.muzero.learning import LearnConfig, LearnerState
from agents.muzero.networks import KINDS, MuZeroNetwork, chosen_fields, make_network
from agents.muzero.search import Q_TRANSFORMS, SEARCHES, UNVISITED_Q, SearchConfig, run_search
from agents.muzero.targets import PAST_END_TARGETS
from podracer import position_replay as pr
from podracer import replay_loop
from podracer.agent import Agent
from podracer.config import (ConfigError, check_numbers, require_discount, require_one_of,
                              require_positive_number, require_whole)
from podracer.types import Array, EnvSpec, Metrics, PRNGKey, TimeStep, Trajectory

# Scalar hyperparameters held in the learner state as arrays, so that one compiled program
# can run several values side by side (`jax.vmap` over runs; see `set_hparams`). The
# optimiser's live in its state (`optax.inject_hyperparams`), the others in
# `LearnerState.hparams`.
OPTIMIZER_HPARAMS = ("learning_rate", "max_grad_norm", "weight_decay")
LOSS_HPARAMS = ("value_cost", "priority_exponent", "importance_exponent")
SWEEPABLE = OPTIMIZER_HPARAMS + LOSS_HPARAMS
METRIC_NAMES = ("loss", "value_loss", "policy_loss", "reward_loss", "grad_norm",
                "mean_priority", "importance_exponent")


# Fields added since the first release, each with the value under which the code behaves as it
# did before the field existed (registered as `introduced`): checkpoints made without the field
# resume at that value. Each value was read off the diff that added the field: None bins are
# the old 2S + 1; without the terminal head the loss adds 0 and the search's discount is
# unchanged; a gradient share of 1 is the full gradient; rewards times 1.0 are unchanged;
# the Gumbel search passed mctx's defaults of its Q transform (its floor, `epsilon`, 1e-8).
INTRODUCED = MappingProxyType({"support_bins": None, "terminal_head": False,
                               "terminal_head_gradient": 1.0, "reward_scale": 1.0,
                               "gumbel_value_scale": 0.1, "gumbel_maxvisit_init": 50.0,
                               "gumbel_q_floor": 1e-8})


def default_config() -> ml_collections.ConfigDict:
    """MuZero's hyperparameters, one comment per field. Why each default is what it is:
    docs/results.md#muzero-defaults."""
    c = ml_collections.ConfigDict()
    c.name = "muzero"  # the registered agent name
    # Networks.
    # "auto" | "mlp" | "conv_mlp" | "resnet" | "ez_resnet". "conv_mlp": one 3 x 3 convolution
    # (stride 1, `channels` filters) before the representation MLP. "auto": the resnet for
    # images of at least 36 x 36 pixels, conv_mlp for smaller [H, W, C] boards, the MLP for
    # vectors and boards without channels (`networks.resolve_network`).
    c.network = "auto"
    # The MLP latent width, and the hidden layers of the MLP nets and of every head. None: 128
    # for boards the MLP reads flattened (MinAtar's), 64 otherwise (`networks.mlp_widths`).
    c.latent_size = None
    c.hidden_sizes = None
    c.channels = 32  # the resnet's latent channels; conv_mlp's filters
    c.num_blocks = 2  # resnet blocks in each of h, g and f
    c.support_size = 10  # categorical value/reward support: [-S, S] after h(x)
    c.support_bins = None  # bins of that support, evenly spaced; None: 2S + 1, one per integer
    # Search.
    c.search = "muzero"  # "muzero" (PUCT + Dirichlet noise) | "gumbel" (Gumbel MuZero)
    c.num_simulations = 16  # simulations per search
    c.dirichlet_alpha = 0.3  # alpha of the Dirichlet noise on the root's prior (PUCT search)
    c.dirichlet_fraction = 0.25  # share of that noise in the root's prior, in [0, 1]
    c.temperature = 1.0  # visit-count temperature for acting (PUCT search)
    # Learner updates over which acting follows the MuZero paper's schedule: `temperature` for
    # the first half, 0.5 to three quarters, then 0.25 (sent to the actors with the
    # parameters). 0: `temperature` throughout.
    c.temperature_decay_updates = 8000
    # PUCT's value term: "parent_and_siblings" (mctx's default: min-max over the node's value
    # and its children's Q) or "tree_min_max" (min-max over every visited edge of the tree,
    # with a floor of 0.01 on the range, as EfficientZero's reference and MuZero's
    # pseudocode, whose unvisited children score 0 as with unvisited_q="min" below).
    c.q_transform = "tree_min_max"
    # The Q of an unvisited child in PUCT: "min" (mctx: the lowest, 0 after normalising) or
    # "parent_mean" (EfficientZero: the mean Q of the parent's visited children and its
    # parent's, normalised like the others).
    c.unvisited_q = "parent_mean"
    c.max_num_considered_actions = 16  # Gumbel search: m, the actions sampled at the root
    c.gumbel_scale = 1.0  # Gumbel search, acting (evaluation uses 0)
    # Gumbel search's sigma(q) = (gumbel_maxvisit_init + max_b N(b)) gumbel_value_scale q on
    # min-max normalised completed Q (the paper's c_visit and c_scale; mctx's defaults).
    c.gumbel_value_scale = 0.1
    c.gumbel_maxvisit_init = 50.0
    # The least range of completed Q that sigma's min-max normalisation divides by, in units
    # of value: Q gaps smaller than this do not take sigma's full scale (mctx's own is 1e-8,
    # so any gap between two actions does). docs/gumbel_muzero.md#sigmas-floor says why.
    c.gumbel_q_floor = 0.1
    # Learning.
    c.discount = 0.97  # gamma per agent step
    c.unroll_steps = 5  # K: model steps unrolled from each sampled position
    c.td_steps = 5  # n of the n-step value targets, in agent steps
    c.batch_size = 256  # sampled positions per update (per device)
    c.updates_per_step = 4  # updates per inserted trajectory: the replay ratio
    c.learning_rate = 3e-3  # AdamW step size
    c.max_grad_norm = 5.0  # gradients are clipped to this global norm
    c.weight_decay = 1e-4  # AdamW's decoupled weight decay
    c.value_cost = 1.0  # weight of the value loss
    c.target_update_interval = 100  # updates between target-network copies
    c.reanalyse_fraction = 0.0  # share of each batch whose policy targets are searched afresh
    # Reanalysed bootstrap values: "target_network" (the target network's value, as MuZero
    # Reanalyse and EfficientZero's reference) or "root" (the root value of a fresh search).
    c.reanalyse_value = "target_network"
    # Targets at and past a true terminal: "absorbing" (value 0, reward 0 and a uniform policy
    # trained at and after it) or "masked" (EfficientZero's reference: the terminal's value 0
    # and reward are trained, its policy and everything after it are not).
    c.past_end_targets = "absorbing"
    # A terminal head on the dynamics: the model also predicts whether each step ends the
    # episode (a logistic head on g's next latent, trained by cross-entropy on the unroll's
    # true terminals, and the absorbing steps after them), and the search discounts a step by
    # gamma (1 - P(end)), as the continuation predictors of world models. False: MuZero's
    # model, which plans as if every episode went on.
    c.terminal_head = True
    # With the head: the share of its loss's gradient that also trains h and g through the
    # latent it reads (1.0 all; 0.0 none: a readout of a stop-gradient latent; the head itself
    # always trains in full).
    c.terminal_head_gradient = 1.0
    # Rewards are multiplied by this as they enter the replay, so the model's rewards and
    # values, and every target, are in scaled units; the search normalises Q by its min-max
    # range (tree_min_max: with a floor of 0.01 on it) and the runner's episode returns are
    # the environment's.
    c.reward_scale = 1.0
    # "bootstrap": the target network evaluates only the observations targets bootstrap
    # from; "window": all K + n + 1 of each sample (for benchmarks).
    c.target_positions = "bootstrap"
    # Replay of positions (per device).
    # Positions (timesteps), stored as windows of rollout_length: 128 inserted batches at
    # Anakin's default 32 x 16.
    c.replay_capacity = 65536
    c.min_replay_items = 640  # no updates until this many positions can be sampled
    c.priority_exponent = 0.0  # alpha; 0 = uniform (the paper: 1)
    c.importance_exponent = 1.0  # beta at the start
    c.importance_anneal_updates = 0  # updates over which beta rises linearly to 1; 0: fixed
    c.rollout_length = 16  # T of the trajectories it receives (Anakin's default); experiments
    # tie it to the runner's: config.agent.rollout_length = config.get_ref("rollout_length")
    # Store stacked image observations ([H, W, C] uint8) as one frame per step, rebuilding
    # stacks when sampled: C times less replay memory. "auto" | "on" | "off"; "auto": on for
    # rank-3 uint8.
    c.store_frames_once = "auto"
    return c


def _clipped_adamw(learning_rate: float, max_grad_norm: float,
                   weight_decay: float) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(max_grad_norm),
                       optax.adamw(learning_rate, weight_decay=weight_decay))


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW, with its hyperparameters held in the optimiser state."""
    return optax.inject_hyperparams(_clipped_adamw)(
        **{name: float(config[name]) for name in OPTIMIZER_HPARAMS})


def set_hparams(learner_state: LearnerState, hparams: dict[str, Array]) -> LearnerState:
    """`learner_state` with the named hyperparameters (fields of `default_config()` listed in
    `SWEEPABLE`) replaced by `hparams`' values, which may be traced scalars."""
    return replace_hparams(learner_state, hparams, optimizer_hparams=OPTIMIZER_HPARAMS,
                           loss_hparams=LOSS_HPARAMS, agent_name="MuZero")


def stores_frames_once(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> bool:
    if config.store_frames_once == "auto":
        obs = env_spec.observation
        return len(obs.shape) == 3 and obs.dtype == jnp.uint8
    return config.store_frames_once == "on"


def choices(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> dict:
    """What MuZero and EfficientZero chose for their fields left to them (registered as
    `choices`): the network and widths (`networks.chosen_fields`), and whether "auto" stores
    frames once."""
    fields = chosen_fields(config, env_spec)
    if config.store_frames_once == "auto":
        fields["store_frames_once"] = "on" if stores_frames_once(config, env_spec) else "off"
    return fields


def make_replay(config: ml_collections.ConfigDict, env_spec: EnvSpec, *,
                extra_fields: dict | None = None) -> tuple[pr.PositionReplay, dict, int]:
    """The replay of positions for `config` (memory checked against the device before
    anything is allocated), an example of one stored timestep, and its history H.
    `extra_fields` ({name: jax.ShapeDtypeStruct}) are stored with each timestep too."""
    obs = env_spec.observation
    frames_once = stores_frames_once(config, env_spec)
    history = int(obs.shape[-1]) - 1 if frames_once else 0
    if frames_once:
        observation = {"frame": jax.ShapeDtypeStruct(tuple(obs.shape[:2]), obs.dtype),
                       "stack_restart": jax.ShapeDtypeStruct((), jnp.bool_)}
    else:
        observation = {"observation": jax.ShapeDtypeStruct(tuple(obs.shape), obs.dtype)}
    example = {
        **observation,
        "action": jax.ShapeDtypeStruct((), jnp.int32),
        "reward": jax.ShapeDtypeStruct((), jnp.float32),
        "discount": jax.ShapeDtypeStruct((), jnp.float32),
        "step_type": jax.ShapeDtypeStruct((), jnp.int8),
        "policy": jax.ShapeDtypeStruct((env_spec.action.num_values,), jnp.float32),
        **(extra_fields or {}),
    }
    period, lookahead = config.rollout_length, config.unroll_steps + config.td_steps
    windows = math.ceil(config.replay_capacity / period)
    needed = pr.position_replay_bytes(windows, example, period=period, lookahead=lookahead,
                                      history=history)
    replay_loop.check_memory(needed, capacity=config.replay_capacity,
                             field="agent.replay_capacity", unit="positions",
                             allocated=windows * period)
    replay = pr.make_position_replay(windows, period=period, lookahead=lookahead,
                                     history=history)
    return replay, example, history


def search_config(config: ml_collections.ConfigDict) -> SearchConfig:
    """The search's settings: `config`'s fields of the same names."""
    return SearchConfig(
        search=config.search, num_simulations=config.num_simulations,
        support_size=config.support_size, discount=config.discount,
        dirichlet_alpha=config.dirichlet_alpha, dirichlet_fraction=config.dirichlet_fraction,
        temperature=config.temperature, q_transform=config.q_transform,
        unvisited_q=config.unvisited_q,
        max_num_considered_actions=config.max_num_considered_actions,
        gumbel_scale=config.gumbel_scale, gumbel_value_scale=float(config.gumbel_value_scale),
        gumbel_maxvisit_init=float(config.gumbel_maxvisit_init),
        gumbel_q_floor=float(config.gumbel_q_floor))


def learn_config(config: ml_collections.ConfigDict) -> LearnConfig:
    """The learner's static settings: `config`'s fields of the same names, and the search
    Reanalyse runs (`search_config`)."""
    return LearnConfig(
        unroll_steps=config.unroll_steps, td_steps=config.td_steps, discount=config.discount,
        support_size=config.support_size, batch_size=config.batch_size,
        target_positions=config.target_positions,
        reanalyse_fraction=config.reanalyse_fraction, reanalyse_value=config.reanalyse_value,
        past_end_targets=config.past_end_targets, reward_scale=float(config.reward_scale),
        importance_anneal_updates=config.importance_anneal_updates,
        target_update_interval=config.target_update_interval,
        updates_per_step=config.updates_per_step, min_replay_items=config.min_replay_items,
        reanalyse_search=search_config(config))


def temperature_at(updates: Array, *, decay_updates: int, temperature: float) -> Array:
    """[] float32 the acting temperature after `updates` learner updates: `temperature` for
    the first half of `decay_updates`, 0.5 to three quarters, then 0.25 (the MuZero paper's
    1 / 0.5 / 0.25 over 500K / 750K of its 1M training steps; EfficientZero's reference), or
    `temperature` throughout when `decay_updates` is 0."""
    if decay_updates <= 0:
        return jnp.asarray(temperature, jnp.float32)
    fraction = updates.astype(jnp.float32) / decay_updates
    return jnp.where(fraction < 0.5, temperature,
                     jnp.where(fraction < 0.75, 0.5, 0.25)).astype(jnp.float32)


def make_actor_params(config: ml_collections.ConfigDict) -> Callable[[LearnerState], dict]:
    """`Agent.actor_params` of a searching agent: the network's parameters and the acting
    temperature in force (`temperature_at`)."""
    schedule = {"decay_updates": config.temperature_decay_updates,
                "temperature": config.temperature}
    return lambda state: {"network": state.params,
                          "temperature": temperature_at(state.updates, **schedule)}


def make_actor_step(search, *, kind: str = "muzero"):
    """`Agent.actor_step` of a searching agent: `search(params, observation, key, evaluation)`
    -> `mctx.PolicyOutput` of the search `kind` (`SearchConfig.search`); ships the search's
    `action_weights` as the policy target and acts by the search's action: PUCT's is sampled
    from the visit counts (its most visited one when evaluating); Gumbel's is the one
    Sequential Halving keeps, the argmax of g + logits + sigma(q) over the most visited
    actions (with g = 0 when evaluating, as the search then draws no Gumbel noise), which
    the argmax of `action_weights` is not: that one ranges over every action, unvisited ones
    included."""

    def actor_step(params, actor_state, timestep: TimeStep, key: PRNGKey, *, evaluation=False):
        out = search(params, timestep.observation, key, evaluation)
        most_visited = evaluation and kind != "gumbel"
        action = jnp.argmax(out.action_weights, -1) if most_visited else out.action
        return action.astype(jnp.int32), actor_state, {"policy": out.action_weights}

    return actor_step


def init_learner_state(network, optimizer: optax.GradientTransformation,
                       replay: pr.PositionReplay, example_step: dict,
                       loss_hparams: dict[str, float], key: PRNGKey, spec: EnvSpec
                       ) -> LearnerState:
    """`Agent.init`: parameters from `network.init(key, observation, action)`, their target
    copy, the optimiser state, an empty replay and the loss's hyperparameters as arrays."""
    dummy_obs = jnp.zeros((1,) + tuple(spec.observation.shape), spec.observation.dtype)
    params = network.init(key, dummy_obs, jnp.zeros((1,), jnp.int32))
    return LearnerState(
        params=params,
        target_params=params,
        opt_state=optimizer.init(params),
        replay=replay.init(jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), example_step)),
        updates=jnp.zeros((), jnp.int32),
        hparams={k: jnp.asarray(v, jnp.float32) for k, v in loss_hparams.items()},
    )


def check_choices(config: ml_collections.ConfigDict, choices: dict[str, tuple]) -> None:
    """Raises `ConfigError` naming the first field of `choices` ({field: allowed values})
    whose value in `config` is not allowed."""
    for field, allowed in choices.items():
        require_one_of(f"agent.{field}", config[field], allowed)


# The number fields and what each must hold (`podracer.config.check_numbers`), with an example;
# the agents built on MuZero's config check them too.
NUMBER_FIELDS = {"batch_size": ("count", 256), "updates_per_step": ("count", 4),
                 "target_update_interval": ("count", 100), "replay_capacity": ("count", 65_536),
                 "unroll_steps": ("whole", 5), "min_replay_items": ("whole", 640),
                 "support_size": ("count", 10), "channels": ("count", 32),
                 "num_blocks": ("whole", 2), "max_num_considered_actions": ("count", 16),
                 "dirichlet_fraction": ("fraction", 0.25),
                 "reanalyse_fraction": ("fraction", 0.0), "dirichlet_alpha": ("positive", 0.3),
                 "temperature": ("non_negative", 1.0), "learning_rate": ("positive", 3e-3),
                 "max_grad_norm": ("positive", 5.0), "weight_decay": ("non_negative", 1e-4),
                 "gumbel_value_scale": ("positive", 0.1), "gumbel_scale": ("non_negative", 1.0),
                 "gumbel_maxvisit_init": ("non_negative", 50.0),
                 "priority_exponent": ("non_negative", 0.0),
                 "importance_exponent": ("non_negative", 1.0),
                 "importance_anneal_updates": ("whole", 0), "value_cost": ("finite", 1.0),
                 "temperature_decay_updates": ("whole", 8000)}


def validate(config: ml_collections.ConfigDict) -> None:
    """Raises `ConfigError` naming the first MuZero field that cannot work: a choice with an
    unknown value, a discount outside [0, 1], no simulations or no TD steps, a Gumbel Q floor
    that is not positive, a width below 1, a number field out of its range (`NUMBER_FIELDS`),
    a warm-up larger than the replay."""
    require_discount(config.discount)
    require_whole("agent.num_simulations", config.num_simulations, 1, 50)
    require_whole("agent.td_steps", config.td_steps, 1, 5)
    require_positive_number("agent.gumbel_q_floor", config.gumbel_q_floor, 0.1)
    check_numbers(config, "agent", NUMBER_FIELDS)
    period = config.rollout_length  # the replay holds whole windows of this many positions
    held = -(-config.replay_capacity // period) * period if period > 0 else None
    if held is not None and config.min_replay_items > held:
        raise ConfigError("agent.min_replay_items", f"is {config.min_replay_items}, more "
                          f"positions than each device's replay holds ({held}): the learner "
                          "would never start", "lower it, or raise agent.replay_capacity")
    check_choices(config, {"network": ("auto", *KINDS), "search": SEARCHES,
                           "q_transform": Q_TRANSFORMS,
                           "unvisited_q": UNVISITED_Q, "past_end_targets": PAST_END_TARGETS,
                           "reanalyse_value": ("target_network", "root"),
                           "target_positions": learning.TARGET_POSITIONS,
                           "store_frames_once": ("auto", "on", "off")})
    validate_hidden_sizes(config.hidden_sizes)
    if config.latent_size is not None:
        require_whole("agent.latent_size", config.latent_size, 1, 128,
                      fix="set e.g. --config.agent.latent_size=128, or leave it None for the "
                      "observations' default")
    if config.support_bins is not None:
        require_whole("agent.support_bins", config.support_bins, 2, 201,
                      fix="set e.g. --config.agent.support_bins=201 (steps of 0.1 for S = 10), "
                      "or leave it None for one bin per integer")
    require_positive_number("agent.reward_scale", config.reward_scale, 1.0,
                            fix="set e.g. --config.agent.reward_scale=1.0 (rewards as they are)")
    share = config.get("terminal_head_gradient", 1.0)
    if not isinstance(share, (int, float)) or not 0 <= share <= 1:  # (True, False: 1, 0)
        raise ConfigError("agent.terminal_head_gradient", f"must be in [0, 1], got {share!r}",
                          "set 1.0 (the head's whole gradient reaches h and g), 0.0 (none: a "
                          "readout) or a share between")


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the MuZero agent for environments with one discrete action per step: the search
    and `learning.py`'s functions bound to the network, optimiser, replay and settings of
    `config`."""
    validate(config)
    network: MuZeroNetwork = make_network(config, env_spec)
    optimizer = make_optimizer(config)
    replay, example_step, history = make_replay(config, env_spec)
    frames_once = stores_frames_once(config, env_spec)
    search_settings, learn = search_config(config), learn_config(config)
    rollout_length = config.rollout_length
    loss_hparams = {k: config[k] for k in LOSS_HPARAMS}
    metric_names = METRIC_NAMES + (("terminal_loss",) if config.terminal_head else ())

    search = lambda params, observation, key, evaluation: run_search(
        network, params["network"], observation, key, search_settings, evaluation=evaluation,
        temperature=params["temperature"])
    actor_step = make_actor_step(search, kind=config.search)
    init = lambda key, spec=env_spec: init_learner_state(
        network, optimizer, replay, example_step, loss_hparams, key, spec)

    def learner_step(state: LearnerState, trajectory: Trajectory, key: PRNGKey, *,
                     axis_name: str | None) -> tuple[LearnerState, Metrics]:
        learning.check_trajectory(state, trajectory, rollout_length=rollout_length)
        steps, sampleable = learning.to_replay_steps(trajectory, frames_once=frames_once,
                                                     reward_scale=learn.reward_scale)
        update = lambda s, k: learning.learner_update(network, optimizer, replay, learn, s, k,
                                                      history=history, axis_name=axis_name)
        return learning.learner_step(update, replay, state, steps, sampleable, key,
                                     updates_per_step=learn.updates_per_step,
                                     min_replay_items=learn.min_replay_items,
                                     metric_names=metric_names, axis_name=axis_name)

    return Agent(
        init=init,
        actor_step=actor_step,
        learner_step=learner_step,
        init_actor_state=lambda batch_size: (),
        actor_params=make_actor_params(config),
        set_hparams=set_hparams,
        sweepable=SWEEPABLE,
    )
