"""MuZero on Catch with Anakin: search, replay and updates inside one compiled program.

    python -m experiments.anakin --config=experiments/configs/muzero_catch.py --workdir=/tmp/mz
"""

import ml_collections

import anakin
from agents import muzero


def get_config() -> ml_collections.ConfigDict:
    config = anakin.default_config()
    config.agent = muzero.default_config()
    config.num_envs = 32
    config.rollout_length = 10
    # The replay stores trajectories of rollout_length steps: keep the two tied.
    config.agent.rollout_length = config.get_ref("rollout_length")
    config.agent.num_simulations = 8
    config.agent.search = "muzero"  # PUCT with Dirichlet noise; "gumbel" also learns Catch
    config.agent.hidden_sizes, config.agent.latent_size = (128,), 128
    config.agent.learning_rate, config.agent.value_cost = 3e-3, 1.0
    config.agent.batch_size = 256  # positions per update, per device
    config.agent.updates_per_step = 6  # 6 x 256 positions sampled per 320 inserted
    config.agent.priority_exponent = 0.0  # alpha; 0.6 (prioritised) also learns, a little slower
    # beta rises from 0.4 to 1 over the run's 1,200 learner updates (used when alpha > 0).
    config.agent.importance_exponent = 0.4
    config.agent.importance_anneal_updates = 1200
    config.agent.replay_capacity = 5120  # positions
    # MuZero's acting temperature first falls after 4,000 updates: 1 through this run's 1,200.
    config.agent.min_replay_items = 640  # positions
    config.agent.target_update_interval = 50
    config.agent.unroll_steps = 3  # K: Catch needs no deeper model to learn quickly
    config.agent.td_steps = 5  # n: half a 9-step Catch episode; learns faster than 10 with alpha > 0
    # Catch's 9-step episodes put a terminal inside many K = 3 unrolls. Training the absorbing
    # state after it (value 0, reward 0, uniform policy; MuZero's default) keeps the
    # EfficientZero config built from this one from stalling at a training return of 0.8
    # (docs/efficientzero.md), where its own default masks them as its reference does.
    config.agent.past_end_targets = "absorbing"
    # mctx's Q normalisation and unvisited-child Q, and no terminal head, which this config's
    # recorded results were measured with (MuZero's defaults: the tree's min-max,
    # "tree_min_max"; the parent's mean Q; a terminal head).
    config.agent.q_transform, config.agent.terminal_head = "parent_and_siblings", False
    config.agent.unvisited_q = "min"
    config.updates_per_chunk = 25
    config.total_env_steps = 64_000
    config.checkpoint_every_updates = 200  # with a --workdir; 200 updates here, 1,600 in MinAtar
    # Greedy evaluation (off by default) compiles a second search program; enable it with
    # --config.eval_every_updates=100 when the curve matters more than the time.
    return config
