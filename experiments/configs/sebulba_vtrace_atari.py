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

from agents import vtrace


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # with config and devices, fixes a fixed-lag run (README: Determinism)
    config.env = ml_collections.ConfigDict()
    config.env.task = "Pong-v5"  # any envpool Atari task id ("<Game>-v5")
    config.env.protocol = "impala"  # "impala" | "machado" | "atari100k"[_grey] (ATARI_PROTOCOLS)
    config.env.kwargs = ml_collections.ConfigDict()  # envpool options over the protocol's (recorded)
    # Evaluation's options over those (recorded), e.g. episodic_life=False for whole games.
    config.env.eval_kwargs = ml_collections.ConfigDict()
    config.env.num_threads = 0  # envpool C++ threads per actor thread; 0 = envpool's default
    config.agent = vtrace.default_config()
    config.agent.torso = "resnet"  # IMPALA deep residual torso; "conv" for the shallow one
    config.agent.learning_rate = 6e-4
    config.agent.max_grad_norm = 40.0
    config.agent.discount = 0.99
    config.agent.baseline_cost = 0.5
    config.agent.entropy_cost = 0.01
    # Devices are indices into each process's local devices; the same ones may act and learn.
    # On an 8-GPU host, e.g. actor_device_ids=(0, 1) and learner_device_ids=(2, ..., 7).
    config.actor_device_ids = (0,)
    config.learner_device_ids = (0,)
    config.actor_threads_per_device = 2  # one steps its environments while the other infers
    config.envs_per_actor_thread = 16  # B; 2 threads x 16 = 32 trajectories per update
    config.rollout_length = 20  # T
    config.staleness = "fixed"  # "fixed": exactly policy_lag versions behind | "latest"
    config.policy_lag = 1
    config.queue_size = 1  # trajectories each actor thread may have waiting for the learner
    config.total_env_steps = 12_500_000  # agent steps over all processes (50M frames)
    config.log_every_updates = 20
    config.timeout_s = 600.0  # longest any thread waits for another before the run fails
    config.save_final_params = False  # write <workdir>/final_params.process<i>.npz at the end
    # With a --workdir: checkpoints in <workdir>/checkpoints (and resumption from them).
    config.checkpoint_every_updates = 2000  # learner updates between checkpoints; 0 = none
    # (a checkpoint is also written at the end of the run and on SIGTERM)
    config.checkpoint_keep = 3  # the newest checkpoints kept
    # Fields a resumed run may change on purpose (none that reshapes the saved state), e.g.
    # ('agent.learning_rate',); any other difference from the checkpoint refuses to resume.
    config.resume_allow_changes = ()
    # Greedy evaluation on separate environments (whole games, unclipped scores); 0 = none.
    # It pauses the learner while it plays: up to eval_max_steps inferences per evaluation.
    config.eval_every_updates = 2000
    config.eval_episodes = 16  # one game on each of this many environments
    config.eval_max_steps = 27_000  # the protocol's game length (108K frames)
    return config
