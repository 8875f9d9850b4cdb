"""PQN on MinAtar Breakout (gymnax's JAX port) with Anakin, at the settings of PQN's reference
MinAtar config (purejaxql `pqn_minatar.yaml`): 128 environments x T = 32, 2 epochs of 32
minibatches, lambda 0.65, the step size 5e-4 annealed to 0 over the run, epsilon from 1 to
0.05 over its first 10%, and the MinAtar network with LayerNorm (`agent.torso="board_conv"`:
one 3 x 3 convolution of 16 channels, then 128 units). docs/dqn.md says what differs.

    python -m experiments.anakin --config=experiments/configs/pqn_minatar.py --workdir=/tmp/pqn

Needs the gymnax extra (`pip install -e '.[gymnax]'`); any MinAtar game by name, e.g.
`--config.env.name=gymnax:Freeway-MinAtar`.
"""

import ml_collections

import anakin
from agents import pqn


def get_config() -> ml_collections.ConfigDict:
    config = anakin.default_config()
    config.env.name = "gymnax:Breakout-MinAtar"  # gymnax's own time limit applies (truncation)
    config.agent = pqn.default_config()
    config.agent.torso = "board_conv"
    config.agent.hidden_sizes = (128,)
    config.agent.learning_rate = 5e-4
    config.agent.lambda_ = 0.65
    config.agent.num_epochs = 2
    config.agent.num_minibatches = 32  # of 128 transitions each
    config.num_devices = 1
    config.num_envs = 128
    config.rollout_length = 32
    config.updates_per_chunk = 61  # 40 records over the run
    config.total_env_steps = 10_000_000  # 2,441 learner steps, rounded up to whole chunks
    # The step size reaches 0 at the last learner step, and epsilon its end after the first
    # tenth, whatever the run length on the command line.
    updates = config.get_ref("total_env_steps") // (
        config.get_ref("num_envs") * config.get_ref("rollout_length"))
    config.agent.anneal_lr_updates = updates
    config.agent.epsilon_anneal_steps = updates // 10
    return config
