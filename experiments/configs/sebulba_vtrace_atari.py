"""V-trace (IMPALA deep ResNet) on Atari with Sebulba, under a named Atari protocol.

    python -m experiments.sebulba --config=experiments/configs/sebulba_vtrace_atari.py \
        --config.env.task=Breakout-v5 --config.env.protocol=machado --workdir=/tmp/run

The protocol ("impala" or "machado", see `sebulba.ATARI_PROTOCOLS`) fixes frame skip, frame
size, frame stack, no-op starts, episodic life, reward clipping, sticky actions and the action
set; it is written, with the envpool version, to `<workdir>/run_info.json` and the first output
line. Logged episode returns are unclipped game scores. The agent's hyperparameters follow the
IMPALA paper's Atari table where our agent has them (T = 20, 32 trajectories per batch,
discount 0.99, baseline cost 0.5, entropy cost 0.01, learning rate 6e-4, gradient norm
clipped at 40; Adam instead of RMSProp).
"""

import ml_collections

import sebulba
from agents import vtrace


def get_config() -> ml_collections.ConfigDict:
    config = sebulba.default_config()
    config.env.task = "Pong-v5"  # any envpool Atari task id ("<Game>-v5")
    config.env.protocol = "impala"  # "impala" | "machado" | "atari100k"[_grey] (ATARI_PROTOCOLS)
    config.agent = vtrace.default_config()
    config.agent.torso = "resnet"  # IMPALA deep residual torso; "conv" for the shallow one
    config.agent.learning_rate = 6e-4
    config.agent.max_grad_norm = 40.0
    config.agent.discount = 0.99
    config.agent.baseline_cost = 0.5
    config.agent.entropy_cost = 0.01
    config.actor_threads_per_device = 2  # one steps its environments while the other infers
    config.envs_per_actor_thread = 16  # B; 2 threads x 16 = 32 trajectories per update
    config.rollout_length = 20  # T
    config.total_env_steps = 12_500_000  # agent steps over all processes (50M frames)
    config.timeout_s = 600.0  # longest any thread waits for another before the run fails
    config.checkpoint_every_updates = 2000  # of the run's 19,532 learner updates
    config.eval_every_updates = 2000  # greedy, on separate environments, unclipped scores
    config.eval_episodes = 16  # one game on each of this many environments
    config.eval_max_steps = 27_000  # the protocol's game length (108K frames)
    return config
