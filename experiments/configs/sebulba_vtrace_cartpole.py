"""V-trace on envpool's CartPole-v1 with Sebulba: the fast classic-control experiment.

    python -m experiments.sebulba --config=experiments/configs/sebulba_vtrace_cartpole.py \
        --workdir=/tmp/run

Defaults use one device for acting and learning (shared); with more devices name them, e.g.
`--config.actor_device_ids="(0,)" --config.learner_device_ids="(1, 2)"`.
"""

import ml_collections

from agents import vtrace


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # with config and devices, fixes a fixed-lag run (README: Determinism)
    config.env = ml_collections.ConfigDict()
    config.env.task = "CartPole-v1"  # any envpool task id with discrete actions (V-trace)
    config.env.protocol = "none"  # Atari only: a name in sebulba.ATARI_PROTOCOLS
    config.env.kwargs = ml_collections.ConfigDict()  # extra envpool options, over the protocol's
    config.env.eval_kwargs = ml_collections.ConfigDict()  # evaluation's options over those
    config.env.num_threads = 1  # envpool C++ threads per actor thread; 0 = envpool's default
    config.agent = vtrace.default_config()
    config.agent.hidden_sizes = (64, 64)
    config.agent.learning_rate = 1e-3
    config.agent.max_grad_norm = 0.5
    config.agent.entropy_cost = 0.01
    # Devices are indices into each process's local devices; the same ones may act and learn.
    config.actor_device_ids = (0,)
    config.learner_device_ids = (0,)
    config.actor_threads_per_device = 1  # each with its own envpool batch
    config.envs_per_actor_thread = 32  # B; must be divisible by the number of learner devices
    config.rollout_length = 32  # T: steps per trajectory
    config.staleness = "fixed"  # "fixed": exactly policy_lag versions behind | "latest"
    config.policy_lag = 1  # fixed protocol: rollout k acts with version max(k - 1 - lag, 0)
    config.queue_size = 1  # trajectories each actor thread may have waiting for the learner
    config.total_env_steps = 500_000  # over all processes
    config.log_every_updates = 20  # one metrics.jsonl line (and progress line) per this many
    config.timeout_s = 300.0  # longest any thread waits for another before the run fails
    config.save_final_params = False  # write <workdir>/final_params.process<i>.npz at the end
    # With a --workdir: checkpoints in <workdir>/checkpoints (and resumption from them).
    config.checkpoint_every_updates = 100  # learner updates between checkpoints; 0 = none
    # (a checkpoint is also written at the end of the run and on SIGTERM)
    config.checkpoint_keep = 3  # the newest checkpoints kept
    # Fields a resumed run may change on purpose (none that reshapes the saved state), e.g.
    # ('agent.learning_rate',); any other difference from the checkpoint refuses to resume.
    config.resume_allow_changes = ()
    config.eval_every_updates = 100  # greedy evaluation on separate environments; 0 = none
    config.eval_episodes = 32  # one episode on each of this many environments
    config.eval_max_steps = 1000  # an evaluation episode still running here counts as it stands
    return config
