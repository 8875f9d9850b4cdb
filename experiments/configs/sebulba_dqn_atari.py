"""Double DQN on Atari with Sebulba (envpool), under a named Atari protocol: the replay lives in
the learner state on the learner device(s), one shard per device.

    python -m experiments.sebulba --config=experiments/configs/sebulba_dqn_atari.py \
        --config.env.task=Pong-v5 --workdir=/tmp/run

The protocol ("impala" by default: 84 x 84 grey, 4 stacked frames, frame skip 4, no-op
starts, episodic life, rewards clipped for training; `sebulba.ATARI_PROTOCOLS`) is written,
with the envpool version, to `<workdir>/run_info.json`. Logged episode returns are unclipped
game scores. The torso is the Nature DQN conv net (`agent.torso="conv"`: 32/64/64 filters of
8/4/3 with strides 4/2/1, then 512 units), as in sebulba_ppo_atari.py. Settings follow Nature
DQN (Mnih et al., 2015) and Rainbow's (Hessel et al., 2018) where ours has them: 8 samples per
inserted agent step (the paper's batch of 32 every 4 steps), a target copy every 8K agent steps,
epsilon from 1 to 0.01 over the first 250K agent steps (1M frames), 3-step returns, Adam at
6.25e-5 with epsilon 1.5e-4, a Huber loss; the replay is 200K agent steps per learner device
(the paper's 1M frames would take 28 GB of stacked frames), 20K of warm-up. Differences from
the papers: docs/dqn.md.
"""

import ml_collections

from agents import dqn
from experiments.configs import sebulba_vtrace_atari


def get_config() -> ml_collections.ConfigDict:
    config = sebulba_vtrace_atari.get_config()  # Pong-v5 under the impala protocol
    config.agent = dqn.default_config()
    config.agent.torso = "conv"  # the Nature DQN torso
    config.agent.learning_rate = 6.25e-5
    config.agent.adam_eps = 1.5e-4
    config.agent.n_step = 3
    config.agent.batch_size = 32  # positions per update
    config.agent.replay_ratio = 16  # updates per learner step: 512 samples per 64 agent steps
    config.agent.warmup = 20_000  # sampleable positions before the first update
    config.agent.replay_capacity = 200_000  # agent steps per learner device (5.6 GB of frames)
    config.agent.target_update_interval = 2_000  # updates: 8K agent steps
    config.agent.epsilon_end = 0.01
    config.agent.epsilon_anneal_steps = 3_906  # learner steps: 250K agent steps (1M frames)
    config.actor_threads_per_device = 2  # one steps its environments while the other infers
    config.envs_per_actor_thread = 4  # B; 2 threads x 4 = 8 environments per update
    config.rollout_length = 8  # T: 64 agent steps per learner step
    config.policy_lag = 1  # acting overlaps learning; a replay agent tolerates the lag
    config.total_env_steps = 10_000_000  # agent steps over all processes (40M frames)
    config.log_every_updates = 100
    config.checkpoint_every_updates = 10_000  # of the run's 156,250 learner steps
    config.eval_every_updates = 10_000
    return config
