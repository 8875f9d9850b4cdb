"""Sampled MuZero (Hubert et al., 2021) for continuous actions [D] as the three pure functions
of `podracer.agent.Agent`, assembled from MuZero's pieces (replay of positions, value and
reward targets, unroll, learner update, acting schedule) and this package's additions:

    networks.py  a Gaussian policy head (mean, log standard deviation over pre-squash actions)
                 and dynamics reading the action vector tanh(u) in [-1, 1]^D
    search.py    K actions sampled at every node, carried in the node's embedding, mctx's
                 PUCT search over them with the prior (beta_hat / beta) pi
    learning.py  the root's K samples and visit distribution stored per position; the policy
                 loss -sum_k pi_hat_k log pi(u_k | s) over them, and an entropy bonus

Acting takes the root sample chosen from the visit counts (the most visited one when
evaluating), squashed by tanh and scaled to the action bounds.
"""

from __future__ import annotations

from types import MappingProxyType

import jax
import jax.numpy as jnp
import ml_collections

from agents import muzero
from agents.hparams import replace_hparams
from agents.muzero.learning import LearnerState
from agents.sampled_muzero import learning
from agents.sampled_muzero.networks import action_bounds, make_network, squash, to_env
from agents.sampled_muzero.search import root_samples, run_search
from podracer.agent import Agent
from podracer.config import ConfigError, check_numbers, require_positive_number, require_whole
from podracer.types import DiscreteSpec, EnvSpec, Metrics, PRNGKey, Trajectory

OPTIMIZER_HPARAMS = muzero.OPTIMIZER_HPARAMS
LOSS_HPARAMS = muzero.LOSS_HPARAMS + ("entropy_cost",)
SWEEPABLE = OPTIMIZER_HPARAMS + LOSS_HPARAMS
METRIC_NAMES = muzero.METRIC_NAMES + ("policy_entropy",)
# Fields added since the first release, with the value that behaves as the code did before:
# MuZero's (inherited).
INTRODUCED = MappingProxyType(dict(muzero.INTRODUCED))


def default_config() -> ml_collections.ConfigDict:
    """MuZero's fields (`agents.muzero.default_config`) and Sampled MuZero's, one comment
    each. Where they depart from the paper: docs/sampled_muzero.md."""
    c = muzero.default_config()
    c.name = "sampled_muzero"  # the registered agent name
    c.num_samples = 20  # K: actions sampled at every search node (the paper's continuous: 20)
    # tau of the sampling distribution beta = pi^(1/tau) (for the Gaussian, its variance
    # times tau); 1.0: beta = pi, the paper's main setting, whose prior is uniform over samples.
    c.sampling_temperature = 1.0
    # Bounds of the policy's log standard deviation in pre-squash units (the head's output
    # is clipped to them): keeps the Gaussian from collapsing onto one sample.
    c.log_std_min = -5.0
    c.log_std_max = 2.0
    # Entropy bonus: the policy loss minus this times the Gaussian's entropy (nats, u-space),
    # per unroll step. 0.0: none (the paper's loss).
    c.entropy_cost = 0.0
    c.num_simulations = 32  # simulations per search
    c.terminal_head = False  # no terminal head (MuZero's default has one; the paper's none)
    return c


def set_hparams(learner_state: LearnerState, hparams: dict) -> LearnerState:
    """`learner_state` with the named `SWEEPABLE` hyperparameters replaced by `hparams`'."""
    return replace_hparams(learner_state, hparams, optimizer_hparams=OPTIMIZER_HPARAMS,
                           loss_hparams=LOSS_HPARAMS, agent_name="Sampled MuZero")


def validate(config: ml_collections.ConfigDict) -> None:
    """Raises `ConfigError` naming the first field that cannot work: MuZero's checks, then
    Sampled MuZero's."""
    muzero.validate(config)
    if config.search != "muzero":
        raise ConfigError("agent.search", f"is {config.search!r}; Sampled MuZero searches "
                          "with PUCT over sampled actions",
                          "use 'muzero' (Gumbel search over sampled actions is not built)")
    if config.reanalyse_fraction != 0:
        raise ConfigError("agent.reanalyse_fraction", f"is {config.reanalyse_fraction}; "
                          "Reanalyse would need fresh samples stored with its policy targets",
                          "use 0.0")
    require_whole("agent.num_samples", config.num_samples, 1, 20,
                  fix="set e.g. --config.agent.num_samples=20 (the paper's)")
    require_positive_number("agent.sampling_temperature", config.sampling_temperature, 1.0,
                            fix="set 1.0 (beta = pi) or e.g. 2.0 (samples spread wider)")
    check_numbers(config, "agent", {"log_std_min": ("finite", -5.0),
                                    "log_std_max": ("finite", 2.0),
                                    "entropy_cost": ("non_negative", 0.0)})
    if not config.log_std_min < config.log_std_max:
        raise ConfigError("agent.log_std_min",
                          f"is {config.log_std_min}, not below log_std_max "
                          f"{config.log_std_max}", "set e.g. -5.0 and 2.0")


# What the agent chose for its fields left to it: MuZero's network, widths, frames once.
choices = muzero.choices


def sampling_settings(config: ml_collections.ConfigDict) -> dict:
    """`search.sample_actions`' keyword arguments from `config`."""
    return {"num_samples": int(config.num_samples),
            "temperature": float(config.sampling_temperature),
            "log_std_min": float(config.log_std_min),
            "log_std_max": float(config.log_std_max)}


def init_learner_state(network, optimizer, replay, example_step: dict, loss_hparams: dict,
                       key: PRNGKey, spec: EnvSpec) -> LearnerState:
    """MuZero's `init_learner_state` with a dummy action vector [1, D] for `network.init`."""
    dummy_obs = jnp.zeros((1,) + tuple(spec.observation.shape), spec.observation.dtype)
    params = network.init(key, dummy_obs, jnp.zeros((1,) + tuple(spec.action.shape)))
    return LearnerState(
        params=params, target_params=params, opt_state=optimizer.init(params),
        replay=replay.init(jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), example_step)),
        updates=jnp.zeros((), jnp.int32),
        hparams={k: jnp.asarray(v, jnp.float32) for k, v in loss_hparams.items()})


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """Builds Sampled MuZero for an environment with bounded continuous actions [D]."""
    validate(config)
    if isinstance(env_spec.action, DiscreteSpec):
        raise ConfigError("agent.name", "is 'sampled_muzero', which acts in continuous action "
                          "spaces [D] only, but the environment's actions are discrete",
                          "use 'muzero' or 'efficientzero' for discrete actions, or an "
                          "environment with continuous ones (e.g. Pendulum-v1)")
    low, high = (jnp.asarray(b, jnp.float32) for b in action_bounds(env_spec))
    network = make_network(config, env_spec)
    optimizer = muzero.make_optimizer(config)
    k, d = int(config.num_samples), int(env_spec.action.shape[0])
    # MuZero's replay for K "discrete actions" (the visit distribution "policy" [K]), with
    # the action stored as a vector [D] and the root's samples [K, D].
    replay, example_step, history = muzero.make_replay(
        config, EnvSpec(observation=env_spec.observation, action=DiscreteSpec(k)),
        extra_fields={"action": jax.ShapeDtypeStruct((d,), jnp.float32),
                      "samples": jax.ShapeDtypeStruct((k, d), jnp.float32)})
    frames_once = muzero.stores_frames_once(config, env_spec)
    search_settings, learn = muzero.search_config(config), muzero.learn_config(config)
    sampling = sampling_settings(config)
    rollout_length = config.rollout_length
    loss_hparams = {name: config[name] for name in LOSS_HPARAMS}
    metric_names = METRIC_NAMES + (("terminal_loss",) if config.terminal_head else ())
    log_std = {"log_std_min": float(config.log_std_min),
               "log_std_max": float(config.log_std_max)}

    def actor_step(params, actor_state, timestep, key, *, evaluation=False):
        out = run_search(network, params["network"], timestep.observation, key,
                         search_settings, sampling, evaluation=evaluation,
                         temperature=params["temperature"])
        index = jnp.argmax(out.action_weights, -1) if evaluation else out.action
        samples = root_samples(out)  # [B, K, D]
        u = jnp.take_along_axis(samples, index[:, None, None], axis=1)[:, 0]
        action = to_env(squash(u), low, high).astype(jnp.float32)
        return action, actor_state, {"policy": out.action_weights, "samples": samples}

    init = lambda key, spec=env_spec: init_learner_state(
        network, optimizer, replay, example_step, loss_hparams, key, spec)

    def learner_step(state: LearnerState, trajectory: Trajectory, key: PRNGKey, *,
                     axis_name: str | None) -> tuple[LearnerState, Metrics]:
        muzero.check_trajectory(state, trajectory, rollout_length=rollout_length)
        steps, sampleable = learning.to_replay_steps(
            trajectory, frames_once=frames_once, reward_scale=learn.reward_scale,
            low=low, high=high)
        update = lambda s, k: learning.learner_update(
            network, optimizer, replay, learn, s, k, history=history, axis_name=axis_name,
            **log_std)
        return muzero.learner_step(update, replay, state, steps, sampleable, key,
                                   updates_per_step=learn.updates_per_step,
                                   min_replay_items=learn.min_replay_items,
                                   metric_names=metric_names, axis_name=axis_name)

    return Agent(
        init=init,
        actor_step=actor_step,
        learner_step=learner_step,
        init_actor_state=lambda batch_size: (),
        actor_params=muzero.make_actor_params(config),
        set_hparams=set_hparams,
        sweepable=SWEEPABLE,
    )
