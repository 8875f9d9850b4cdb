"""A researcher's own agent and environment, registered from outside the packages.

`agents.register` makes an agent selectable exactly as a built-in one (`config.agent =
<default_config>()`) under both runners; a name registered twice is refused unless
`replace=True`; a replaced agent or environment is never served by a program compiled for
the one it replaced (the notebook's edit-and-rerun loop); and the resume declarations made at
registration (`choices=`, `introduced=`) decide what a run records and which workdirs resume.
"""

import copy

import jax
import pytest
from conftest import small_catch_config, strip_agent_field

import agents
import anakin
import envs_jax
import sebulba
from agents import vtrace
from experiments.configs import sebulba_vtrace_cartpole


def _my_config():
    config = vtrace.default_config()
    config.name = "my_vtrace"
    return config


def _my_make_agent(config, env_spec):
    return vtrace.make_agent(config, env_spec)


@pytest.fixture
def my_agent():
    agents.register("my_vtrace", _my_make_agent, default_config=_my_config, replace=True)
    yield
    agents._REGISTRY.pop("my_vtrace", None)


def test_builtin_agents_are_registered_through_the_same_call():
    assert {"vtrace", "muzero", "efficientzero", "ppo", "sampled_muzero"} <= set(
        agents.registered())
    assert agents.continuous_agents() == ["ppo", "sampled_muzero"]
    for name in ("vtrace", "muzero", "efficientzero", "ppo", "sampled_muzero"):
        assert agents.default_config(name).name == name


BUILTIN = ("vtrace", "ppo", "muzero", "gumbel_muzero", "efficientzero", "stochastic_muzero",
           "sampled_muzero", "dqn", "pqn")


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_agent_refuses_a_discount_outside_zero_to_one(name):
    from podracer.config import ConfigError

    assert set(BUILTIN) <= set(agents.registered())
    spec = envs_jax.make("Pendulum-v1" if name == "sampled_muzero" else "catch").spec()
    for discount in (1.5, -0.1):
        config = agents.default_config(name)
        config.discount = discount
        with pytest.raises(ConfigError, match=rf"config\.agent\.discount: must be a number in "
                                              rf"\[0, 1\], got {discount}"):
            agents.make(config, spec)
    config = agents.default_config(name)
    config.discount = 1.0  # undiscounted: allowed
    agents.make(config, spec)


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_agent_refuses_an_unknown_value_of_every_choice_field(name):
    # Every text field of an agent's default config (but `name`) is a choice among named
    # values; a value none of them is must be refused when the agent is made, as a ConfigError
    # naming the field, not as an error from inside a network or a learner's trace.
    from podracer.config import ConfigError

    spec = envs_jax.make("Pendulum-v1" if name == "sampled_muzero" else "catch").spec()
    fields = [k for k, v in agents.default_config(name).items()
              if isinstance(v, str) and k != "name"]
    assert fields
    for field in fields:
        config = agents.default_config(name)
        config[field] = "not_a_choice"
        with pytest.raises(ConfigError) as info:
            agents.make(config, spec)
        assert str(info.value).startswith(
            f"config.agent.{field}: unknown value 'not_a_choice'"), info.value


@pytest.mark.parametrize("name, field, value, says", [
    ("vtrace", "lambda_", 1.5, "must be a number in [0, 1], got 1.5"),
    ("ppo", "gae_lambda", -0.5, "must be a number in [0, 1], got -0.5"),
    ("ppo", "clip_eps", -0.2, "must be a positive number, got -0.2"),
    ("muzero", "num_simulations", 0, "must be a whole number >= 1, got 0"),
    ("gumbel_muzero", "num_simulations", 0, "must be a whole number >= 1, got 0"),
    ("efficientzero", "td_steps", 0, "must be a whole number >= 1, got 0"),
])
def test_an_agent_field_out_of_its_range_is_refused_naming_it(name, field, value, says):
    from podracer.config import ConfigError

    config = agents.default_config(name)
    config[field] = value
    with pytest.raises(ConfigError) as info:
        agents.make(config, envs_jax.make("catch").spec())
    assert str(info.value).startswith(f"config.agent.{field}: {says}. Fix: "), info.value


def test_a_name_registered_twice_is_refused_unless_replaced(my_agent):
    with pytest.raises(ValueError, match="already registered. Pass replace=True"):
        agents.register("my_vtrace", _my_make_agent, default_config=_my_config)
    before = agents.registration_id("my_vtrace")
    agents.register("my_vtrace", _my_make_agent, default_config=_my_config,
                    continuous_actions=True, replace=True)
    assert agents.registration_id("my_vtrace") != before
    assert agents.accepts_continuous_actions("my_vtrace")
    with pytest.raises(ValueError, match="already registered. Pass replace=True"):
        envs_jax.register("catch", envs_jax.Catch)


def test_a_registered_agent_trains_under_anakin_like_a_builtin_one(my_agent):
    config = small_catch_config()
    config.agent = _my_config()
    result = anakin.train(config)
    builtin = anakin.train(small_catch_config())
    # The same maths under another name: the same records (one compiled program each).
    assert [r["episode_return"] for r in result.history] == pytest.approx(
        [r["episode_return"] for r in builtin.history], rel=1e-5, abs=1e-6)
    # A sweep of its sweepable hyperparameters validates and runs too.
    config.sweep.seeds = (0, 1)
    config.sweep.agent.learning_rate = (1e-3, 3e-4)
    assert len(anakin.train(config).run_histories) == 2


def test_a_registered_agent_runs_under_sebulba(my_agent):
    config = sebulba_vtrace_cartpole.get_config()
    config.agent = _my_config()
    config.envs_per_actor_thread = 8
    config.rollout_length = 8
    config.total_env_steps = 8 * 8 * 6
    config.log_every_updates = 2
    config.eval_every_updates = 0
    config.checkpoint_every_updates = 0
    result = sebulba.train(config)
    assert result.final_metrics["updates"] == 6
    assert result.run_info["agent"] == "my_vtrace"


class _Scaled(envs_jax.Wrapper):
    """Catch with its rewards scaled: the edit a researcher makes between two runs."""

    def __init__(self, scale: float):
        super().__init__(envs_jax.Catch())
        self.scale = scale

    def step(self, state, action):
        state, timestep = self.env.step(state, action)
        return state, timestep.replace(reward=timestep.reward * self.scale)


def test_a_replaced_environment_is_not_served_by_the_program_compiled_for_the_old_one():
    envs_jax.register("scaled_catch", lambda: _Scaled(1.0), replace=True)
    try:
        # A learning rate too small to change an action: both runs act alike, step for step.
        config = small_catch_config(**{"env.name": "scaled_catch", "agent.learning_rate": 1e-9})
        first = anakin.train(config).history
        envs_jax.register("scaled_catch", lambda: _Scaled(10.0), replace=True)  # the "edit"
        second = anakin.train(config).history
    finally:
        envs_jax.registry._REGISTRY.pop("scaled_catch", None)
    # Same seeds, same actions: every record's mean return is the old one times ten (Catch's
    # are +-1 per episode). A reused program would give the old returns again.
    assert any(abs(r["episode_return"]) > 0.05 for r in first)
    assert [r["episode_return"] for r in second] == pytest.approx(
        [10 * r["episode_return"] for r in first], rel=1e-5)


def _constant_temperature_make_agent(config, env_spec):
    """V-trace whose actor parameters carry a constant beside the network's (as
    EfficientZero's carry a fixed acting temperature): `actor_params` returns a leaf that does
    not come from the learner state."""
    import jax.numpy as jnp

    base = vtrace.make_agent(config, env_spec)
    return base._replace(
        actor_params=lambda state: {"network": base.actor_params(state),
                                    "temperature": jnp.asarray(1.0, jnp.float32)},
        actor_step=lambda params, actor_state, timestep, key, evaluation=False:
            base.actor_step(params["network"], actor_state, timestep, key,
                            evaluation=evaluation))


def test_evaluation_of_a_sweep_takes_actor_params_per_run(monkeypatch):
    from anakin import runner
    from podracer import replication
    from podracer.session import eval_key

    def config_fn():
        config = _my_config()
        config.name = "constant_leaf"
        return config

    evaluated = []  # (params, keys) of each evaluation the runner dispatches
    compile_evaluator = runner._Programs.evaluator

    def recording(self, *args):
        fn = compile_evaluator(self, *args)

        def evaluate(params, keys):
            evaluated.append(jax.device_get((params, keys)))
            return fn(params, keys)
        return evaluate

    monkeypatch.setattr(runner._Programs, "evaluator", recording)
    agents.register("constant_leaf", _constant_temperature_make_agent,
                    default_config=config_fn, replace=True)
    try:
        config = small_catch_config(eval_every_updates=10)
        config.agent = config_fn()
        config.sweep.seeds = (0, 1)
        result = anakin.train(config)
    finally:
        agents._REGISTRY.pop("constant_leaf", None)
    # Evaluated after chunks 2 and 4, each run on its own: Catch's returns are in [-1, 1].
    for history in result.run_histories:
        evals = [r["eval_return"] for r in history if "eval_return" in r]
        assert len(evals) == 2 and all(-1.0 <= e <= 1.0 for e in evals)
    # The last evaluation took run r's own parameters after the last chunk, and run r's key.
    params, keys = evaluated[-1]
    updates = result.run_histories[0][-1]["updates"]
    final = replication.unreplicate(result.state.learner_state.params)
    for r, seed in enumerate((0, 1)):
        own = jax.tree.map(lambda x, r=r: x[r], final)
        for got, want in zip(jax.tree.leaves(params["network"]), jax.tree.leaves(own)):
            assert (got[r] == want).all()
        assert (keys[r] == eval_key(seed, updates)).all()
    assert params["temperature"].tolist() == [1.0, 1.0]


def test_a_registered_agent_checkpoints_and_resumes_like_a_builtin_one(my_agent, tmp_path):
    """Half the run, then the whole run on the same workdir: the second call resumes from the
    first's last checkpoint and ends where one uninterrupted run of the registered agent ends."""
    import numpy as np

    config = small_catch_config()
    config.agent = _my_config()
    whole = anakin.train(config)
    half = small_catch_config(total_env_steps=config.total_env_steps // 2)
    half.agent = _my_config()
    workdir = str(tmp_path / "run")
    anakin.train(half, workdir)
    resumed = anakin.train(config, workdir)
    assert resumed.resumed_from_updates == 2 * config.updates_per_chunk
    leaves = lambda r: jax.tree.leaves(r.params)
    for a, b in zip(leaves(resumed), leaves(whole), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


_RESEARCH_MODULE = '''
"""A researcher's script: registers an agent of its own, then trains it with Anakin."""
import sys

import jax

import agents
import anakin
from agents import vtrace
from experiments.configs import vtrace_catch


def default_config():
    config = vtrace.default_config()
    config.name = "my_vtrace"
    return config


agents.register("my_vtrace", lambda config, spec: vtrace.make_agent(config, spec),
                default_config=default_config)

if __name__ == "__main__":
    config = vtrace_catch.get_config()
    config.agent = default_config()
    config.num_envs, config.updates_per_chunk, config.total_env_steps = 64, 20, 2 * 64 * 20 * 20
    config.rollout_length = 20
    result = anakin.train(config, sys.argv[1])
    print(f"process {jax.process_index()} of {jax.process_count()}: {jax.device_count()} "
          f"devices, {result.final_metrics['updates']} updates")
'''


def test_a_registered_agent_runs_multi_process_from_the_researchers_own_module(tmp_path):
    """`experiments.launch --module=<their script>`: each process registers the agent on import
    and joins one 2-process x 2-device run of it."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "my_research.py").write_text(_RESEARCH_MODULE)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, str(tmp_path), env.get("PYTHONPATH", "")])
    workdir = str(tmp_path / "run")
    done = subprocess.run(
        [sys.executable, "-m", "experiments.launch", "--num_processes=2",
         "--cpu_devices_per_process=2", "--module=my_research", "--", workdir],
        cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    for process in (0, 1):
        assert f"process {process} of 2: 4 devices, 40 updates" in output, output[-3000:]
    with open(os.path.join(workdir, "config.json")) as f:
        assert json.load(f)["agent"]["name"] == "my_vtrace"


def test_the_agent_interface_holds_the_agents_functions_only():
    # What a run records and checks on resume is declared at registration, not on the Agent.
    from podracer import Agent

    assert Agent._fields == ("init", "actor_step", "learner_step", "init_actor_state",
                             "actor_params", "set_hparams", "sweepable")


def _evolving_config():
    """V-trace with two fields of the researcher's own: `width`, left to the agent ("auto"),
    and `gain`, added after runs were made without it (1.0 acts as the agent did before)."""
    config = vtrace.default_config()
    config.name = "evolving"
    config.width = "auto"
    config.gain = 1.0
    return config


def _evolving_make_agent(config, env_spec):
    resolved = copy.deepcopy(config)
    resolved.hidden_sizes = (_evolving_choices(config, env_spec).get("width", config.width),)
    resolved.learning_rate = config.learning_rate * config.gain
    return vtrace.make_agent(resolved, env_spec)


def _evolving_choices(config, env_spec):
    return {"width": 32} if config.width == "auto" else {}


@pytest.fixture
def evolving_agent():
    agents.register("evolving", _evolving_make_agent, default_config=_evolving_config,
                    choices=_evolving_choices, introduced={"gain": 1.0}, replace=True)
    yield
    agents._REGISTRY.pop("evolving", None)


def test_a_registered_agents_declarations_decide_what_is_recorded_and_resumed(evolving_agent,
                                                                             tmp_path):
    """A researcher's agent registered with `choices=` and `introduced=` resumes as a built-in
    one: its choices are recorded in place of "auto", and a workdir made before one of its
    fields existed resumes at the declared value and is refused at any other, naming it."""
    import json
    import shutil

    from podracer.workdir import ResumeError

    assert agents.choices(_evolving_config(), envs_jax.Catch().spec()) == {"width": 32}
    assert agents.introduced("evolving") == {"gain": 1.0}
    config = small_catch_config()
    config.agent = _evolving_config()
    half = small_catch_config(total_env_steps=config.total_env_steps // 2)
    half.agent = _evolving_config()
    workdir = str(tmp_path / "run")
    anakin.train(half, workdir)
    with open(f"{workdir}/config.json") as f:
        assert json.load(f)["agent"]["width"] == 32  # the choice, in place of "auto"
    # As if made by the agent's code before `gain` existed.
    strip_agent_field(workdir, "gain")
    other = str(tmp_path / "other")
    shutil.copytree(workdir, other)
    config.agent.gain = 2.0
    with pytest.raises(ResumeError) as info:
        anakin.train(config, other)
    assert "To resume it as it ran, pass --config.agent.gain=1.0." in str(info.value)
    config.agent.gain = 1.0
    resumed = anakin.train(config, workdir)
    assert resumed.resumed_from_updates == 2 * config.updates_per_chunk


def test_sebulba_records_a_registered_agents_choices_in_place_of_auto(evolving_agent):
    from sebulba.plan import make_plan

    config = sebulba_vtrace_cartpole.get_config()
    config.agent = _evolving_config()
    plan = make_plan(config)
    assert plan.config["agent"]["width"] == 32 and plan.config["agent"]["gain"] == 1.0


def test_an_agent_registered_without_declarations_declares_nothing(my_agent):
    assert agents.choices(_my_config(), envs_jax.Catch().spec()) == {}
    assert agents.introduced("my_vtrace") == {}
    with pytest.raises(TypeError, match="choices is a function"):
        agents.register("my_vtrace", _my_make_agent, default_config=_my_config,
                        choices={"width": 32}, replace=True)
    with pytest.raises(TypeError, match="introduced is a mapping"):
        agents.register("my_vtrace", _my_make_agent, default_config=_my_config,
                        introduced=[("gain", 1.0)], replace=True)
