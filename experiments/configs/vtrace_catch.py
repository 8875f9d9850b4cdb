"""V-trace on Catch with Anakin: the default experiment (about a minute on a 2-core CPU).

    python -m experiments.anakin --config=experiments/configs/vtrace_catch.py --workdir=/tmp/run
"""

import ml_collections

from agents import vtrace


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # with the config and device count, fixes the run (README: Determinism)
    config.num_devices = 0  # devices to replicate over; 0 = every device of every process
    config.env = ml_collections.ConfigDict()
    config.env.name = "catch"  # any name in envs_jax.registered()
    config.env.kwargs = ml_collections.ConfigDict()  # passed to envs_jax.make
    config.env.max_episode_steps = 0  # time limit added by the runner; 0 = none
    config.agent = vtrace.default_config()
    config.num_envs = 256  # environments in total, split evenly over the devices
    config.rollout_length = 20  # T: steps per trajectory (and per update)
    config.updates_per_chunk = 50  # K: updates per compiled call; one log line per chunk
    config.total_env_steps = 2_000_000
    # With a --workdir: checkpoints in <workdir>/checkpoints (and resumption from them).
    config.checkpoint_every_updates = 200  # at the first chunk end past each multiple; 0 = none
    # (a checkpoint is also written at the end of the run and on SIGTERM)
    config.checkpoint_keep = 3  # the newest checkpoints kept
    # Fields a resumed run may change on purpose (none that reshapes the saved state), e.g.
    # ('agent.learning_rate',); any other difference from the checkpoint refuses to resume.
    config.resume_allow_changes = ()
    config.eval_every_updates = 200  # greedy evaluation on separate environments; 0 = none
    config.eval_episodes = 32  # one episode on each of this many fresh environments
    config.eval_max_steps = 1000  # an evaluation episode still running here counts as it stands
    # Sweeps: R independent runs vmapped inside one compiled program, logged in run_<i>/.
    config.sweep = ml_collections.ConfigDict()
    config.sweep.seeds = ()  # one seed per run; () = config.seed for every run
    config.sweep.agent = ml_collections.ConfigDict()  # e.g. learning_rate = (1e-3, 3e-4): one
    # value per run, zipped with the seeds; only fields in the agent's `sweepable`
    return config
