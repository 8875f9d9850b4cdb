"""Gumbel MuZero on Catch with Anakin: MuZero's Catch config with Gumbel search at 2 simulations.

    python -m experiments.anakin --config=experiments/configs/gumbel_muzero_catch.py \
        --workdir=/tmp/gmz

Gumbel MuZero (Danihelka et al., 2022) is MuZero with `agent.search = "gumbel"`: Sequential
Halving with Gumbel at the root, acting by its chosen action, and the improved policy
softmax(logits + sigma(completed Q)) as the policy target (docs/gumbel_muzero.md).
"""

import ml_collections

from experiments.configs import muzero_catch


def get_config() -> ml_collections.ConfigDict:
    config = muzero_catch.get_config()
    config.agent.search = "gumbel"
    config.agent.num_simulations = 2  # Catch's 3 actions: 2 of them visited at the root
    # mctx's floor on the range of Q that sigma normalises by, as this config's recorded
    # results were measured with (the agent's default: 0.1).
    config.agent.gumbel_q_floor = 1e-8
    return config
