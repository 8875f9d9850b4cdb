"""Double DQN on MinAtar Asterix (gymnax's JAX port) with Anakin: the CartPole config's settings
(`dqn_cartpole.py`) with the MinAtar network, `agent.torso="board_conv"`: one 3 x 3
convolution of 16 channels, then 128 units, each followed by LayerNorm (Young & Tian, 2019, with
PQN's LayerNorm).

    python -m experiments.anakin --config=experiments/configs/dqn_minatar.py --workdir=/tmp/dqn

8 environments, T = 8, 2 updates of 128 positions per learner step, a target copy every 100
updates, epsilon from 1 to 0.01 over the first 32% of the run (320K steps of the 1M), the share
`dqn_cartpole.py` anneals over. On Asterix the MLP on the flattened board that `dqn_cartpole.py`
uses barely learns and this network does, at about twice the MLP's time on a CPU
(docs/dqn.md, "DQN on MinAtar: the torso").

Needs the gymnax extra (`pip install -e '.[gymnax]'`); any MinAtar game by name, e.g.
`--config.env.name=gymnax:Breakout-MinAtar`.
"""

import ml_collections

from experiments.configs import dqn_cartpole


def get_config() -> ml_collections.ConfigDict:
    config = dqn_cartpole.get_config()
    config.env.name = "gymnax:Asterix-MinAtar"  # gymnax's own time limit applies (truncation)
    config.cpu_worker_threads = 0  # XLA's own choice: the convolution gains from both cores
    config.agent.torso = "board_conv"
    config.agent.hidden_sizes = (128,)
    config.total_env_steps = 1_000_000  # 15,625 learner steps
    # epsilon reaches its end after the first 32% of the learner steps (5,000 of the 1M run's),
    # whatever the run length on the command line.
    updates = config.get_ref("total_env_steps") // (
        config.get_ref("num_envs") * config.get_ref("rollout_length"))
    config.agent.epsilon_anneal_steps = updates * 32 // 100
    config.eval_every_updates = 0
    return config
