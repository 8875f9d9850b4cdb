"""PQN (Gallici et al., 2024) as the pure functions of `podracer.agent.Agent`: a Q-network with
LayerNorm trained without replay or target network on Q(lambda) targets of the runners'
trajectories (`learning.py`), acting epsilon-greedy like DQN (`agents.dqn`). docs/dqn.md
says what differs from the paper.
"""

from __future__ import annotations

import functools
from types import MappingProxyType

import jax.numpy as jnp
import ml_collections
import optax

from agents.actor_critic import validate_hidden_sizes
from agents.dqn import agent as dqn_agent
from agents.dqn import learning as dqn_learning
from agents.dqn import networks
from agents.hparams import annealed_clipped_adam, replace_hparams
from agents.pqn import learning
from agents.pqn.learning import LearnConfig, LearnerState
from podracer.agent import Agent
from podracer.config import check_numbers, require_discount, require_one_of
from podracer.types import Array, EnvSpec, PRNGKey

OPTIMIZER_HPARAMS = ("learning_rate", "adam_eps", "max_grad_norm")
LOSS_HPARAMS = ("discount", "lambda_", "reward_scale")
SWEEPABLE = OPTIMIZER_HPARAMS + LOSS_HPARAMS


def default_config() -> ml_collections.ConfigDict:
    """PQN's hyperparameters, one comment per field (values for small vector environments)."""
    c = ml_collections.ConfigDict()
    c.name = "pqn"  # the registered agent name
    c.torso = "auto"  # "auto" | "mlp" | "conv" | "board_conv"; "auto": conv on images >= 36 x 36
    c.hidden_sizes = (128, 128)  # dense layer sizes (MLP, board_conv); None: the default
    c.layer_norm = True  # LayerNorm before each ReLU (MLP, board_conv): PQN's stabiliser
    c.learning_rate = 1e-4  # Adam step size at the start
    # Learner steps over which the step size falls linearly to 0; 0 = constant. Configs tie
    # it to the run length with field references (as PPO's `anneal_lr_updates`).
    c.anneal_lr_updates = 0
    c.adam_eps = 1e-5  # Adam's epsilon
    c.max_grad_norm = 10.0  # each minibatch gradient is clipped to this global norm
    c.discount = 0.99  # gamma per agent step
    c.lambda_ = 0.65  # lambda of the Q(lambda) targets, in [0, 1]
    c.reward_scale = 1.0  # rewards are multiplied by it in the targets (Q in its units)
    c.num_epochs = 4  # passes over each trajectory batch
    c.num_minibatches = 4  # per epoch, per device; T x (environments per device) split evenly
    c.epsilon_start = 1.0  # exploration rate at the first learner step
    c.epsilon_end = 0.05  # exploration rate once annealed
    c.epsilon_anneal_steps = 200  # learner steps over which epsilon falls linearly; 0: end
    return c


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Global-norm clipping then Adam, the step size annealed linearly to 0 over
    `anneal_lr_updates` learner steps (of num_epochs x num_minibatches updates each; constant
    within a step), with its hyperparameters held in the optimiser state."""
    return annealed_clipped_adam(
        steps_per_update=config.num_epochs * config.num_minibatches,
        anneal_updates=int(config.anneal_lr_updates),
        **{name: float(config[name]) for name in OPTIMIZER_HPARAMS})


def set_hparams(learner_state: LearnerState, hparams: dict[str, Array]) -> LearnerState:
    """`learner_state` with the named hyperparameters (`SWEEPABLE`) replaced by `hparams`'
    values, which may be traced scalars."""
    return replace_hparams(learner_state, hparams, optimizer_hparams=OPTIMIZER_HPARAMS,
                           loss_hparams=LOSS_HPARAMS, agent_name="PQN")


# The number fields and what each must hold (`podracer.config.check_numbers`), with an example.
NUMBER_FIELDS = {"learning_rate": ("positive", 1e-4), "adam_eps": ("non_negative", 1e-5),
                 "max_grad_norm": ("positive", 10.0), "epsilon_start": ("fraction", 1.0),
                 "epsilon_end": ("fraction", 0.05), "reward_scale": ("positive", 1.0),
                 "lambda_": ("fraction", 0.65)}


def validate(config: ml_collections.ConfigDict) -> None:
    """Raises `ConfigError` naming the first field of a PQN config that cannot work."""
    require_one_of("agent.torso", config.torso, networks.TORSOS)
    require_discount(config.discount)
    validate_hidden_sizes(config.hidden_sizes)
    for field, minimum, example in (("num_epochs", 1, 4), ("num_minibatches", 1, 4),
                                    ("epsilon_anneal_steps", 0, 200),
                                    ("anneal_lr_updates", 0, 0)):
        dqn_agent.check_whole(config, field, minimum, example)
    check_numbers(config, "agent", NUMBER_FIELDS)


INTRODUCED = MappingProxyType({})


def choices(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> dict:
    return dqn_agent.choices(config, env_spec)


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the PQN agent for environments with one discrete action per step."""
    validate(config)
    network = networks.make_network(config, env_spec)
    optimizer = make_optimizer(config)
    learn = LearnConfig(num_epochs=config.num_epochs, num_minibatches=config.num_minibatches)
    loss_hparams = {k: float(config[k]) for k in LOSS_HPARAMS}

    def init(key: PRNGKey, spec: EnvSpec = env_spec) -> LearnerState:
        params = network.init(key, jnp.zeros((1,) + tuple(spec.observation.shape),
                                             spec.observation.dtype))
        return LearnerState(params=params, opt_state=optimizer.init(params),
                            steps=jnp.zeros((), jnp.int32),
                            hparams={k: jnp.asarray(v, jnp.float32)
                                     for k, v in loss_hparams.items()})

    schedule = {"start": float(config.epsilon_start), "end": float(config.epsilon_end),
                "anneal_steps": int(config.epsilon_anneal_steps)}
    return Agent(
        init=init,
        actor_step=functools.partial(dqn_learning.actor_step, network),
        learner_step=functools.partial(learning.learner_step, network, optimizer, learn),
        init_actor_state=lambda batch_size: (),
        actor_params=lambda state: {"network": state.params,
                                    "epsilon": dqn_learning.epsilon_at(state.steps,
                                                                       **schedule)},
        set_hparams=set_hparams,
        sweepable=SWEEPABLE,
    )
