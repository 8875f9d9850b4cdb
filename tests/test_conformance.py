"""The agent conformance check (`experiments.conformance`): every built-in agent passes it, and
agents broken on purpose, one rule each, fail it with a message naming that rule and its fix.

The broken agents wrap V-trace and break one thing each, as the rules state them (the module
docstring of `experiments.conformance`): float actions, an `actor_step` that reads the reward
Sebulba does not send, evaluation that samples, a replay period other than the runner's T, a
metric that is not a scalar or that is named like a runner's record field, a host callback
that cannot be vmapped, gradients not averaged over devices, a metric not averaged, a
`set_hparams` that sets nothing, a learner state holding a Python object, a learner step
that changes the state's dtypes, a non-finite loss, a `sweepable` without `set_hparams`.
Each is checked on its own rule (`rules=`); the sampling evaluation also goes through every
rule, to show that a break trips its own rule and no other, and float actions through every
rule, to show that the rules building on a failed one are skipped rather than failed again.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from agents import (
    efficientzero,
    gumbel_muzero,
    muzero,
    ppo,
    sampled_muzero,
    stochastic_muzero,
    vtrace,
)
from experiments import conformance
from experiments.conformance import RULE_NAMES, ConformanceError, check_agent
from podracer.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _small_muzero(module):
    config = module.default_config()
    config.hidden_sizes, config.latent_size = (16,), 16
    config.num_simulations, config.unroll_steps, config.td_steps = 2, 1, 2
    config.batch_size, config.replay_capacity, config.min_replay_items = 4, 16, 4
    config.updates_per_step = 1
    return config


def _small_efficientzero():
    config = _small_muzero(efficientzero)
    config.lstm_size, config.projection_hidden, config.projection_size = 8, 8, 8
    # No search inside the learner step (its default reanalyses every sample): the check
    # compiles the step six times, and a search in each took minutes on a 2-core machine.
    config.reanalyse_fraction = 0.0
    return config


def _small_stochastic_muzero():
    config = _small_muzero(stochastic_muzero)
    config.num_chance_outcomes, config.encoder_hidden_sizes = 2, (8,)
    # mctx's PUCT value term compiles faster inside the stochastic search than the tree's.
    config.q_transform, config.unvisited_q = "parent_and_siblings", "min"
    return config


def _small_sampled_muzero():
    config = _small_muzero(sampled_muzero)
    config.num_samples = 2
    return config


BUILTIN = {
    "vtrace": vtrace.default_config,
    "ppo": ppo.default_config,
    "muzero": lambda: _small_muzero(muzero),
    "gumbel_muzero": lambda: _small_muzero(gumbel_muzero),
    "efficientzero": _small_efficientzero,
    "stochastic_muzero": _small_stochastic_muzero,
    "sampled_muzero": _small_sampled_muzero,
}
# The environment each is checked on (default: Catch); Sampled MuZero acts in continuous
# action spaces only.
ENV = {"sampled_muzero": "Pendulum-v1"}


# The search agents compile a search in every rule, and their learner step in six: on the
# 2-core CI machine their full check takes 3-4 minutes each. Here they run every rule but the
# two that compile the learner step three more times (`set_hparams`, twice, and `vmap`, which
# MuZero's own sweep test covers: tests/test_muzero.py,
# test_hyperparameters_are_held_in_the_learner_state_and_sweepable); the full check is
# `python -m experiments.conformance --agent=muzero` (and efficientzero), run for the release
# notes.
# EfficientZero, the slowest to compile (203 s here for the rules below with replication,
# metrics_averaged and the Anakin chunk), also leaves out those three, and
# updates_change_params, which compiles the same replicated learner step: its Anakin and
# Sebulba learning tests (tests/test_efficientzero.py) run the chunk, the Sebulba update and
# replicated learner steps that learn, and it shares MuZero's replication code.
# Stochastic MuZero, whose search compiles both recurrent functions at every simulation (about
# 250 s here for every rule but set_hparams and vmap), leaves out those two, the four
# EfficientZero does, and checkpoint and sebulba_update: its learner state is MuZero's
# `LearnerState` and its learner loop and replication MuZero's, and its Anakin and Sebulba
# learning tests (tests/test_stochastic_muzero.py) run the chunk and the Sebulba update; the
# full check is `python -m experiments.conformance --agent=stochastic_muzero`.
# Sampled MuZero leaves out what MuZero does, with the same reasons (its learner update is
# MuZero's, called with its policy loss), and the Anakin chunk and the Sebulba update, which its
# learning tests (tests/test_sampled_muzero.py) run under both runners; `python -m
# experiments.conformance --agent=sampled_muzero --env=Pendulum-v1` runs every rule.
# Gumbel MuZero is MuZero with another search: its entry checks what the search changes
# (acting, evaluation, the Sebulba update's actor) and leaves the learner's rules, MuZero's own
# code, to MuZero's entry and the Anakin chunk to its learning test (tests/test_gumbel_muzero.py).
SKIPPED_HERE = {"muzero": ("set_hparams", "vmap"),
                "gumbel_muzero": ("set_hparams", "vmap", "updates_change_params", "replication",
                                  "metrics_averaged", "anakin_chunk", "checkpoint"),
                "stochastic_muzero": ("set_hparams", "vmap", "updates_change_params",
                                      "replication", "metrics_averaged", "anakin_chunk",
                                      "checkpoint", "sebulba_update"),
                "sampled_muzero": ("set_hparams", "vmap", "anakin_chunk", "sebulba_update"),
                "efficientzero": ("set_hparams", "vmap", "updates_change_params", "replication",
                                  "metrics_averaged", "anakin_chunk")}


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_builtin_agent_passes_every_rule(name):
    rules = [r for r in RULE_NAMES if r not in SKIPPED_HERE.get(name, ())]
    report = check_agent(name, config=BUILTIN[name](), rules=rules, env=ENV.get(name, "catch"))
    assert report.passed
    assert [r.rule for r in report.results] == rules
    # On two devices nothing is skipped, and the replication rules saw real updates.
    assert report.num_devices == 2
    assert all(r.status == "pass" for r in report.results), str(report)
    assert not any("inconclusive" in r.detail for r in report.results), str(report)


# ---------------------------------------------------------------------------------------------
# Broken agents: V-trace with one thing broken.


def _broken(change):
    """A make_agent: V-trace with the fields `change(agent)` returns replaced."""

    def make_agent(config, env_spec):
        agent = vtrace.make_agent(config, env_spec)
        return agent._replace(**change(agent))

    return make_agent


def _float_actions(agent):
    def actor_step(params, actor_state, timestep, key, *, evaluation=False):
        action, actor_state, extras = agent.actor_step(params, actor_state, timestep, key,
                                                       evaluation=evaluation)
        return action.astype(jnp.float32), actor_state, extras

    return {"actor_step": actor_step}


def _reads_reward(agent):
    def actor_step(params, actor_state, timestep, key, *, evaluation=False):
        action, actor_state, extras = agent.actor_step(params, actor_state, timestep, key,
                                                       evaluation=evaluation)
        return action, actor_state, {**extras, "reward": jnp.asarray(timestep.reward)}

    return {"actor_step": actor_step}


def _sampling_evaluation(agent):
    def actor_step(params, actor_state, timestep, key, *, evaluation=False):
        del evaluation  # samples always
        return agent.actor_step(params, actor_state, timestep, key)

    return {"actor_step": actor_step}


def _fixed_period(agent):
    def learner_step(state, trajectory, key, *, axis_name):
        if trajectory.action.shape[0] != 8:  # a replay whose windows hold 8 steps
            raise ConfigError("agent.rollout_length",
                              f"is 8 but the runner sends T={trajectory.action.shape[0]}",
                              "tie them")
        return agent.learner_step(state, trajectory, key, axis_name=axis_name)

    return {"learner_step": learner_step}


def _vector_metric(agent):
    def learner_step(state, trajectory, key, *, axis_name):
        state, metrics = agent.learner_step(state, trajectory, key, axis_name=axis_name)
        return state, {**metrics, "rewards": jnp.mean(trajectory.timestep.reward, axis=1)}

    return {"learner_step": learner_step}


def _reserved_metric(agent):
    def learner_step(state, trajectory, key, *, axis_name):
        state, metrics = agent.learner_step(state, trajectory, key, axis_name=axis_name)
        return state, {**metrics, "updates": state.updates.astype(jnp.float32)}

    return {"learner_step": learner_step}


def _ordered_callback(agent):
    def learner_step(state, trajectory, key, *, axis_name):
        state, metrics = agent.learner_step(state, trajectory, key, axis_name=axis_name)
        # Logs the loss on the host, in order: an effect jax.vmap cannot batch.
        jax.experimental.io_callback(lambda loss: None, None, metrics["loss"], ordered=True)
        return state, metrics

    return {"learner_step": learner_step}


def _unaveraged_gradients(agent):
    def learner_step(state, trajectory, key, *, axis_name):
        del axis_name  # each device learns alone
        return agent.learner_step(state, trajectory, key, axis_name=None)

    return {"learner_step": learner_step}


def _unaveraged_metric(agent):
    def learner_step(state, trajectory, key, *, axis_name):
        state, metrics = agent.learner_step(state, trajectory, key, axis_name=axis_name)
        # This device's mean action, not averaged over the devices.
        return state, {**metrics, "mean_action": jnp.mean(trajectory.action.astype(float))}

    return {"learner_step": learner_step}


def _ignored_hparams(agent):
    return {"set_hparams": lambda state, hparams: state}


def _python_object_in_state(agent):
    def learner_step(state, trajectory, key, *, axis_name):
        inner, metrics = agent.learner_step(state["state"], trajectory, key, axis_name=axis_name)
        return {"state": inner, "label": state["label"]}, metrics

    return {
        "init": lambda key, spec: {"state": agent.init(key, spec), "label": "my agent"},
        "actor_params": lambda state: agent.actor_params(state["state"]),
        "learner_step": learner_step,
        "set_hparams": lambda state, hparams: {
            "state": agent.set_hparams(state["state"], hparams), "label": state["label"]},
    }


def _layout_changing(agent):
    def learner_step(state, trajectory, key, *, axis_name):
        state, metrics = agent.learner_step(state, trajectory, key, axis_name=axis_name)
        return state.replace(updates=state.updates.astype(jnp.float32)), metrics

    return {"learner_step": learner_step}


def _sweepable_without_set_hparams(agent):
    return {"set_hparams": None}


def _non_finite_loss(agent):
    def learner_step(state, trajectory, key, *, axis_name):
        state, metrics = agent.learner_step(state, trajectory, key, axis_name=axis_name)
        return state, {**metrics, "loss": metrics["loss"] / 0.0}

    return {"learner_step": learner_step}


BROKEN = [
    # (rule, the break, a word of the fix the message must give)
    ("interface", _sweepable_without_set_hparams, "set_hparams"),
    ("actions", _float_actions, "int32"),
    ("acting_view", _reads_reward, "observation"),
    ("evaluation", _sampling_evaluation, "greedily"),
    ("rollout_length", _fixed_period, "rollout_length"),
    ("metrics", _vector_metric, "scalar"),
    ("metrics", _reserved_metric, "rename"),
    ("vmap", _ordered_callback, "vmap"),
    ("replication", _unaveraged_gradients, "pmean(grads"),
    ("metrics_averaged", _unaveraged_metric, "pmean(metrics"),
    ("set_hparams", _ignored_hparams, "learner state"),
    ("learner_state", _python_object_in_state, "closure"),
    ("checkpoint", _layout_changing, "dtypes"),
    ("anakin_chunk", _non_finite_loss, "NaN"),
    ("sebulba_update", _non_finite_loss, "Sebulba"),
]


@pytest.mark.parametrize("rule, change, fix", BROKEN,
                         ids=[f"{rule}-{change.__name__[1:]}" for rule, change, _ in BROKEN])
def test_an_agent_broken_on_one_rule_fails_it_naming_the_rule_and_the_fix(rule, change, fix):
    with pytest.raises(ConformanceError) as caught:
        check_agent(_broken(change), config=vtrace.default_config(), rules=[rule])
    error = caught.value
    assert error.rules == [rule]
    message = str(error)
    assert f"rule {rule!r} failed" in message
    assert "fix: " in message and fix in message.split("fix: ", 1)[1], message


def test_a_broken_agent_trips_its_own_rule_and_no_other():
    report = check_agent(_broken(_sampling_evaluation), config=vtrace.default_config(),
                         raise_on_failure=False)
    assert not report.passed
    assert [r.rule for r in report.results if r.status == "fail"] == ["evaluation"], str(report)


def test_rules_that_build_on_a_failed_rule_are_skipped_naming_it():
    # Trajectories need valid actions: with float actions the rules that make them are not run.
    report = check_agent(_broken(_float_actions), config=vtrace.default_config(),
                         raise_on_failure=False)
    status = {r.rule: r.status for r in report.results}
    assert [rule for rule, s in status.items() if s == "fail"] == ["actions"], str(report)
    assert status["interface"] == status["learner_state"] == status["acting_view"] == "pass"
    skipped = [r for r in report.results if r.status == "skip"]
    assert {r.rule for r in skipped} == set(RULE_NAMES) - {"interface", "learner_state",
                                                           "actions", "acting_view"}
    assert all("builds on" in r.detail for r in skipped)


# ---------------------------------------------------------------------------------------------
# The check's own interface.


def test_the_replication_rules_are_skipped_with_a_note_on_one_device():
    report = check_agent("vtrace", num_devices=1,
                         rules=["interface", "replication", "metrics_averaged"])
    assert report.passed
    assert [(r.rule, r.status) for r in report.results] == [
        ("interface", "pass"), ("replication", "skip"), ("metrics_averaged", "skip")]
    assert "at least 2 devices" in report.result("replication").detail


def test_a_make_agent_needs_its_config_and_rules_are_named():
    with pytest.raises(TypeError, match="needs the agent's config"):
        check_agent(vtrace.make_agent)
    with pytest.raises(ValueError, match="Unknown rules"):
        check_agent("vtrace", rules=["no_such_rule"])
    with pytest.raises(KeyError, match="Unknown agent"):
        check_agent("no_such_agent")


def test_the_command_line_prints_one_line_per_rule(capsys):
    status = conformance.main(["--agent=vtrace", "--rules=interface,actions,metrics"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert status == 0
    assert lines[0].startswith("Agent 'vtrace' on 'catch'")
    assert lines[1:] == ["PASS  interface", "PASS  actions", "PASS  metrics"]


_MODULE = '''
import agents
from agents import vtrace


def default_config():
    config = vtrace.default_config()
    config.name = "researchers_vtrace"
    return config


agents.register("researchers_vtrace", vtrace.make_agent, default_config=default_config,
                replace=True)
'''


def test_the_command_line_checks_an_agent_registered_by_a_module(tmp_path, monkeypatch, capsys):
    (tmp_path / "researchers_agent.py").write_text(_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import agents

    try:
        status = conformance.main(["--module=researchers_agent", "--agent=researchers_vtrace",
                                   "--rules=interface"])
    finally:
        agents._REGISTRY.pop("researchers_vtrace", None)
    lines = capsys.readouterr().out.strip().splitlines()
    assert status == 0
    assert lines == ["Agent 'researchers_vtrace' on 'catch', 2 device(s): conforms",
                     "PASS  interface"]


def test_the_command_line_names_the_registered_agents_and_module_for_an_unknown_one(capsys):
    with pytest.raises(SystemExit) as caught:
        conformance.main(["--agent=ddqn_nstep"])
    assert caught.value.code == 2
    error = capsys.readouterr().err
    assert "--agent=ddqn_nstep" in error
    assert all(name in error for name in ("vtrace", "muzero", "efficientzero", "ppo"))
    assert "--module=" in error
    with pytest.raises(SystemExit):
        conformance.main(["--module=no_such_module_here", "--agent=vtrace"])
    assert "--module=no_such_module_here: cannot import it" in capsys.readouterr().err


_FAILING_MODULE = '''
import agents
from agents import vtrace


def make_agent(config, env_spec):
    agent = vtrace.make_agent(config, env_spec)

    def actor_step(params, actor_state, timestep, key, *, evaluation=False):
        raise RuntimeError("a bug of the agent's own")

    return agent._replace(actor_step=actor_step)


def default_config():
    config = vtrace.default_config()
    config.name = "failing_vtrace"
    return config


agents.register("failing_vtrace", make_agent, default_config=default_config)
'''


def test_the_command_as_a_researcher_runs_it_reports_a_rule_that_raised(tmp_path):
    # As a process (`python -m`): the module runs as __main__, so what main() calls must be
    # defined before the module's end.
    (tmp_path / "failing_agent.py").write_text(_FAILING_MODULE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    done = subprocess.run(
        [sys.executable, "-m", "experiments.conformance", "--module=failing_agent",
         "--agent=failing_vtrace", "--rules=interface,actions"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[1] == "PASS  interface"
    assert lines[2].startswith("FAIL  actions") and "RuntimeError: a bug of the agent's own" in (
        done.stdout)


def test_the_command_line_refuses_an_unknown_rule_or_environment(capsys):
    with pytest.raises(SystemExit) as caught:
        conformance.main(["--agent=vtrace", "--rules=interface,vmapp"])
    assert caught.value.code == 2
    assert "--rules: no rule named vmapp" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        conformance.main(["--agent=vtrace", "--env=catchh"])
    assert caught.value.code == 2
    assert "--env=catchh: Unknown environment 'catchh'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Agents that never update inside the check: V-trace behind a warm-up its tiny trajectories do
# not reach. The check before `updates_change_params` passed them (replication "inconclusive").


def _warming_up(*, field, units=1, averaged=True):
    """A make_agent: V-trace that skips its update until it has seen `config.<field> * units`
    transitions (2,000 when `field` is None: a warm-up the config does not hold), with the
    gradient pmean removed when not `averaged`."""

    def make_agent(config, env_spec):
        inner = vtrace.make_agent(config, env_spec)
        warmup = 2_000 if field is None else config[field] * units

        def learner_step(state, trajectory, key, *, axis_name):
            seen = state["seen"] + trajectory.action.size  # T * B transitions
            step = lambda s: inner.learner_step(
                s, trajectory, key, axis_name=axis_name if averaged else None)[0]
            inner_state = jax.lax.cond(seen >= warmup, step, lambda s: s, state["state"])
            return {"state": inner_state, "seen": seen}, {"seen": seen.astype(jnp.float32)}

        return inner._replace(
            init=lambda key, spec: {"state": inner.init(key, spec),
                                    "seen": jnp.zeros((), jnp.int32)},
            learner_step=learner_step,
            actor_params=lambda state: inner.actor_params(state["state"]),
            set_hparams=None, sweepable=())

    return make_agent


def _warmup_config(field, value=2_000):
    config = vtrace.default_config()
    if field is not None:
        config[field] = value
    return config


# The rules up to the replication ones: what an agent that never updates slipped through.
_UP_TO_REPLICATION = ("interface", "learner_state", "actions", "rollout_length", "metrics",
                      "updates_change_params", "replication", "metrics_averaged")


@pytest.mark.parametrize("field, units, named", [
    (None, 1, "apply the optimiser's update"),  # a warm-up the check cannot see
    ("warmup", 100, "agent.warmup"),  # counted in hundreds: lowered to 16, still not reached
], ids=["hidden_warmup", "warmup_in_other_units"])
def test_an_agent_that_never_updates_fails_updates_change_params(field, units, named):
    rules = [r for r in RULE_NAMES if r in _UP_TO_REPLICATION]
    with pytest.raises(ConformanceError) as caught:
        check_agent(_warming_up(field=field, units=units), config=_warmup_config(field),
                    rules=rules)
    message = str(caught.value)
    assert caught.value.rules == ["updates_change_params"], message
    assert "rule 'updates_change_params' failed: the actor parameters never changed over 8 " \
           "learner steps" in message
    assert named in message.split("fix: ", 1)[1], message


def test_a_warmup_field_is_lowered_so_that_replication_sees_the_pmean_removed():
    make_agent = _warming_up(field="learning_starts", averaged=False)
    report = check_agent(make_agent, config=_warmup_config("learning_starts"),
                         rules=[r for r in RULE_NAMES if r in _UP_TO_REPLICATION],
                         raise_on_failure=False)
    assert "agent.learning_starts = 16 (was 2000)" in str(report), str(report)
    assert [r.rule for r in report.results if r.status == "fail"] == ["replication"], str(report)
    assert "pmean(grads" in report.result("replication").fix
    # Averaged, the same agent conforms, updating as soon as the lowered warm-up is reached:
    # 16 transitions per learner step, so at the first.
    report = check_agent(_warming_up(field="learning_starts"),
                         config=_warmup_config("learning_starts"),
                         rules=["rollout_length", "updates_change_params", "replication"])
    assert report.passed
    assert report.result("updates_change_params").detail == (
        "the actor parameters changed at learner step 1 (the check set agent.learning_starts = "
        "16 (was 2000))")


def _replay_of_period(config, env_spec):
    """V-trace with a replay-like period `config.rollout_length` that, untied, fails as a
    replay does: with a ValueError that names neither the config field nor the tie."""
    agent = vtrace.make_agent(config, env_spec)

    def learner_step(state, trajectory, key, *, axis_name):
        t = trajectory.action.shape[0]
        if t != config.rollout_length:
            raise ValueError(f"adding {t} timesteps per column to a replay of period "
                             f"{config.rollout_length}")
        return agent.learner_step(state, trajectory, key, axis_name=axis_name)

    return agent._replace(learner_step=learner_step)


def test_an_untied_rollout_length_must_fail_naming_the_field():
    config = vtrace.default_config()
    config.rollout_length = 16
    with pytest.raises(ConformanceError) as caught:
        check_agent(_replay_of_period, config=config, rules=["rollout_length"])
    message = str(caught.value)
    assert caught.value.rules == ["rollout_length"]
    assert ("with agent.rollout_length = 8 and the runner's T = 4 (a config without the tie), "
            "learner_step fails with ValueError: adding 4 timesteps per column to a replay of "
            "period 8, which does not name config.agent.rollout_length") in message, message
    assert "ConfigError('agent.rollout_length'" in message.split("fix: ", 1)[1]
    # MuZero's learner_step names the field.
    report = check_agent("muzero", config=_small_muzero(muzero), rules=["rollout_length"])
    assert report.result("rollout_length").detail.endswith("learner_step names the field")
