"""Stochastic MuZero on MinAtar Breakout with sticky actions (pgx's port, whose games repeat the
previous action with probability 0.1, as the original MinAtar does), with Anakin: MuZero's
MinAtar config with afterstates, a chance encoder and the stochastic search.

    python -m experiments.anakin --config=experiments/configs/stochastic_muzero_minatar.py \
        --workdir=/tmp/smz_minatar

Needs the pgx extra (`pip install -e '.[pgx]'`). The matching MuZero run is
`--config=experiments/configs/muzero_minatar.py --config.env.name=pgx:minatar-breakout`
(docs/stochastic_muzero.md).
"""

import ml_collections

from agents import stochastic_muzero
from experiments.configs import muzero_minatar


def get_config() -> ml_collections.ConfigDict:
    config = muzero_minatar.get_config()
    config.env.name = "pgx:minatar-breakout"  # sticky actions: p = 0.1 (pgx's default)
    agent = stochastic_muzero.default_config()
    for field, value in config.agent.items():  # MuZero's MinAtar settings, then the new fields
        agent[field] = value
    agent.name = "stochastic_muzero"
    agent.rollout_length = config.get_ref("rollout_length")
    agent.num_simulations = 16  # each expands a state or an afterstate: twice MuZero's 8
    agent.num_chance_outcomes = 8  # C: sticky or not, times the new bricks' and ball's draws
    config.agent = agent
    return config
