"""`anakin.default_config()` and `sebulba.default_config()`, and the experiment configs built on
them.

Every field a default config holds is either required by its runner's validator (deleting it
fails validation naming it) or an optional field whose absence the runner reads as the same
value (the fields older configs lacked). Every shipped config holds exactly its runner's fields
and sets an agent, and is short: the runner's fields live in one place, not in each file.
"""

import ast
import copy
import importlib
import io
import pathlib
import tokenize

import ml_collections
import pytest

import anakin
import sebulba
from agents import vtrace
from anakin.config import sweep_runs
from podracer import metrics, workdir
from podracer.config import RUN_OPTION_DEFAULTS, ConfigError, run_option

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "experiments" / "configs"
MAX_CODE_LINES = 30
# Files allowed more code lines, and why (the excess is not runner fields).
LONGER = {"efficientzero_atari100k.py": "the paper's Atari 100k agent hyperparameters"}
# Fields whose contents are free-form (options passed on, swept agent fields): a config may add
# entries to them, so they count as one field each.
OPEN = ("env.kwargs", "env.eval_kwargs", "sweep.agent")

# The optional fields, and how the runner reads each one: a config without the field runs as
# one with its `default_config()` value.
_RUN_OPTIONS = {field: (lambda c, f=field: run_option(c, f)) for field in RUN_OPTION_DEFAULTS}
_ALLOWED_CHANGES = {  # read when resuming, by `podracer.workdir`, from the resolved config
    "resume_allow_changes": lambda c: workdir.allowed_changes(metrics.config_to_dict(c))}
# Set by the runner (`podracer.config.with_run_figures`); a config without it is given it.
_LEARNER_STEPS = {"learner_steps": lambda c: c.get("learner_steps", 0)}
OPTIONAL = {
    "anakin": {
        **_RUN_OPTIONS, **_ALLOWED_CHANGES, **_LEARNER_STEPS,
        "env.kwargs": lambda c: dict(c.env.get("kwargs", {})),  # validate, runner
        "env.frame_stack": lambda c: c.env.get("frame_stack", 1),  # validate
        "sweep.seeds": sweep_runs,
        "sweep.agent": sweep_runs,
    },
    "sebulba": {
        **_RUN_OPTIONS, **_ALLOWED_CHANGES, **_LEARNER_STEPS,
        "env.kwargs": lambda c: dict(c.env.get("kwargs", {})),  # validate, runner
        "env.eval_kwargs": lambda c: dict(c.env.get("eval_kwargs", {})),  # validate, runner
        "env.num_workers": lambda c: c.env.get("num_workers", 0),  # validate (gymnasium tasks)
        "env.autoreset_mode": lambda c: c.env.get("autoreset_mode", "next_step"),  # validate
        "env.batches": lambda c: c.env.get("batches", 1),  # validate, plan
        "save_final_params": lambda c: c.get("save_final_params", False),  # runner
    },
}


def _default(runner: str) -> ml_collections.ConfigDict:
    config = {"anakin": anakin.default_config, "sebulba": sebulba.default_config}[runner]()
    config.agent = vtrace.default_config()
    return config


def _validate(runner: str, config: ml_collections.ConfigDict) -> None:
    if runner == "anakin":
        anakin.validate(config, 8)
    else:
        sebulba.validate(config, num_local_devices=1, num_processes=1)


def _fields(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    """Paths of the runner's fields: all but `agent`, nested ConfigDicts descended except
    the OPEN ones."""
    paths = []
    for key, value in config.items():
        path = prefix + key
        if path == "agent":
            continue
        if isinstance(value, ml_collections.ConfigDict) and path not in OPEN:
            paths += _fields(value, path + ".")
        else:
            paths.append(path)
    return paths


def _without(config: ml_collections.ConfigDict, path: str) -> ml_collections.ConfigDict:
    config = copy.deepcopy(config)
    *parents, leaf = path.split(".")
    node = config
    for parent in parents:
        node = node[parent]
    del node[leaf]
    return config


@pytest.mark.parametrize("runner", ["anakin", "sebulba"])
def test_default_config_validates_once_an_agent_is_set(runner):
    _validate(runner, _default(runner))


@pytest.mark.parametrize("runner", ["anakin", "sebulba"])
def test_an_unset_agent_is_named_with_the_fix(runner):
    config = _default(runner)
    config.agent = None
    with pytest.raises(ConfigError) as info:
        _validate(runner, config)
    assert info.value.field == "agent"
    assert "vtrace.default_config()" in str(info.value) and "ppo" in str(info.value)


@pytest.mark.parametrize("runner", ["anakin", "sebulba"])
def test_each_default_field_is_required_or_read_as_its_default_when_absent(runner):
    config = _default(runner)
    fields = _fields(config)
    optional = OPTIONAL[runner]
    assert set(optional) <= set(fields), "OPTIONAL names a field the default config lacks"
    for path in fields:
        without = _without(config, path)
        if path in optional:
            _validate(runner, without)
            assert optional[path](without) == optional[path](config), path
        else:
            with pytest.raises(ConfigError) as info:
                _validate(runner, without)
            assert info.value.field == path


@pytest.mark.parametrize("runner", ["anakin", "sebulba"])
def test_default_run_options_are_the_values_of_configs_without_them(runner):
    config = _default(runner)
    assert {field: config[field] for field in RUN_OPTION_DEFAULTS} == RUN_OPTION_DEFAULTS


def _config_files() -> list[pathlib.Path]:
    return sorted(p for p in CONFIGS.glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", _config_files(), ids=lambda p: p.name)
def test_shipped_config_holds_its_runners_fields_and_an_agent(path):
    config = importlib.import_module(f"experiments.configs.{path.stem}").get_config()
    assert config.agent is not None and config.agent.name
    fields = set(_fields(config))
    assert fields in (set(_fields(_default("anakin"))), set(_fields(_default("sebulba"))))


def _code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    not_code = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in not_code:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_code_lines_counts_code_only():
    source = '"""Doc.\n\nMore doc.\n"""\n\n# comment\nx = (1,\n     2)  # why\n\n\ndef f():\n' \
             '    """Doc."""\n    return x\n'
    assert _code_lines(source) == 4


@pytest.mark.parametrize("path", _config_files(), ids=lambda p: p.name)
def test_shipped_config_is_short(path):
    lines = _code_lines(path.read_text())
    if path.name in LONGER:
        assert lines > MAX_CODE_LINES, f"{path.name} fits now: remove it from LONGER"
    else:
        assert lines <= MAX_CODE_LINES, f"{path.name} has {lines} lines of code"
