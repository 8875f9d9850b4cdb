"""Validation of the checkpoint, evaluation and sweep fields: clear errors before compiling,
and how a sweep's runs are read from the config."""

import ml_collections
import pytest
from conftest import fail_if_anakin_builds_programs

import anakin
from anakin import config as anakin_config
from anakin.config import Run, sweep_runs
from experiments.configs import vtrace_catch
from podracer.config import ConfigError


def _set(config, key, value):
    node = config
    *parents, leaf = key.split(".")
    for parent in parents:
        node = node[parent]
    node[leaf] = value


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        ({"checkpoint_every_updates": -1}, "checkpoint_every_updates", "whole number >= 0"),
        ({"checkpoint_keep": 0}, "checkpoint_keep", ">= 1"),
        ({"eval_max_steps": 0}, "eval_max_steps", ">= 1"),
        ({"eval_episodes": 0}, "eval_episodes", ">= 1"),
        ({"env.frame_stack": 0}, "env.frame_stack", "whole number >= 1"),
        ({"cpu_worker_threads": -1}, "cpu_worker_threads", "whole number >= 0"),
        ({"sweep.seeds": (0, -1)}, "sweep.seeds", "seeds >= 0"),
        ({"sweep.agent.hidden_sizes": ((8,), (16,))}, "sweep.agent.hidden_sizes",
         "cannot sweep"),
        ({"sweep.agent.learning_rate": ()}, "sweep.agent.learning_rate", "non-empty"),
        ({"sweep.agent.learning_rate": (1e-3, 0.0)}, "sweep.agent.learning_rate", "> 0"),
        ({"sweep.seeds": (0, 1, 2), "sweep.agent.learning_rate": (1e-3, 3e-4)}, "sweep.seeds",
         "differ in length"),
        # Set in Python, a misspelt field would be read by nothing.
        ({"agent.learning_rat": 3e-4}, "agent.learning_rat",
         "is not a field of the 'vtrace' agent's config, so nothing would read it (did you "
         "mean agent.learning_rate?)"),
        ({"total_steps": 10}, "total_steps", "(did you mean total_env_steps"),
        ({"env.nmae": "catch"}, "env.nmae", "(did you mean env.name?)"),
        # Runs a sweep would compute twice: the same seed with the same values.
        ({"sweep.seeds": (0, 1, 0)}, "sweep.seeds",
         "runs 0 and 2 are the same run (seed 0): the sweep would compute it twice"),
        ({"sweep.agent.learning_rate": (1e-3, 1e-3)}, "sweep.agent.learning_rate",
         "runs 0 and 1 are the same run (seed 0, learning_rate 0.001)"),
        ({"agent.discount": 1.5}, "agent.discount", "must be a number in [0, 1], got 1.5"),
        # A mistyped choice among a hundred environments names the close ones first.
        ({"env.name": "catchh"}, "env.name",
         "unknown value 'catchh' (did you mean catch?)"),
    ],
)
def test_bad_fields_fail_before_compiling_naming_the_field(overrides, field, says,
                                                           monkeypatch):
    config = vtrace_catch.get_config()
    config.num_devices = 1
    for key, value in overrides.items():
        _set(config, key, value)
    fail_if_anakin_builds_programs(monkeypatch)
    with pytest.raises(ConfigError, match=f"config.{field}") as info:
        anakin.train(config)
    assert says in str(info.value) and "Fix:" in str(info.value)


def test_sweep_runs_zip_seeds_and_hyperparameters():
    config = vtrace_catch.get_config()
    assert sweep_runs(config) is None  # the default config is a single run
    config.seed = 7
    config.sweep.agent.learning_rate = (1e-3, 3e-4)
    assert sweep_runs(config) == [Run(7, {"learning_rate": 1e-3}),
                                  Run(7, {"learning_rate": 3e-4})]
    config.sweep.seeds = (1, 2)
    assert [r.seed for r in sweep_runs(config)] == [1, 2]


def test_configs_without_the_new_fields_still_validate():
    config = vtrace_catch.get_config()
    for field in ("checkpoint_every_updates", "checkpoint_keep", "eval_every_updates",
                  "eval_episodes", "eval_max_steps", "sweep"):
        del config[field]
    assert anakin.validate(config, 8) == 8


def test_an_environment_of_a_library_not_installed_names_the_extra(monkeypatch):
    # What a new user meets running a *_minatar.py config without gymnax: the extra to install,
    # not a list of the environments that are installed.
    from envs_jax import registry

    monkeypatch.setitem(registry._NAMESPACES, "nolib", registry._Namespace(
        library="surely_not_an_installed_module", adapter="envs_jax.adapters.gymnax",
        extra="nolib"))
    config = vtrace_catch.get_config()
    config.env.name = "nolib:Breakout-MinAtar"
    fail_if_anakin_builds_programs(monkeypatch)
    with pytest.raises(ConfigError, match="config.env.name") as info:
        anakin.train(config)
    assert "pip install -e '.[nolib]'" in str(info.value)
    assert registry.missing_extra("catch") is None


def test_frame_stack_reaches_the_environment_the_agent_is_built_for():
    config = vtrace_catch.get_config()
    config.env.frame_stack = 3
    checked = anakin_config.check(config, 1)
    # Catch's [10, 5] board, three newest along its last axis.
    assert checked.env.observation_spec().shape == (10, 15)
    assert anakin.validate(vtrace_catch.get_config(), 1) == 1  # the default: no stack


def test_num_envs_left_to_the_machine():
    from podracer.machine import Machine

    config = vtrace_catch.get_config()
    config.num_envs = 0
    # A 2-core CPU with one device: the default, 32.
    cpu = anakin_config.check(config, 1, machine=Machine(cores=2, platform="cpu", num_devices=1))
    assert (cpu.num_envs, cpu.machine.cores) == (32, 2)
    # 3 simulated CPU devices: 32 rounded up to 33, 11 each.
    assert anakin_config.check(config, 3, machine=Machine(2, "cpu", 3)).num_envs == 33
    # One GPU on 16 cores: 256 per device.
    assert anakin_config.check(config, 1, machine=Machine(16, "gpu", 1)).num_envs == 256
    assert anakin_config.check(config, 2, machine=Machine(16, "gpu", 2)).num_envs == 512
    # Set by the config: kept, and no machine recorded.
    config.num_envs = 64
    checked = anakin_config.check(config, 1, machine=Machine(16, "gpu", 1))
    assert (checked.num_envs, checked.machine) == (64, None)
    config.num_envs = -1
    with pytest.raises(ConfigError, match="num_envs"):
        anakin_config.check(config, 1)


def test_a_schedule_over_the_run_reads_the_sizes_and_the_learner_steps_the_run_uses():
    from experiments.configs import ppo_cartpole
    from podracer.machine import Machine

    # ppo_cartpole anneals over total_env_steps // (num_envs x T) = 499,712 // (4 x 128) = 976
    # updates. With num_envs left to the machine (32 on a CPU) the formula reads the derived
    # size, 499,712 // 4,096 = 122, where it once divided by 0.
    config = ppo_cartpole.get_config()
    config.num_envs = 0
    checked = anakin_config.check(config, 1, machine=Machine(cores=2, platform="cpu",
                                                             num_devices=1))
    assert (checked.num_envs, checked.config.agent.anneal_lr_updates) == (32, 122)
    assert config.num_envs == 0 and config.learner_steps == 0  # the caller's config unchanged
    # learner_steps counts whole chunks: 500,000 steps at 122 updates x 512 steps a chunk take
    # 9 chunks, 1,098 updates (the floor formula would stop annealing at 976).
    config = ppo_cartpole.get_config()
    config.total_env_steps = 500_000
    config.agent.anneal_lr_updates = config.get_ref("learner_steps")
    checked = anakin_config.check(config, 1)
    assert checked.config.learner_steps == checked.config.agent.anneal_lr_updates == 1098
    # The runner sets it; a value of the config's own is refused, naming the field.
    config.learner_steps = 1000
    with pytest.raises(ConfigError) as info:
        anakin_config.check(config, 1)
    assert info.value.field == "learner_steps" and "1098 for this run" in str(info.value)


def test_an_agent_rollout_length_not_tied_to_the_runners_is_refused_before_compiling(
        monkeypatch):
    from experiments.configs import muzero_catch

    config = muzero_catch.get_config()
    config.num_devices = 1
    config.rollout_length = 8  # tied: the agent's follows
    assert config.agent.rollout_length == 8
    anakin_config.validate(config, 1)
    # Untied (a copy without the reference): the replay's period would be 16, T 8.
    config.agent = ml_collections.ConfigDict(config.agent.to_dict())
    config.agent.rollout_length = 16
    assert config.rollout_length == 8
    fail_if_anakin_builds_programs(monkeypatch)
    with pytest.raises(ConfigError) as info:
        anakin.train(config)
    assert info.value.field == "agent.rollout_length"
    assert str(info.value) == (
        "config.agent.rollout_length: is 16 but the runner's rollout_length is 8: the agent "
        "sizes what holds its trajectories (a replay's period) by its own field, and receives "
        "the runner's. Fix: set config.agent.rollout_length = config.get_ref('rollout_length')")


def test_a_plain_dict_is_refused_saying_what_to_pass():
    with pytest.raises(TypeError, match=r"anakin.train takes an ml_collections.ConfigDict .*"
                                        r"got dict"):
        anakin.train(vtrace_catch.get_config().to_dict())


def test_a_sebulba_config_is_named_as_one_with_the_command_that_runs_it():
    from experiments.configs import sebulba_vtrace_cartpole

    with pytest.raises(ConfigError, match=r"config.env.task: is a field of Sebulba's config, "
                                          r"not Anakin's.*python -m experiments.sebulba"):
        anakin.validate(sebulba_vtrace_cartpole.get_config(), 1)
