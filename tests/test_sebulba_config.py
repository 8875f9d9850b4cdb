"""Sebulba config validation: every bad field is named, with its fix, before anything starts."""

import ml_collections
import pytest
from conftest import set_fields

from experiments.configs import sebulba_vtrace_atari, sebulba_vtrace_cartpole
from podracer.config import ConfigError
from podracer.machine import Machine
from sebulba import config as sebulba_config
from sebulba import plan as sebulba_plan
from sebulba import validate


def _cartpole(**overrides) -> ml_collections.ConfigDict:
    config = sebulba_vtrace_cartpole.get_config()
    set_fields(config, overrides)
    return config


def test_shipped_configs_are_valid():
    topology = validate(sebulba_vtrace_cartpole.get_config(), num_local_devices=1,
                        num_processes=1)
    assert topology.actor_device_ids == (0,) and topology.learner_device_ids == (0,)
    validate(sebulba_vtrace_atari.get_config(), num_local_devices=1, num_processes=1)
    topology = validate(_cartpole(actor_device_ids=(0, 1), learner_device_ids=(2, 3, 4, 5, 6, 7),
                                  actor_threads_per_device=2, envs_per_actor_thread=12),
                        num_local_devices=8, num_processes=1)
    assert topology.num_actor_threads == 4


@pytest.mark.parametrize("overrides, field, words", [
    # The learner batch: each trajectory is split into one equal shard per learner device.
    ({"envs_per_actor_thread": 16, "learner_device_ids": (1, 2, 3)}, "envs_per_actor_thread",
     ["16 is not divisible", "3", "15 or 18"]),
    ({"learner_device_ids": (0, 8)}, "learner_device_ids", ["[8]", "only 8 device"]),
    ({"actor_device_ids": (9,)}, "actor_device_ids", ["[9]"]),
    ({"actor_threads_per_device": -1}, "actor_threads_per_device", [">= 0", "0 to derive"]),
    ({"envs_per_actor_thread": -32}, "envs_per_actor_thread", ["whole number", "-32"]),
    ({"env.num_threads": -2}, "env.num_threads", [">= 0"]),
    ({"env.batches": 0}, "env.batches", [">= 1", "got 0"]),
    ({"env.batches": 3, "envs_per_actor_thread": 32}, "env.batches",
     ["3 batches", "envs_per_actor_thread=32", "a divisor"]),
    ({"learner_device_ids": (1, 1)}, "learner_device_ids", ["twice"]),
    ({"env.task": "CartPol-v1"}, "env.task", ["not an envpool task", "CartPole-v1"]),
    ({"env.task": "Pong-v5", "env.protocol": "none"}, "env.protocol",
     ["unknown value", "impala", "machado"]),
    ({"env.protocol": "impala"}, "env.protocol", ["Atari tasks only"]),
    ({"env.task": "Pendulum-v1"}, "env.task", ["continuous actions"]),
    ({"staleness": "stale"}, "staleness", ["fixed", "latest"]),
    ({"policy_lag": -1}, "policy_lag", [">= 0"]),
    ({"queue_size": 0}, "queue_size", ["whole number >= 1"]),
    ({"rollout_length": 0}, "rollout_length", ["whole number >= 1"]),
    ({"agent.name": "ddqn_nstep"}, "agent.name", ["vtrace"]),
    # Checkpoints and evaluation.
    ({"checkpoint_every_updates": -1}, "checkpoint_every_updates", [">= 0", "-1"]),
    ({"checkpoint_keep": 0}, "checkpoint_keep", [">= 1"]),
    ({"eval_every_updates": -5}, "eval_every_updates", ["whole number", "-5"]),
    ({"eval_episodes": 0}, "eval_episodes", [">= 1"]),
    ({"eval_max_steps": True}, "eval_max_steps", ["whole number"]),
    ({"cpu_worker_threads": -2}, "cpu_worker_threads", ["whole number", "-2"]),
    # Set in Python, a misspelt field would be read by nothing.
    ({"actor_threads": 2}, "actor_threads",
     ["is not a field of Sebulba's config", "did you mean ", "actor_threads_per_device"]),
    ({"agent.entropy_cos": 0.01}, "agent.entropy_cos",
     ["is not a field of the 'vtrace' agent's config", "did you mean agent.entropy_cost?"]),
])
def test_bad_fields_are_named_with_a_fix(overrides, field, words):
    with pytest.raises(ConfigError) as info:
        validate(_cartpole(**overrides), num_local_devices=8, num_processes=1)
    assert info.value.field == field
    message = str(info.value)
    assert f"config.{field}" in message and "Fix:" in message
    for word in words:
        assert word in message


def test_unknown_envpool_option_is_reported():
    with pytest.raises(ConfigError) as info:
        validate(_cartpole(**{"env.kwargs": {"no_such_option": 3}}), num_local_devices=1,
                 num_processes=1)
    assert info.value.field == "env.kwargs"


def test_configs_without_the_checkpoint_and_eval_fields_get_their_defaults():
    config = sebulba_vtrace_cartpole.get_config()
    for field in ("checkpoint_every_updates", "checkpoint_keep", "eval_every_updates",
                  "eval_episodes", "eval_max_steps"):
        del config[field]
    validate(config, num_local_devices=1, num_processes=1)
    plan = sebulba_plan.make_plan(config)
    # sebulba.default_config()'s documented values: no periodic checkpoint or evaluation,
    # the newest 3 checkpoints kept, 32 episodes of at most 1,000 steps.
    assert (plan.checkpoint_every, plan.checkpoint_keep, plan.eval_every, plan.eval_episodes,
            plan.eval_max_steps) == (0, 3, 0, 32, 1000)


def test_evaluation_options_may_differ_only_where_the_spec_stays():
    config = sebulba_vtrace_atari.get_config()
    config.env.eval_kwargs.episodic_life = False  # whole games at evaluation: accepted
    validate(config, num_local_devices=1, num_processes=1)
    config.env.eval_kwargs.img_height = 42  # another observation shape: refused
    with pytest.raises(ConfigError, match=r"env\.eval_kwargs"):
        validate(config, num_local_devices=1, num_processes=1)


# THE SIZES DERIVED FROM THE MACHINE (sebulba.config.derive_sizes, docs/sebulba.md)


def _sizes(machine, **overrides):
    config = _cartpole(**overrides)
    return sebulba_config.resolve_sizes(config, machine)


def test_sizes_on_a_two_core_cpu_are_the_former_defaults():
    # The defaults before they were derived: device 0 acting and learning, 1 actor thread of
    # 32 environments, 1 envpool thread.
    sizes = _sizes(Machine(cores=2, platform="cpu", num_devices=1))
    assert sizes.fields() == {"actor_device_ids": (0,), "learner_device_ids": (0,),
                              "actor_threads_per_device": 1, "envs_per_actor_thread": 32,
                              "env.num_threads": 1}
    assert set(sizes.derived) == set(sebulba_config.SIZE_FIELDS)
    # Simulated CPU devices share the cores: still device 0 only.
    assert _sizes(Machine(cores=2, platform="cpu", num_devices=8)).fields() == sizes.fields()
    # A 16-core CPU: half the cores to envpool.
    assert _sizes(Machine(cores=16, platform="cpu", num_devices=1)).env_threads == 8


def test_atari_config_on_a_two_core_cpu_gives_each_pool_one_envpool_thread():
    # The Atari config sets 2 actor threads x 16 envs and leaves envpool's threads: 2 cores
    # // (2 x 1 device x 2 threads) = 0, at least 1 (measured as fast as envpool's own default
    # of 2 per pool, docs/benchmarks.md). Its 2 threads x 16 envs stay as set.
    sizes = sebulba_config.resolve_sizes(sebulba_vtrace_atari.get_config(),
                                         Machine(cores=2, platform="cpu", num_devices=1))
    assert sizes.fields() == {"actor_device_ids": (0,), "learner_device_ids": (0,),
                              "actor_threads_per_device": 2, "envs_per_actor_thread": 16,
                              "env.num_threads": 1}
    assert set(sizes.derived) == {"actor_device_ids", "learner_device_ids", "env.num_threads"}


def test_sizes_on_a_sixteen_core_host_with_one_gpu():
    sizes = _sizes(Machine(cores=16, platform="gpu", num_devices=1))
    # 16 cores // 8 = 2 threads; 128 envs each; envpool gets (16 - 2 threads - 1 learner) // 2.
    assert sizes.fields() == {"actor_device_ids": (0,), "learner_device_ids": (0,),
                              "actor_threads_per_device": 2, "envs_per_actor_thread": 128,
                              "env.num_threads": 6}


def test_sizes_on_eight_accelerators_and_explicit_fields():
    sizes = _sizes(Machine(cores=64, platform="gpu", num_devices=8))
    # 8 // 4 = 2 actor devices, 6 learners; 64 // (8 x 2) = 4 threads per actor device;
    # 128 rounded up to a multiple of 6 = 132; envpool (64 - 8 - 1) // 8 = 6.
    assert sizes.fields() == {"actor_device_ids": (0, 1), "learner_device_ids": (2, 3, 4, 5, 6, 7),
                              "actor_threads_per_device": 4, "envs_per_actor_thread": 132,
                              "env.num_threads": 6}
    # What the config sets is kept, and the rest follows from it: 1 thread on (0,) leaves
    # envpool (64 - 1 - 1) // 1 = 62 threads.
    sizes = _sizes(Machine(cores=64, platform="gpu", num_devices=8), actor_device_ids=(0,),
                   actor_threads_per_device=1)
    assert (sizes.actor_device_ids, sizes.learner_device_ids) == ((0,), (2, 3, 4, 5, 6, 7))
    assert (sizes.actor_threads_per_device, sizes.env_threads) == (1, 62)
    assert sizes.derived == ("learner_device_ids", "envs_per_actor_thread", "env.num_threads")


def test_validate_resolves_and_records_the_derived_sizes():
    machine = Machine(cores=16, platform="gpu", num_devices=1)
    topology = validate(_cartpole(), num_processes=1, machine=machine)
    assert topology.actor_threads_per_device == 2 and topology.environment.stepping.num_threads == 6
    config, _ = sebulba_config.resolved(_cartpole(), machine)
    assert (config.envs_per_actor_thread, config.env.num_threads) == (128, 6)
    # A resolved config resolves to itself.
    assert sebulba_config.resolve_sizes(config, Machine(2, "cpu", 1)).derived == ()


@pytest.mark.parametrize("sizes, learner_steps", [
    # 500,000 steps of T = 128: 8 envs on 1 thread on 1 device, ceil(500,000 / 1,024) = 489
    ({}, 489),
    # left to a 2-core CPU (1 thread x 32 envs): ceil(500,000 / 4,096) = 123
    ({"actor_threads_per_device": 0, "envs_per_actor_thread": 0}, 123),
    # two actor devices: ceil(500,000 / 2,048) = 245
    ({"actor_device_ids": (0, 1), "learner_device_ids": (2,)}, 245),
])
def test_a_schedule_over_the_run_follows_the_learner_steps_of_the_sizes_used(
        sizes, learner_steps, monkeypatch):
    # sebulba_ppo_cartpole anneals its step size over config.learner_steps, which the plan
    # counts from the sizes, devices and processes of the run (derived ones included).
    from experiments.configs import sebulba_ppo_cartpole
    from sebulba import plan as sebulba_plan

    monkeypatch.setattr(sebulba_plan, "detect", lambda: Machine(2, "cpu", 8))
    config = sebulba_ppo_cartpole.get_config()
    set_fields(config, sizes)
    plan = sebulba_plan.make_plan(config)
    assert plan.num_updates == learner_steps
    assert plan.config["learner_steps"] == plan.config["agent"]["anneal_lr_updates"] == learner_steps
    assert config.learner_steps == 0  # the caller's config unchanged
    config.learner_steps = 7
    with pytest.raises(ConfigError) as info:
        sebulba_plan.make_plan(config)
    assert info.value.field == "learner_steps"
    assert f"{learner_steps} for this run" in str(info.value)


def test_an_agent_rollout_length_not_tied_to_the_runners_is_refused():
    from agents import muzero

    config = _cartpole(agent=muzero.default_config(), rollout_length=8)
    assert config.agent.rollout_length == 16
    with pytest.raises(ConfigError) as info:
        validate(config, num_local_devices=1, num_processes=1)
    assert info.value.field == "agent.rollout_length"
    assert "is 16 but the runner's rollout_length is 8" in str(info.value)
    assert str(info.value).endswith(
        "Fix: set config.agent.rollout_length = config.get_ref('rollout_length')")
    config.agent.rollout_length = config.get_ref("rollout_length")
    validate(config, num_local_devices=1, num_processes=1)


def test_an_anakin_config_is_named_as_one_with_the_command_that_runs_it():
    from experiments.configs import vtrace_catch

    for check in (lambda c: validate(c, num_local_devices=1, num_processes=1),
                  sebulba_plan.make_plan):
        with pytest.raises(ConfigError, match=r"config.env.name: is a field of Anakin's config, "
                                              r"not Sebulba's.*python -m experiments.anakin"):
            check(vtrace_catch.get_config())
