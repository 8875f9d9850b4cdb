"""Number fields out of their range are refused before anything compiles, naming the field: each
agent's counts, rates, norms, fractions and loss weights (`podracer.config.check_numbers`), the
values of an Anakin sweep, the runners' sizes, counts and seeds (`require_numbers`), Anakin's
`env.kwargs` and Sebulba's `env.task`. Each value below was
accepted before these checks, and then either ran to the end unnoticed or failed while
compiling with an error naming no field."""

import math

import ml_collections
import pytest
from conftest import fail_if_anakin_builds_programs

import sebulba
from anakin import config as anakin_config
from experiments.configs import (dqn_catch, efficientzero_catch, muzero_catch, ppo_cartpole,
                                 pqn_cartpole, sampled_muzero_pendulum,
                                 sebulba_vtrace_cartpole, stochastic_muzero_catch, vtrace_catch)
from podracer.config import ConfigError, check_numbers

NAN = math.nan

BAD = [  # (config module, agent field, value): each out of what the field can hold
    (vtrace_catch, "max_grad_norm", -1.0),  # flips the gradient
    (vtrace_catch, "clip_rho_threshold", 0.0),
    (vtrace_catch, "adam_eps", -1.0),
    (vtrace_catch, "entropy_cost", NAN),
    (ppo_cartpole, "value_clip_eps", -1.0),
    (ppo_cartpole, "max_grad_norm", 0.0),
    (dqn_catch, "huber_delta", -1.0),
    (dqn_catch, "priority_exponent", -1.0),
    (dqn_catch, "epsilon_start", NAN),
    (pqn_cartpole, "epsilon_start", 1.5),
    (pqn_cartpole, "max_grad_norm", -1.0),
    (muzero_catch, "replay_capacity", 0),  # was a bare ValueError from the replay
    (muzero_catch, "batch_size", 0),  # was "zero-size array to reduction operation max"
    (muzero_catch, "updates_per_step", -1),  # was an MLIR error naming no field
    (muzero_catch, "unroll_steps", -1),  # was "integer modulo by zero"
    (muzero_catch, "reanalyse_fraction", 1.5),
    (muzero_catch, "dirichlet_alpha", -1.0),
    (muzero_catch, "target_update_interval", 0),
    (muzero_catch, "min_replay_items", 10 ** 7),  # more than the replay holds: never learns
    (efficientzero_catch, "lstm_size", 0),  # was a ZeroDivisionError in flax's initialiser
    (efficientzero_catch, "lars_momentum", 1.5),
    (efficientzero_catch, "refresh_batch", -1),
    (stochastic_muzero_catch, "encoder_hidden_sizes", (2.5,)),
    (sampled_muzero_pendulum, "entropy_cost", NAN),
]


@pytest.mark.parametrize("module,field,value", BAD,
                         ids=[f"{m.__name__.rsplit('.', 1)[1]}-{f}" for m, f, _ in BAD])
def test_a_number_out_of_range_is_refused_naming_its_field(monkeypatch, module, field, value):
    fail_if_anakin_builds_programs(monkeypatch)
    config = module.get_config()
    with config.agent.ignore_type():
        config.agent[field] = value
    with pytest.raises(ConfigError) as info:
        anakin_config.check(config, 1)
    assert info.value.field == f"agent.{field}", str(info.value)
    assert "Fix:" in str(info.value)


def test_every_shipped_config_passes_its_number_checks():
    for module in {m for m, _, _ in BAD}:
        anakin_config.check(module.get_config(), 1)


@pytest.mark.parametrize("kind,good,bad", [
    ("count", [1, 7], [0, -1, 2.5, True, "3", None]),
    ("whole", [0, 5], [-1, 0.5, None]),
    ("positive", [1e-9, 2, math.inf], [0, -1e-9, NAN, True, "1", None]),
    ("non_negative", [0, 0.0, 3], [-1e-9, NAN, None]),
    ("fraction", [0, 0.5, 1], [-0.1, 1.1, NAN]),
    ("finite", [-3.0, 0, 2], [NAN, math.inf, -math.inf, None]),
])
def test_check_numbers_kinds(kind, good, bad):
    for value in good:
        check_numbers(ml_collections.ConfigDict({"x": value}), "agent", {"x": (kind, 1)})
    for value in bad:
        with pytest.raises(ConfigError, match=r"config\.agent\.x: .*Fix: set e\.g\. "
                                              r"--config\.agent\.x=1"):
            check_numbers(ml_collections.ConfigDict({"x": value}), "agent", {"x": (kind, 1)})
    check_numbers(ml_collections.ConfigDict({}), "agent", {"x": (kind, 1)})  # absent: skipped


def test_a_swept_value_the_agent_refuses_names_the_sweep(monkeypatch):
    fail_if_anakin_builds_programs(monkeypatch)
    config = vtrace_catch.get_config()
    config.sweep.agent.discount = (0.99, 1.5)  # ran to the end before, with rc 0
    with pytest.raises(ConfigError) as info:
        anakin_config.check(config, 1)
    assert info.value.field == "sweep.agent.discount"
    assert "run 1's values" in str(info.value) and "agent.discount" in str(info.value)
    config.sweep.agent.discount = (0.99, 0.9)
    anakin_config.check(config, 1)


def test_an_environment_argument_it_does_not_take_names_env_kwargs(monkeypatch):
    fail_if_anakin_builds_programs(monkeypatch)
    config = vtrace_catch.get_config()
    config.env.kwargs = {"bogus": 1}  # was Catch's own TypeError
    with pytest.raises(ConfigError) as info:
        anakin_config.check(config, 1)
    assert info.value.field == "env.kwargs" and "bogus" in str(info.value)


@pytest.mark.parametrize("task", [None, 3, ""])
def test_a_sebulba_task_that_is_not_a_name_is_refused(task):
    config = sebulba_vtrace_cartpole.get_config()
    with config.env.ignore_type():
        config.env.task = task  # None was an AttributeError from the task parser
    with pytest.raises(ConfigError) as info:
        sebulba.validate(config)
    assert info.value.field == "env.task"


# A runner's counts set to a float or a negative number (as a config built from a dict, or
# `ignore_type`, lets through): the old checks took any number > 0 (or >= 0), and the float then
# reached a shape or a step count.
ANAKIN_BAD = [("rollout_length", 16.0), ("updates_per_chunk", 50.0), ("total_env_steps", 1e6),
              ("num_envs", 32.0), ("num_devices", 1.0), ("env.max_episode_steps", -1),
              ("seed", 0.5)]
SEBULBA_BAD = [("rollout_length", 32.0), ("queue_size", 1.5), ("log_every_updates", 2.5),
               ("policy_lag", 1.0), ("seed", -1)]


def _set_ignoring_type(config, field, value):
    *parents, name = field.split(".")
    for parent in parents:
        config = config[parent]
    with config.ignore_type():
        config[name] = value


@pytest.mark.parametrize("field,value", ANAKIN_BAD, ids=[f for f, _ in ANAKIN_BAD])
def test_an_anakin_count_that_is_not_whole_is_refused(monkeypatch, field, value):
    fail_if_anakin_builds_programs(monkeypatch)
    config = vtrace_catch.get_config()
    _set_ignoring_type(config, field, value)
    with pytest.raises(ConfigError, match="must be a whole number") as info:
        anakin_config.check(config, 1)
    assert info.value.field == field


@pytest.mark.parametrize("field,value", SEBULBA_BAD, ids=[f for f, _ in SEBULBA_BAD])
def test_a_sebulba_count_that_is_not_whole_is_refused(field, value):
    config = sebulba_vtrace_cartpole.get_config()
    _set_ignoring_type(config, field, value)
    with pytest.raises(ConfigError, match="must be a whole number") as info:
        sebulba.validate(config, num_local_devices=1, num_processes=1)
    assert info.value.field == field


@pytest.mark.parametrize("field", ["checkpoint_keep", "eval_episodes", "eval_max_steps"])
def test_a_negative_keep_or_episode_count_names_the_least_value_allowed(field):
    """-1 was refused as "must be a whole number >= 0", and 0 then as "must be >= 1"."""
    config = vtrace_catch.get_config()
    config[field] = -1
    with pytest.raises(ConfigError, match=r"must be a whole number >= 1, got -1"):
        anakin_config.check(config, 1)


# Fields whose None is a documented setting (`latent_size`: the observations' default width).
NONE_ALLOWED = {"latent_size"}
SHIPPED = [vtrace_catch, ppo_cartpole, dqn_catch, pqn_cartpole, muzero_catch,
           efficientzero_catch, stochastic_muzero_catch, sampled_muzero_pendulum]


@pytest.mark.parametrize("module", SHIPPED, ids=[m.__name__.rsplit(".", 1)[1] for m in SHIPPED])
def test_every_number_field_set_to_none_or_text_is_refused_naming_it(monkeypatch, module):
    """Each number field of each shipped agent config, set to None (a YAML `null`) or to
    text: a ConfigError naming that field (the agent's `rollout_length` names the runner's,
    which it is tied to). Some were a bare TypeError from a comparison inside a check."""
    fail_if_anakin_builds_programs(monkeypatch)
    fields = [name for name, value in module.get_config().agent.items()
              if isinstance(value, (int, float)) and not isinstance(value, bool)]
    assert len(fields) >= 8, fields
    for name in fields:
        for value in ({"x"} if name in NONE_ALLOWED else {None, "x"}):
            config = module.get_config()
            with config.agent.ignore_type():
                config.agent[name] = value
            with pytest.raises(ConfigError) as info:
                anakin_config.check(config, 1)
            expected = "rollout_length" if name == "rollout_length" else f"agent.{name}"
            assert info.value.field == expected, (name, value, str(info.value))


@pytest.mark.parametrize("field, value, fix", [
    ("env.batches", 0, "use 1 (one batch per actor thread) or 2 (two, stepped in turn)"),
    ("agent.support_bins", 1, "(steps of 0.1 for S = 10), or leave it None"),
    ("agent.logit_scale", 0.0, "logit_scale=1.0 (logits as the head computes them)"),
    ("agent.num_samples", 0, "num_samples=20 (the paper's)"),
])
def test_a_field_checked_by_the_shared_helpers_keeps_its_own_fix(field, value, fix):
    """Fields once checked by hand, now by `require_whole` and `require_positive_number`:
    the message is the helpers' and the fix still says what the value means."""
    from experiments.configs import sebulba_vtrace_cartpole

    module = {"env.batches": sebulba_vtrace_cartpole, "agent.support_bins": muzero_catch,
              "agent.logit_scale": vtrace_catch, "agent.num_samples": sampled_muzero_pendulum}
    config = module[field].get_config()
    group, name = field.split(".")
    config[group][name] = value
    with pytest.raises(ConfigError, match="must be a") as info:
        if field == "env.batches":
            sebulba.validate(config, num_local_devices=1, num_processes=1)
        else:
            anakin_config.check(config, 1)
    assert info.value.field == field
    assert f"got {value!r}. Fix: " in str(info.value) and fix in str(info.value)
