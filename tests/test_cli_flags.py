"""`experiments._cli.parse_flags`, the entry points' flag parser, on a config file of its own:
bad flags are refused in one line with exit status 2, and agent fields sweep from the command
line."""

import os
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from experiments import _cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ml_collections loads config files with importlib's load_module, deprecated since Python 3.10.
pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")

CONFIG = '''
import ml_collections

def get_config():
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.total_env_steps = 1000
    config.agent = ml_collections.ConfigDict()
    config.agent.learning_rate = 1e-3
    config.agent.discount = 0.99
    config.sweep = ml_collections.ConfigDict()
    config.sweep.seeds = ()
    config.sweep.agent = ml_collections.ConfigDict()
    return config
'''


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.py"
    path.write_text(CONFIG)
    return str(path)


def _parse(*args):
    """(the parsed config, the arguments left) from a FlagValues of its own, as a command with
    `--config` and `--workdir` flags (lock_config=True, as experiments.anakin's) parses them."""
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "config", flag_values=values,
                                    lock_config=True)
    flags.DEFINE_string("workdir", None, "workdir", flag_values=values)
    rest = _cli.parse_flags(["prog", *args], flag_values=values)
    return values["config"].value, rest


def _refused(capsys, *args) -> str:
    with pytest.raises(SystemExit) as exit_:
        _parse(*args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_overrides_and_other_flags_parse_as_absl_and_ml_collections_parse_them(config_file):
    config, rest = _parse(f"--config={config_file}", "--config.seed=3",
                          "--config.agent.learning_rate", "3e-4", "--workdir=/w", "--", "x")
    assert (config.seed, config.agent.learning_rate) == (3, 3e-4)
    assert rest == ["prog", "x"]


@pytest.mark.parametrize("override, expected", [
    ("--config.total_steps=10", "no field config.total_steps (did you mean "
                                "config.total_env_steps?)"),
    ("--config.agent.learning_rat=1", "no field config.agent.learning_rat (did you mean "
                                      "config.agent.learning_rate?)"),
    ("--config.agent.momentum=1", "no field config.agent.momentum (config.agent has discount, "
                                  "learning_rate)"),
    ("--config.seed.value=1", "config.seed is a value (0), not a group of fields"),
])
def test_an_override_of_a_field_the_config_lacks_names_what_it_has(capsys, config_file,
                                                                  override, expected):
    err = _refused(capsys, f"--config={config_file}", override)
    assert override.split("=")[0] in err and expected in err


def test_an_unparsable_value_an_unknown_flag_and_a_missing_file_are_refused(capsys, tmp_path,
                                                                            config_file):
    assert "config.seed=abc" in _refused(capsys, f"--config={config_file}", "--config.seed=abc")
    assert "'bogus'" in _refused(capsys, f"--config={config_file}", "--bogus")
    missing = str(tmp_path / "nope.py")
    assert repr(missing) in _refused(capsys, f"--config={missing}")


def test_a_missing_required_config_says_what_to_give(capsys):
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "config", flag_values=values)
    flags.mark_flags_as_required(["config"], flag_values=values)
    with pytest.raises(SystemExit) as exit_:
        _cli.parse_flags(["prog"], flag_values=values)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --config is required: the experiment's config file. Fix: "
                          "add --config=experiments/configs/<name>.py"), err
    assert err.count("\n") == 1, err


def test_an_agent_field_sweeps_from_the_command_line(config_file):
    config, _ = _parse(f"--config={config_file}", "--config.sweep.agent.learning_rate=(1e-3, 3e-4)",
                       "--config.sweep.agent.discount", "[0.9, 0.99]")
    assert config.sweep.agent.learning_rate == (1e-3, 3e-4)
    assert config.sweep.agent.discount == (0.9, 0.99)
    with pytest.raises(AttributeError, match="locked"):  # the config stays locked
        config.sweep.agent.entropy_cost = (0.1, 0.2)


def test_a_sweep_that_does_not_read_or_has_nowhere_to_go_is_refused(capsys, tmp_path,
                                                                    config_file):
    err = _refused(capsys, f"--config={config_file}", "--config.sweep.agent.learning_rate=abc")
    assert "config.sweep.agent.learning_rate: cannot read 'abc'" in err
    no_sweep = tmp_path / "no_sweep.py"
    no_sweep.write_text(CONFIG.replace("    config.sweep", "    # config.sweep"))
    err = _refused(capsys, f"--config={no_sweep}", "--config.sweep.agent.learning_rate=(1, 2)")
    assert "this config has no sweep.agent" in err


def test_a_command_without_a_config_flag_refuses_a_value_out_of_bounds(capsys):
    values = flags.FlagValues()
    flags.DEFINE_integer("num_processes", 2, "processes", lower_bound=1, flag_values=values)
    assert _cli.parse_flags(["prog", "--num_processes=3", "--", "--config.x=1"],
                            flag_values=values) == ["prog", "--config.x=1"]
    with pytest.raises(SystemExit) as exit_:
        _cli.parse_flags(["prog", "--num_processes=0"], flag_values=values)
    assert exit_.value.code == 2
    assert "--num_processes=0: 0 is not a positive integer" in capsys.readouterr().err


def test_the_launcher_refuses_a_module_that_is_not_there():
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.launch", "--module=experiments.anakinn", "--",
         "--config=experiments/configs/vtrace_catch.py"], cwd=ROOT, capture_output=True,
        text=True, timeout=120, check=False,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: --module=experiments.anakinn: no such module")


def _define_default(capsys, config_file, *args):
    """`_cli.define_config_file` with `config_file` as the default, as a benchmark defines its
    `--config`, then `parse_flags`, for the command line `prog *args`: (the config, or the exit
    status; stderr)."""
    values = flags.FlagValues()
    try:
        _cli.define_config_file(config_file, "config", flag_values=values,
                                argv=["prog", *args])
        _cli.parse_flags(["prog", *args], flag_values=values)
    except SystemExit as exit_:
        return exit_.code, capsys.readouterr().err
    return values["config"].value, capsys.readouterr().err


def test_a_default_config_file_takes_overrides_and_refuses_bad_ones_in_one_line(capsys,
                                                                                config_file):
    # With a default file and no --config, ml_collections applies the overrides as the flag is
    # defined, before parse_flags runs: the refusal has to happen there.
    config, _ = _define_default(capsys, config_file, "--config.seed=3")
    assert config.seed == 3
    for override, expected in [
            ("--config.total_steps=10", "no field config.total_steps (did you mean "
                                        "config.total_env_steps?)"),
            ("--config.seed=abc", "--config.seed=abc: invalid literal for int()")]:
        status, err = _define_default(capsys, config_file, override)
        assert status == 2
        assert err.startswith("error: ") and err.count("\n") == 1 and expected in err, err


def test_a_benchmark_refuses_a_mistyped_override_of_its_default_config():
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.benchmarks.anakin", "--config.total_steps=10"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: --config.total_steps: the config has no field "
                                  "config.total_steps (did you mean config.total_env_steps")
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_every_command_parses_its_flags_with_parse_flags():
    # A command on absl's own parser answers a bad flag with "FATAL Flags parsing error" and
    # exit status 1; on parse_flags, one line and status 2, as every entry point documents.
    import glob

    commands = [path for path in glob.glob(os.path.join(ROOT, "experiments", "**", "*.py"),
                                           recursive=True)
                if "app.run(" in open(path).read()]
    assert len(commands) >= 20, commands
    on_absl = [os.path.relpath(path, ROOT) for path in commands
               if "app.run(main, flags_parser=_cli.parse_flags)" not in open(path).read()]
    assert not on_absl, on_absl
