"""PPO on Atari with Sebulba, under a named Atari protocol.

    python -m experiments.sebulba --config=experiments/configs/sebulba_ppo_atari.py \
        --config.env.task=Breakout-v5 --config.env.protocol=machado --workdir=/tmp/run

The protocol ("impala" or "machado", see `sebulba.ATARI_PROTOCOLS`) fixes frame skip, frame
size, frame stack, no-op starts, episodic life, reward clipping, sticky actions and the action
set; it is written, with the envpool version, to `<workdir>/run_info.json` and the first output
line. Logged episode returns are unclipped game scores. The agent's hyperparameters follow the
PPO paper's Atari table (Schulman et al., 2017, table 5) where ours has them: T = 128, 8
environments, 3 epochs of 4 minibatches (of 256 transitions), Adam at 2.5e-4 annealed to 0,
discount 0.99, GAE lambda 0.95, clip 0.1 (not annealed here), entropy cost 0.01; value cost 0.5
on 1/2 (V - R)^2 and gradient norm clipped at 0.5, as in OpenAI's baselines PPO code. The torso
is the shallow DQN/IMPALA conv net; `agent.torso="resnet"` takes the IMPALA deep one.

With policy lag 1 (the default here: the actors collect the next batch during each update) the
data is one version stale; `agent.off_policy="corrected"` corrects for it with truncated
importance ratios, "plain" treats it as on-policy and only logs the lag (docs/ppo.md).
"""

import ml_collections

from agents import ppo
from experiments.configs import sebulba_vtrace_atari


def get_config() -> ml_collections.ConfigDict:
    config = sebulba_vtrace_atari.get_config()  # Pong-v5 under the impala protocol
    config.agent = ppo.default_config()
    config.agent.popart = False  # the PPO paper's Atari agent, which has no PopArt
    config.agent.advantage_normalization = "batch"  # and normalises over the batch
    config.agent.torso = "conv"  # the DQN/IMPALA-shallow torso, shared by policy and value
    config.agent.learning_rate = 2.5e-4
    config.agent.num_epochs = 3
    config.agent.num_minibatches = 4
    config.agent.clip_eps = 0.1
    config.agent.value_clip_eps = 0.1
    config.agent.entropy_cost = 0.01
    config.agent.off_policy = "corrected"
    # On CPU a conv net's forward+backward inside a rolled scan is ~20x slower than unrolled.
    config.agent.unroll_updates = True
    config.actor_threads_per_device = 2  # one steps its environments while the other infers
    config.envs_per_actor_thread = 4  # B; 2 threads x 4 = 8 environments per update
    config.rollout_length = 128  # T
    config.policy_lag = 1  # acting overlaps learning: one version stale, corrected above
    config.total_env_steps = 10_000_000  # agent steps over all processes (40M frames)
    # The step size reaches 0 at the run's last learner step, which the runner counts from the
    # sizes, devices and processes it uses.
    config.agent.anneal_lr_updates = config.get_ref("learner_steps")
    config.log_every_updates = 10
    config.checkpoint_every_updates = 500
    config.eval_every_updates = 500
    return config
