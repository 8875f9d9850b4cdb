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

from experiments.configs import muzero_minatar
from experiments.configs.stochastic_muzero_catch import with_stochastic_agent


def get_config() -> ml_collections.ConfigDict:
    config = muzero_minatar.get_config()
    config.env.name = "pgx:minatar-breakout"  # sticky actions: p = 0.1 (pgx's default)
    agent = with_stochastic_agent(config)  # C = 8 chance codes, the agent's default
    agent.num_simulations = 16  # each expands a state or an afterstate: twice MuZero's 8
    return config
