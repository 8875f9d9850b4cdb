"""Gumbel MuZero (Danihelka et al., 2022, "Policy improvement by planning with Gumbel"),
registered as its own agent: MuZero (`agents.muzero`) with `search="gumbel"`, that is mctx's
`gumbel_muzero_policy` as the search (Sequential Halving with Gumbel at the root), acting by the
action it keeps, and the improved policy softmax(logits + sigma(completed Q)) as the policy
target. Everything else (networks, replay, targets, losses, learner) is MuZero's; what differs,
and how it compares at few simulations, is in docs/gumbel_muzero.md.
"""

from __future__ import annotations

import ml_collections

from agents import muzero
from agents.muzero import INTRODUCED, choices
from podracer.agent import Agent
from podracer.config import ConfigError
from podracer.types import EnvSpec


def default_config() -> ml_collections.ConfigDict:
    """MuZero's fields (`agents.muzero.default_config`, one comment each), with the search set
    to Gumbel MuZero's."""
    c = muzero.default_config()
    c.name = "gumbel_muzero"  # the registered agent name
    c.search = "gumbel"  # Sequential Halving with Gumbel at the root; the improved-policy target
    return c


def validate(config: ml_collections.ConfigDict) -> None:
    """MuZero's checks, and the search: this agent is MuZero's Gumbel search."""
    muzero.validate(config)
    if config.search != "gumbel":
        raise ConfigError("agent.search", f"is {config.search!r}; gumbel_muzero is MuZero with "
                          "the Gumbel search",
                          "leave it 'gumbel', or use the muzero agent for the PUCT search")


def make_agent(config: ml_collections.ConfigDict, env_spec: EnvSpec) -> Agent:
    """MuZero's agent for `config` after `validate`."""
    validate(config)
    return muzero.make_agent(config, env_spec)


__all__ = ["INTRODUCED", "choices", "default_config", "make_agent", "validate"]
