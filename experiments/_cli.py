"""What the experiment entry points share: quiet logging, joining a multi-process run, and
turning the ways a run ends into exit statuses and one clear message; `parse_flags`, the
flag parser of a command with an `ml_collections` `--config`.

    0    done
    1    failed (a thread or device error; a NaN or inf loss or parameter, named by update)
    2    refused before it started: a bad flag or config field, PODRACER_* variables that
         cannot be meant, an unusable --workdir, a workdir holding a checkpoint of a different
         run, or one locked by a run that is still alive (nothing in the workdir was changed)
    143  stopped by SIGTERM after saving a checkpoint (128 + SIGTERM): rerun to resume
    130  stopped by Ctrl-C (SIGINT) after saving a checkpoint: rerun to resume (a second
         Ctrl-C stops at once, without one)
"""

from __future__ import annotations

import ast
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections
from absl import flags, logging
from ml_collections import config_flags

from podracer import distributed
from podracer.config import ConfigError, did_you_mean
from podracer.faults import NonFiniteError
from podracer.workdir import WorkdirError


def _leave(status: int, multiprocess: bool) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    if multiprocess:
        # A process that ends early must not wait in jax.distributed's shutdown barrier for
        # peers that may be blocked in a collective: leave at once.
        os._exit(status)
    sys.exit(status)


def run(train: Callable[..., Any], config: Any, workdir: str | None) -> None:
    """Calls `train(config, workdir)` and exits with the status its ending calls for."""
    if not flags.FLAGS["verbosity"].present:
        # absl logs INFO to stderr by default, and orbax logs every step of every save there:
        # keep the console to progress and warnings unless --verbosity asks for more.
        logging.set_verbosity(logging.WARNING)
    try:
        multiprocess = distributed.initialize_from_env()
    except distributed.LaunchError as error:
        _refuse(str(error))
    try:
        result = train(config, workdir)
    except (ConfigError, WorkdirError) as error:
        print(f"error: {error}", file=sys.stderr)
        _leave(2, multiprocess)
    except NonFiniteError as error:
        print(f"error: {error}", file=sys.stderr)
        _leave(1, multiprocess)
    except BaseException:
        if not multiprocess:
            raise
        traceback.print_exc()
        # A collective that failed because a peer died surfaces here first; give the
        # watchdog the time it needs to confirm the loss and name the lost process.
        distributed.wait_for_watchdog()
        _leave(1, multiprocess)
    if result.interrupted:
        _leave(128 + (result.signal_received or signal.SIGTERM), multiprocess)


# ---------------------------------------------------------------------------------------------
# Flags.

_SWEEP_AGENT = re.compile(r"^--?config\.sweep\.agent\.([A-Za-z_]\w*)(?:=(.*))?$", re.S)
_OVERRIDE = re.compile(r"^--?(?:no)?config\.([^=]+)")
_CONFIG_FILE = re.compile(r"^--?config(?:=(.*))?$", re.S)


def _refuse(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _split_sweep_overrides(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(argv without its `--config.sweep.agent.<field>` flags, {field: value text})."""
    kept, sweep = [argv[0]], {}
    args = list(argv[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":  # absl reads no flag after it
            kept += args[i:]
            break
        match = _SWEEP_AGENT.match(arg)
        if match is None:
            kept.append(arg)
        elif match.group(2) is not None:
            sweep[match.group(1)] = match.group(2)
        elif i + 1 < len(args):
            sweep[match.group(1)] = args[i + 1]
            i += 1
        else:
            _refuse(f"{arg} needs a value, e.g. {arg}='(1e-3, 3e-4)'")
        i += 1
    return kept, sweep


def _config_file_argument(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--":
            return None
        match = _CONFIG_FILE.match(arg)
        if match is not None:
            return match.group(1) if match.group(1) is not None else (
                argv[i + 1] if i + 1 < len(argv) else None)
    return None


def _unknown_override(config: Any, argv: Sequence[str]) -> str | None:
    """The message for the first `--config.<path>` of `argv` that names no field of `config`
    (None: every path names one), with the closest names the config has there."""
    for arg in argv[1:]:
        if arg == "--":
            break
        match = _OVERRIDE.match(arg)
        if match is None:
            continue
        path = match.group(1)
        node = config
        for depth, key in enumerate(path.split(".")):
            where = ".".join(["config", *path.split(".")[:depth]])
            if not isinstance(node, (ml_collections.ConfigDict, dict)):
                return (f"--config.{path}: {where} is a value ({node!r}), not a group of "
                        f"fields. Fix: set --{where}=... itself")
            if key not in node:
                hint = (did_you_mean(key, node.keys(), f"{where}.")
                        or f"{where} has {', '.join(sorted(node.keys())) or 'no fields'}")
                return (f"--config.{path}: the config has no field {where}.{key} ({hint}). "
                        "Fix: override a field the config file sets (the runner's "
                        "default_config() lists them all)")
            node = node[key]
    return None


def define_config_file(default: str, help_string: str,
                       flag_values: flags.FlagValues = flags.FLAGS,
                       argv: Sequence[str] | None = None) -> flags.FlagHolder:
    """`config_flags.DEFINE_config_file("config", default, ...)` for a command whose `--config`
    has a default file (the benchmarks'). Without `--config` on the command line,
    ml_collections loads the default with the `--config.<field>` overrides of `argv` (default
    `sys.argv`) as the flag is defined, before `parse_flags` runs: a mistyped override, or a
    value that does not parse, is refused here, in one line with exit status 2, as
    `parse_flags` refuses them."""
    # sys_argv=None: ml_collections reads sys.argv when the flag parses, as parse_flags sets it.
    sys_argv = None if argv is None else list(argv)
    argv = sys.argv if argv is None else sys_argv
    try:
        return config_flags.DEFINE_config_file("config", default, help_string,
                                               flag_values=flag_values, sys_argv=sys_argv)
    except flags.Error as error:
        _refuse(f"{error} (--helpshort lists the flags)")
    except (KeyError, AttributeError):
        plain = flags.FlagValues()  # the default file alone, without the overrides
        config_flags.DEFINE_config_file("config", default, flag_values=plain,
                                        sys_argv=list(argv[:1]))
        problem = _unknown_override(plain["config"].value, argv)
        if problem is None:
            raise
        _refuse(problem)
    raise AssertionError("unreachable: _refuse exits")


def parse_flags(argv: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS,
                config_flag: str = "config") -> list[str]:
    """absl's flag parsing (`app.run(main, flags_parser=_cli.parse_flags)`), refusing bad input
    in one line with exit status 2, as a bad config field is refused, instead of absl's status 1
    or a traceback: an unknown flag, a value that does not parse or is out of its bounds, and,
    for a command with an `ml_collections` config flag named `config`, an override of a field
    the config does not have (naming the closest it has) and a config file that is not there
    (a flag with a default file checks the overrides as it is defined: `define_config_file`).

    It also takes `--config.sweep.agent.<field>=<values>` (e.g. `'(1e-3, 3e-4)'`, a Python
    literal), which `ml_collections` cannot: it overrides only fields the config already has,
    and `sweep.agent` starts empty. Returns the arguments left after the flags.
    """
    argv, sweep = _split_sweep_overrides(argv)
    # ml_collections reads the overrides from sys.argv when the config flag parses.
    saved, sys.argv = sys.argv, list(argv)
    try:
        rest = flag_values(argv)
    except flags.Error as error:
        if (config_flag in flag_values and flag_values[config_flag].value is None
                and _config_file_argument(argv) is None and f"--{config_flag}" in str(error)):
            _refuse(f"--{config_flag} is required: the experiment's config file. Fix: add "
                    f"--{config_flag}=experiments/configs/<name>.py (the shipped configs; the "
                    "README says which runner runs which)")
        _refuse(f"{error} (--helpshort lists the flags)")
    except (KeyError, AttributeError):
        # ml_collections, for an override of a field the config lacks: name it.
        argument = _config_file_argument(argv)
        problem = None if argument is None else _unknown_override(
            flag_values[config_flag].parser.parse(argument), argv)
        if problem is None:
            raise
        _refuse(problem)
    finally:
        sys.argv = saved
    config = flag_values[config_flag].value if config_flag in flag_values else None
    if config is not None and not isinstance(config, ml_collections.ConfigDict):
        try:  # ml_collections defers a file it could not load to the config's first use
            config.keys()
        except OSError:
            path = (_config_file_argument(argv) or "").split(":", 1)[0]
            _refuse(f"--{config_flag}: cannot load the config file {path!r} (is it there?). "
                    "Fix: give a config file's path, e.g. experiments/configs/vtrace_catch.py")
    if sweep:
        _set_sweep(config, sweep)
    return rest


def _set_sweep(config: ml_collections.ConfigDict | None, sweep: dict[str, str]) -> None:
    group = config.get("sweep") if isinstance(config, ml_collections.ConfigDict) else None
    if not isinstance(group, ml_collections.ConfigDict) or not isinstance(
            group.get("agent"), ml_collections.ConfigDict):
        _refuse(f"--config.sweep.agent.{next(iter(sweep))}: this config has no sweep.agent. "
                "Fix: sweep under experiments.anakin (Sebulba runs one run at a time)")
    for field, text in sweep.items():
        name = f"config.sweep.agent.{field}"
        try:
            values = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            _refuse(f"{name}: cannot read {text!r}. Fix: give one value per run as a Python "
                    f"sequence, e.g. --{name}='(1e-3, 3e-4)'")
        values = tuple(values) if isinstance(values, list) else values
        try:
            with group.agent.unlocked():
                group.agent[field] = values
        except TypeError as error:
            _refuse(f"{name}: {error}. Fix: give one value per run as a Python sequence, "
                    f"e.g. --{name}='(1e-3, 3e-4)'")
