"""The PPO agent (Schulman et al., 2017) as the pure functions of `podracer.agent.Agent`: the
config, the optimiser, and `make_agent`, which assembles the network (`networks.py`) and the
acting and learning functions (`learning.py`, on the losses of `losses.py`).

One `learner_step` is one PPO iteration on a `[T+1, B]` trajectory:

    # TARGETS, once, with the parameters theta_0 the step starts from
    advantages A, value targets R (GAE(lambda); "corrected": truncated importance ratios)
    A <- (A - mean) / std over the real transitions of the global batch (pmean over devices)
    # OPTIMISE
    repeat num_epochs times (lax.scan), each with a fresh permutation from the learner's key:
        repeat num_minibatches times (lax.scan):
            gradient of  clipped surrogate + value_cost * value loss - entropy_cost * entropy
            pmean'd over devices, clipped to max_grad_norm, Adam at the annealed rate

Off-policy data. Under Anakin the rollout is on-policy: the actor used theta_0. Under
Sebulba with a policy lag the actor's policy mu is older than theta_0; `off_policy` says what
to do (docs/ppo.md):
  - "plain": PPO as if on-policy: the ratio's denominator is mu (the actor's log-probability,
    kept in the trajectory), the advantages are GAE on the actor's value estimates. With lag 0
    this is exactly the on-policy algorithm.
  - "corrected": the ratio's denominator is pi_0 = pi_theta_0, recomputed by the learner; the
    advantages are GAE with V-trace's truncated traces min(1, pi_0/mu), the value targets
    V-trace's, and each sample's surrogate is weighted by min(rho_bar, pi_0/mu) (decoupled
    PPO). With pi_0 = mu every correction is 1 and this is again the on-policy algorithm.
The metric `first_ratio_deviation` is max |r - 1| over the first minibatch of the first epoch,
before any update: 0 up to float rounding whenever the data is on-policy for the ratio.
"""

from __future__ import annotations

import functools
from types import MappingProxyType

import ml_collections
import optax
from ml_collections import config_dict

from agents import popart
from agents.actor_critic import (
    ADVANTAGE_NORMALIZATIONS,
    LearnerState,
    chosen_fields,
    init_learner_state,
    validate_hidden_sizes,
)
from agents.hparams import annealed_clipped_adam, replace_hparams
from agents.popart import PopArtLearnerState, PopArtStats
from agents.ppo import learning, networks
from podracer.agent import Agent
from podracer.config import (ConfigError, check_numbers, require_discount, require_fraction,
                              require_one_of)
from podracer.types import Array, EnvSpec

OPTIMIZER_HPARAMS = ("learning_rate", "adam_eps", "max_grad_norm")
LOSS_HPARAMS = ("discount", "gae_lambda", "clip_eps", "value_clip_eps", "value_cost",
                "entropy_cost", "gaussian_entropy_cost", "clip_rho_threshold")
SWEEPABLE = OPTIMIZER_HPARAMS + LOSS_HPARAMS
OFF_POLICY = ("plain", "corrected")


def default_config() -> ml_collections.ConfigDict:
    """PPO's hyperparameters, one comment per field (PPO's usual Atari/classic values). Why
    each default is what it is: docs/results.md#ppo-defaults."""
    c = ml_collections.ConfigDict()
    c.name = "ppo"  # the registered agent name
    c.torso = "auto"  # "auto" | "mlp" | "conv" | "resnet"; "auto": conv on images >= 36 x 36
    # The MLP torso (policy and value MLPs each): layer sizes, and "tanh" | "relu". None: left
    # to the observations, 2 x 64 tanh for vectors and 2-D arrays, 2 x 256 ReLU for images read
    # flattened (MinAtar's boards; `networks.mlp_activation`).
    c.hidden_sizes = config_dict.placeholder(tuple)
    c.activation = config_dict.placeholder(str)
    c.learning_rate = 2.5e-4  # Adam step size at the start
    c.adam_eps = 1e-5  # Adam's epsilon
    c.max_grad_norm = 0.5  # each minibatch gradient is clipped to this global norm
    # True: the optimiser steps every parameter as one vector (`optax.flatten`), the same
    # update in a handful of kernels rather than a few per parameter array; False: per array
    c.flat_optimizer = True
    # Learner steps over which the step size falls linearly to 0 (constant within a step);
    # 0 = constant. Configs tie it to the run length with field references.
    c.anneal_lr_updates = 0
    c.num_epochs = 4  # passes over each trajectory batch
    c.num_minibatches = 4  # per epoch, per device; must divide T x (environments per device)
    c.discount = 0.99  # gamma per agent step
    c.gae_lambda = 0.95  # lambda of GAE(lambda), in [0, 1]
    c.clip_eps = 0.2  # the surrogate's ratio is clipped to [1 - eps, 1 + eps]
    c.value_clip_eps = 0.2  # the value may move this far from the old value; 0 = no clipping
    c.value_cost = 0.5  # weight of the value loss
    c.entropy_cost = 0.01  # the entropy bonus of a categorical policy (discrete actions)
    # ... and of a Gaussian policy (continuous actions), whose differential entropy has no upper
    # bound; 0 is the usual continuous-control setting
    c.gaussian_entropy_cost = 0.0
    # "none": the advantages in value units, divided by PopArt's sigma (as V-trace's); "batch":
    # to mean 0, std 1 over the global batch (every device and process)
    c.advantage_normalization = "none"
    # PopArt value normalisation (agents/popart.py; docs/ppo.md): the value head learns
    # targets scaled to about unit size, so that value_clip_eps and the value loss's weight
    # mean the same whatever the rewards' scale.
    c.popart = True
    c.popart_step_size = 1e-3  # beta of the statistics' exponential averages, in (0, 1]
    # True: the statistics' step at update n is max(beta, 1/(n+1)), their plain average until
    # 1/beta updates, then the exponential one (`agents.popart.step_size_at`); False: beta.
    c.popart_average_first = False
    c.off_policy = "plain"  # stale data (Sebulba, lag > 0): "plain" | "corrected" (docs/ppo.md)
    c.clip_rho_threshold = 1.0  # "corrected": rho-bar, the cap on the weights pi_0/mu
    c.unroll_updates = False  # unroll the epoch/minibatch scans (conv nets on CPU: docs/ppo.md)
    return c


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Global-norm clipping then Adam, the step size annealed linearly to 0 over
    `anneal_lr_updates` learner steps (of num_epochs x num_minibatches optimiser steps each),
    with learning rate, epsilon and clipping norm held in the optimiser state; over the
    parameters raveled into one vector when `flat_optimizer` (the same maths: Adam is
    elementwise, and the clipping norm is the norm of that vector)."""
    return annealed_clipped_adam(
        steps_per_update=config.num_epochs * config.num_minibatches,
        anneal_updates=int(config.anneal_lr_updates), flat=config.flat_optimizer,
        **{name: float(config[name]) for name in OPTIMIZER_HPARAMS})


def set_hparams(learner_state: LearnerState, hparams: dict[str, Array]) -> LearnerState:
    """`learner_state` with the named hyperparameters (fields of `default_config()` listed in
    `SWEEPABLE`) replaced by `hparams`' values, which may be traced scalars."""
    return replace_hparams(learner_state, hparams, optimizer_hparams=OPTIMIZER_HPARAMS,
                           loss_hparams=LOSS_HPARAMS, agent_name="PPO")


# The number fields and what each must hold (`podracer.config.check_numbers`), with an example.
NUMBER_FIELDS = {"learning_rate": ("positive", 2.5e-4), "adam_eps": ("non_negative", 1e-5),
                 "max_grad_norm": ("positive", 0.5), "value_clip_eps": ("non_negative", 0.2),
                 "clip_rho_threshold": ("positive", 1.0), "value_cost": ("finite", 0.5),
                 "entropy_cost": ("finite", 0.01), "gaussian_entropy_cost": ("finite", 0.0),
                 "anneal_lr_updates": ("whole", 0), "clip_eps": ("positive", 0.2),
                 "num_epochs": ("count", 4), "num_minibatches": ("count", 4)}


def _check_config(config: ml_collections.ConfigDict) -> None:
    require_one_of("agent.off_policy", config.off_policy, OFF_POLICY)
    require_discount(config.discount)
    require_fraction("agent.gae_lambda", config.gae_lambda, 0.95)
    check_numbers(config, "agent", NUMBER_FIELDS)
    if config.activation is not None:
        require_one_of("agent.activation", config.activation, sorted(networks.ACTIVATIONS),
                       also=", or leave it None for the observations' default")
    validate_hidden_sizes(config.hidden_sizes)
    require_one_of("agent.advantage_normalization", config.advantage_normalization,
                   ADVANTAGE_NORMALIZATIONS)
    require_one_of("agent.torso", config.torso, networks.TORSOS)
    popart.check_config(config)
    if not isinstance(config.flat_optimizer, bool):
        raise ConfigError("agent.flat_optimizer", f"must be True or False, got "
                          f"{config.flat_optimizer!r}", "set --config.agent.flat_optimizer=True")


def learn_config(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> learning.LearnConfig:
    """The learner's static settings: `config`'s fields and what `env_spec` fixes."""
    return learning.LearnConfig(
        num_epochs=config.num_epochs, num_minibatches=config.num_minibatches,
        off_policy=config.off_policy, advantage_normalization=config.advantage_normalization,
        unroll_updates=bool(config.unroll_updates), continuous=networks.is_continuous(env_spec),
        observation_rank=len(env_spec.observation.shape), popart=config.popart,
        popart_step_size=float(config.popart_step_size),
        popart_average_first=bool(config.popart_average_first))


# Fields added after runs were made without them, each with the value under which the agent
# behaves as before (registered as `introduced`).
INTRODUCED = MappingProxyType({"popart_average_first": False, "flat_optimizer": False})


def choices(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> dict:
    """What the agent chose for its fields left to it (registered as `choices`): the torso,
    and the MLP's sizes and activation."""
    torso = networks.resolve_torso(config.torso, env_spec)
    fields = chosen_fields(torso, config.hidden_sizes, env_spec)
    if torso == "mlp" and config.activation is None:
        fields["activation"] = networks.mlp_activation(None, env_spec)
    return fields


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds the PPO agent for discrete or continuous ([D]-shaped) actions: `learning.py`'s
    functions bound to the network, optimiser and settings of `config`."""
    _check_config(config)
    network = networks.make_network(config, env_spec)
    optimizer = make_optimizer(config)
    learn = learn_config(config, env_spec)
    loss_hparams = {k: config[k] for k in LOSS_HPARAMS}

    def init(key, spec=env_spec):
        state = init_learner_state(network, optimizer, loss_hparams, key, spec)
        if learn.popart:
            return PopArtLearnerState(**dict(state.items()), popart=PopArtStats.init())
        return state

    return Agent(
        init=init,
        actor_step=functools.partial(learning.actor_step, network,
                                     continuous=learn.continuous),
        learner_step=functools.partial(learning.learner_step, network, optimizer, learn),
        init_actor_state=lambda batch_size: (),
        actor_params=lambda learner_state: learner_state.params,
        set_hparams=set_hparams,
        sweepable=SWEEPABLE,
    )
