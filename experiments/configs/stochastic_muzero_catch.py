"""Stochastic MuZero on Catch whose ball drifts at random, with Anakin: MuZero's Catch config
with afterstates, a chance encoder and the stochastic search.

    python -m experiments.anakin --config=experiments/configs/stochastic_muzero_catch.py \
        --workdir=/tmp/smz

`--config.env.name=catch` runs it on Catch without drift; the matching MuZero run is
`--config=experiments/configs/muzero_catch.py --config.env.name=stochastic_catch`
(docs/stochastic_muzero.md).
"""

import ml_collections

from agents import stochastic_muzero
from experiments.configs import muzero_catch


def with_stochastic_agent(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` (a MuZero experiment) with Stochastic MuZero's defaults for its agent, every
    MuZero field set as `config.agent` sets it; the agent returned is the new `config.agent`."""
    agent = stochastic_muzero.default_config()
    for field, value in config.agent.items():  # MuZero's settings, then the new fields
        agent[field] = value
    agent.name = "stochastic_muzero"
    agent.rollout_length = config.get_ref("rollout_length")
    config.agent = agent
    return agent


def get_config() -> ml_collections.ConfigDict:
    config = muzero_catch.get_config()
    config.env.name = "stochastic_catch"  # the ball drifts a column with probability 0.25
    agent = with_stochastic_agent(config)
    # Each simulation expands one node, a state or an afterstate: twice MuZero's 8 expand
    # about as many states.
    agent.num_simulations = 16
    agent.num_chance_outcomes = 4  # C: the drift's three outcomes and one spare
    return config
