"""The DQN-family agent as the pure functions of `podracer.agent.Agent`: the config, the
optimiser, and `make_agent`, which assembles the Q-network (`networks.py`), the transition
replay (`podracer.transition_replay`) and the acting and learning functions (`learning.py`,
on the losses of `losses.py`).

Double DQN (van Hasselt et al., 2016) on n-step returns with a target network and
epsilon-greedy acting annealed over learner steps; `head="c51"` learns a categorical return
distribution instead (Bellemare et al., 2017); `priority_exponent > 0` samples by priority
(Schaul et al., 2016). The replay lives in the learner state, one per learner device; each
learner step inserts the trajectory and makes `replay_ratio` optimiser updates once `warmup`
positions can be sampled. docs/dqn.md says what differs from the papers.
"""

from __future__ import annotations

import functools
from types import MappingProxyType

import jax
import jax.numpy as jnp
import ml_collections
import optax

from agents.actor_critic import chosen_fields, validate_hidden_sizes
from agents.dqn import learning, networks
from agents.dqn.learning import LearnConfig, LearnerState
from agents.hparams import annealed_clipped_adam, replace_hparams
from podracer import replay_loop
from podracer import transition_replay as tr
from podracer.agent import Agent
from podracer.config import (ConfigError, check_numbers, require_discount, require_one_of,
                              require_whole)
from podracer.types import Array, EnvSpec, Metrics, PRNGKey, Trajectory

OPTIMIZER_HPARAMS = ("learning_rate", "adam_eps", "max_grad_norm")
LOSS_HPARAMS = ("discount", "priority_exponent", "importance_exponent")
SWEEPABLE = OPTIMIZER_HPARAMS + LOSS_HPARAMS


def default_config() -> ml_collections.ConfigDict:
    """The DQN family's hyperparameters, one comment per field (values for small vector
    environments; docs/dqn.md)."""
    c = ml_collections.ConfigDict()
    c.name = "dqn"  # the registered agent name
    c.torso = "auto"  # "auto" | "mlp" | "conv" | "board_conv"; "auto": conv on images >= 36 x 36
    c.hidden_sizes = (128, 128)  # dense layer sizes (MLP, board_conv); None: the default
    c.layer_norm = False  # LayerNorm before each ReLU of the MLP and board_conv torsos
    c.head = "q"  # "q": one value per action; "c51": a categorical return distribution
    c.num_atoms = 51  # "c51": atoms of the support
    c.v_min = -10.0  # "c51": the smallest return of the support
    c.v_max = 10.0  # "c51": the largest return of the support
    c.double = True  # Double DQN's action selection by the online network; False: plain DQN
    c.learning_rate = 5e-4  # Adam step size at the start
    # Learner steps over which the step size falls linearly to 0; 0: constant. Configs tie it
    # to the run length with field references (as PQN's `anneal_lr_updates`).
    c.anneal_lr_updates = 0
    c.adam_eps = 1e-5  # Adam's epsilon
    c.max_grad_norm = 10.0  # each update's gradient is clipped to this global norm
    c.huber_delta = 1.0  # the TD loss is Huber with this delta; 0: squared error / 2
    c.discount = 0.99  # gamma per agent step
    c.n_step = 3  # n of the n-step returns, in agent steps (1: one-step Q-learning)
    c.batch_size = 128  # sampled positions per optimiser update, per learner device
    c.replay_ratio = 1  # optimiser updates per learner step, once warmed up
    c.warmup = 1_000  # no updates until every device's replay can sample this many positions
    c.replay_capacity = 100_000  # timesteps held per learner device
    # alpha; 0 = uniform sampling, drawn without reading the priorities, and then alpha and
    # beta cannot be swept (prioritised replay: 0.6)
    c.priority_exponent = 0.0
    c.importance_exponent = 0.4  # beta of the importance weights (used when alpha > 0)
    c.target_update_interval = 100  # optimiser updates between copies into the target net
    c.epsilon_start = 1.0  # exploration rate at the first learner step
    c.epsilon_end = 0.05  # exploration rate once annealed
    c.epsilon_anneal_steps = 1_000  # learner steps over which epsilon falls linearly; 0: end
    return c


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Global-norm clipping then Adam, with its hyperparameters held in the optimiser state;
    the step size annealed linearly to 0 over `anneal_lr_updates` learner steps (of
    `replay_ratio` updates each) when that is above 0. Without an anneal the optimiser state
    has no schedule count, as before the field existed, so earlier checkpoints restore."""
    hparams = {name: float(config[name]) for name in OPTIMIZER_HPARAMS}
    if int(config.anneal_lr_updates) > 0:
        return annealed_clipped_adam(steps_per_update=int(config.replay_ratio),
                                     anneal_updates=int(config.anneal_lr_updates), **hparams)

    def clipped_adam(learning_rate, adam_eps, max_grad_norm):
        return optax.chain(optax.clip_by_global_norm(max_grad_norm),
                           optax.adam(learning_rate, eps=adam_eps))

    return optax.inject_hyperparams(clipped_adam)(**hparams)


def set_hparams(learner_state: LearnerState, hparams: dict[str, Array]) -> LearnerState:
    """`learner_state` with the named hyperparameters (fields of `default_config()` listed in
    `SWEEPABLE`) replaced by `hparams`' values, which may be traced scalars."""
    return replace_hparams(learner_state, hparams, optimizer_hparams=OPTIMIZER_HPARAMS,
                           loss_hparams=LOSS_HPARAMS, agent_name="DQN")


def check_whole(config: ml_collections.ConfigDict, field: str, minimum: int,
                example: int) -> None:
    """Raises `ConfigError` unless `agent.<field>` is a whole number >= `minimum`."""
    require_whole(f"agent.{field}", config[field], minimum, example)


# The number fields and what each must hold (`podracer.config.check_numbers`), with an example.
NUMBER_FIELDS = {"learning_rate": ("positive", 5e-4), "adam_eps": ("non_negative", 1e-5),
                 "max_grad_norm": ("positive", 10.0), "huber_delta": ("positive", 1.0),
                 "priority_exponent": ("non_negative", 0.0),
                 "importance_exponent": ("non_negative", 0.4), "v_min": ("finite", -10.0),
                 "v_max": ("finite", 10.0), "epsilon_start": ("fraction", 1.0),
                 "epsilon_end": ("fraction", 0.05)}


def validate(config: ml_collections.ConfigDict) -> None:
    """Raises `ConfigError` naming the first field of a DQN config that cannot work."""
    require_one_of("agent.head", config.head, networks.HEADS)
    require_one_of("agent.torso", config.torso, networks.TORSOS)
    require_discount(config.discount)
    validate_hidden_sizes(config.hidden_sizes)
    for field, minimum, example in (("n_step", 1, 3), ("batch_size", 1, 128),
                                    ("replay_ratio", 1, 1), ("warmup", 0, 1000),
                                    ("replay_capacity", 1, 100_000),
                                    ("target_update_interval", 1, 100),
                                    ("epsilon_anneal_steps", 0, 1000), ("num_atoms", 2, 51),
                                    ("anneal_lr_updates", 0, 0)):
        check_whole(config, field, minimum, example)
    check_numbers(config, "agent", NUMBER_FIELDS)
    if config.head == "c51" and not config.v_min < config.v_max:
        raise ConfigError("agent.v_min", f"must be below agent.v_max ({config.v_min} >= "
                          f"{config.v_max})", "set e.g. v_min=-10, v_max=10")
    if config.warmup < config.batch_size:
        raise ConfigError("agent.warmup", f"is {config.warmup}, fewer positions than one "
                          f"batch of {config.batch_size}",
                          f"set --config.agent.warmup={config.batch_size} or more")
    if config.warmup > config.replay_capacity:
        raise ConfigError("agent.warmup", f"is {config.warmup}, more than the replay holds "
                          f"({config.replay_capacity})", "lower it or raise replay_capacity")


def learn_config(config: ml_collections.ConfigDict) -> LearnConfig:
    """The learner's static settings: `config`'s fields of the same names."""
    return LearnConfig(n_step=config.n_step, batch_size=config.batch_size,
                       replay_ratio=config.replay_ratio, warmup=config.warmup,
                       target_update_interval=config.target_update_interval,
                       double=bool(config.double), head=config.head,
                       huber_delta=float(config.huber_delta),
                       uniform=float(config.priority_exponent) == 0.0)


def example_step(env_spec: EnvSpec) -> dict:
    """One stored timestep's fields (`learning.to_replay_steps`), as shapes."""
    obs = env_spec.observation
    return {"observation": jax.ShapeDtypeStruct(tuple(obs.shape), obs.dtype),
            "action": jax.ShapeDtypeStruct((), jnp.int32),
            "reward": jax.ShapeDtypeStruct((), jnp.float32),
            "discount": jax.ShapeDtypeStruct((), jnp.float32),
            "last": jax.ShapeDtypeStruct((), jnp.bool_)}


def make_replay(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> tr.TransitionReplay:
    """The transition replay of `config`, its memory checked against the device first."""
    needed = tr.transition_replay_bytes(config.replay_capacity, example_step(env_spec))
    replay_loop.check_memory(needed, capacity=config.replay_capacity,
                             field="agent.replay_capacity", unit="timesteps")
    return tr.make_transition_replay(config.replay_capacity, lookahead=config.n_step)


def check_trajectory(config: ml_collections.ConfigDict, trajectory: Trajectory) -> None:
    """Raises `ConfigError` when one position's lookahead over all B columns a device receives
    does not fit the replay."""
    b = trajectory.action.shape[1]
    if (config.n_step + 1) * b > config.replay_capacity:
        raise ConfigError("agent.replay_capacity",
                          f"holds {config.replay_capacity} timesteps, fewer than the n + 1 = "
                          f"{config.n_step + 1} steps of the {b} environments each learner "
                          "device receives", f"use at least {(config.n_step + 1) * b}")


# Fields added after runs were made without them (registered as `introduced`), each with the
# value under which the code behaves as it did before: a constant step size.
INTRODUCED = MappingProxyType({"anneal_lr_updates": 0})


def choices(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> dict:
    """What the agent chose for its fields left to it (registered as `choices`): the torso,
    and the MLP's sizes when left None."""
    return chosen_fields(networks.resolve_torso(config.torso, env_spec), config.hidden_sizes,
                         env_spec)


def make_actor_params(config: ml_collections.ConfigDict):
    """`Agent.actor_params`: the online parameters and the exploration rate in force."""
    schedule = {"start": float(config.epsilon_start), "end": float(config.epsilon_end),
                "anneal_steps": int(config.epsilon_anneal_steps)}
    return lambda state: {"network": state.params,
                          "epsilon": learning.epsilon_at(state.steps, **schedule)}


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the DQN agent for environments with one discrete action per step."""
    validate(config)
    network = networks.make_network(config, env_spec)
    optimizer = make_optimizer(config)
    replay = make_replay(config, env_spec)
    learn = learn_config(config)
    loss_hparams = {k: float(config[k]) for k in LOSS_HPARAMS}
    example = example_step(env_spec)

    def init(key: PRNGKey, spec: EnvSpec = env_spec) -> LearnerState:
        params = network.init(key, jnp.zeros((1,) + tuple(spec.observation.shape),
                                             spec.observation.dtype))
        return LearnerState(
            params=params, target_params=params, opt_state=optimizer.init(params),
            replay=replay.init(jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), example)),
            steps=jnp.zeros((), jnp.int32), updates=jnp.zeros((), jnp.int32),
            hparams={k: jnp.asarray(v, jnp.float32) for k, v in loss_hparams.items()})

    def learner_step(state: LearnerState, trajectory: Trajectory, key: PRNGKey, *,
                     axis_name: str | None) -> tuple[LearnerState, Metrics]:
        check_trajectory(config, trajectory)
        return learning.learner_step(network, optimizer, replay, learn, state, trajectory, key,
                                     axis_name=axis_name)

    return Agent(
        init=init,
        actor_step=functools.partial(learning.actor_step, network),
        learner_step=learner_step,
        init_actor_state=lambda batch_size: (),
        actor_params=make_actor_params(config),
        set_hparams=set_hparams,
        sweepable=sweepable(learn),
    )


def sweepable(learn: learning.LearnConfig) -> tuple[str, ...]:
    """`SWEEPABLE`, less alpha and beta when the config's alpha is 0: the learner then draws
    uniformly, compiled without reading them (the weights are 1 whatever beta is)."""
    if learn.uniform:
        return tuple(f for f in SWEEPABLE if f not in ("priority_exponent",
                                                         "importance_exponent"))
    return SWEEPABLE
