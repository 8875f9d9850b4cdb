"""What the probes (`experiments.probe_rewards`, `experiments.probe_latent`) share: the
network of a saved run, and where a MinAtar board's player is. No flags, so each probe can
import it."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import ml_collections

import envs_jax
from agents.muzero.networks import MuZeroNetwork, make_network, resolve_network
from envs_jax.base import Environment
from podracer.types import Array, EnvSpec


def saved_env(config: dict[str, Any]) -> tuple[Environment, int]:
    """The environment a saved run (its config.json, `config`) acted in, observations
    stacked as it ran them (`env.frame_stack`, 1 for runs made before it existed), and that
    stack's depth."""
    env = envs_jax.make(config["env"]["name"], **config["env"].get("kwargs", {}))
    frame_stack = int(config["env"].get("frame_stack", 1))
    if frame_stack > 1:
        env = envs_jax.FrameStack(env, frame_stack)
    return env, frame_stack


def newest_frame(observation: Array, frame_stack: int) -> Array:
    """The current observation's channels of a stack of `frame_stack` (newest last, as
    `envs_jax.FrameStack` builds it)."""
    return observation[..., observation.shape[-1] - observation.shape[-1] // frame_stack:]


def player_cell(observation: Array) -> tuple[Array, Array]:
    """(row, column) of the player on a MinAtar board [..., 10, 10, C] (row 0 the top): the
    one cell set in channel 0, which every gymnax MinAtar game gives the player (Asterix's
    player, Breakout's paddle, Freeway's chicken, Seaquest's submarine, SpaceInvaders'
    cannon); (0, 0) on a board without one."""
    cell = jnp.argmax(observation[..., 0].reshape(observation.shape[:-3] + (-1,)), axis=-1)
    return cell // observation.shape[-2], cell % observation.shape[-2]


def freeway_row(observation: Array) -> Array:
    """MinAtar Freeway's chicken row (0 top, 9 the bottom; the chicken stays in column 4)."""
    return player_cell(observation)[0]


def trained_network(agent_config: ml_collections.ConfigDict, env_spec: EnvSpec,
                    params) -> MuZeroNetwork:
    """MuZero's network (h, g and f) of a run of `agent_config` with saved `params` (MuZero's,
    or EfficientZero's "muzero" subtree); `agent_config.network` is set to the kind built."""
    if agent_config.network == "auto":
        # Runs record what "auto" chose (the agent's registered `choices`); older ones hold
        # "auto", and MinAtar's boards then got the MLP. The saved parameters say which.
        agent_config.network = ("conv_mlp" if "repr_conv" in params else
                                resolve_network("auto", env_spec).replace("conv_mlp", "mlp"))
    return make_network(agent_config, env_spec)
