"""A run's workdir, shared by both runners: checked before anything compiles, resumed only by
the run it belongs to, and its records kept consistent with the checkpoint a run resumes from.

The order a runner follows (every process of a multi-process run, in step):

    check_writable(workdir)                    # before compiling: a bad --workdir fails at once
    point = find_resume_point(...)             # reads metadata only; a run that may not resume
                                               # raises ResumeError here and touches nothing
    ... build ...
    restored = restore(checkpointer, point, target, ...)   # arrays; integrity failures only are
                                                           # set aside, then the previous step
    ... compile (for the restored state) ...
    records = Records.open(...)                # config.json/yaml, metrics.jsonl, TensorBoard:
                                               # rewound to the checkpoint, or replaced when a
                                               # fresh start follows an attempt that never
                                               # finished a checkpoint

What may differ between a checkpoint and the run resuming it: the fields that only say how
long it runs, what it logs and on how many threads (`RESUMABLE_CHANGES`, plus a runner's
own), and, when the researcher lists them in `config.resume_allow_changes`, other fields that
change no array's shape (a lower learning rate, say). Everything else, and the device and
process counts, must be equal. A checkpoint records the layout (path, shape, dtype) of every
array it holds, so a change that would reshape the saved state is named as such, and never
mistaken for damage.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from absl import logging

from podracer import metrics as metrics_lib
from podracer.checkpoint import Checkpointer, Restored, read_metadata, state_layout
from podracer.config import ConfigError

# Fields that may change between an interrupted run and its resumption without any opt-in:
# they change how long it runs, what it logs and how fast, not the state it carries
# (`learner_steps` is the runner's count of total_env_steps in updates; an agent field that
# references it is compared on its own).
RESUMABLE_CHANGES = ("total_env_steps", "learner_steps", "checkpoint_every_updates",
                     "checkpoint_keep", "eval_every_updates", "eval_episodes",
                     "eval_max_steps", "cpu_worker_threads", "resume_allow_changes")
ALLOW_CHANGES_FIELD = "resume_allow_changes"


class WorkdirError(ValueError):
    """The --workdir cannot be used; the message says why and what to do."""


class ResumeError(ConfigError):
    """A workdir holds a checkpoint of a different run; the message lists every difference."""

    def __init__(self, message: str, fields: Sequence[str]):
        self.fields = list(fields)  # every differing config field or run figure
        self.field = self.fields[0] if self.fields else "resume"
        ValueError.__init__(self, message)


# ---------------------------------------------------------------------------------------------
# BEFORE COMPILING


def check_writable(workdir: str) -> str:
    """Fails (WorkdirError) unless `workdir` exists as a writable directory or can be made one
    inside an existing directory; returns its absolute path. Creates nothing that was not
    there: the probe file is removed, and a missing workdir is left missing."""
    path = os.path.abspath(workdir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise WorkdirError(f"--workdir={workdir}: {path} exists and is not a directory. Fix: "
                           "pass a directory path")
    probe_in = path if os.path.isdir(path) else os.path.dirname(path)
    if not os.path.isdir(probe_in):
        raise WorkdirError(f"--workdir={workdir}: its parent directory {probe_in} does not "
                           "exist. Fix: create it first, or pass a path inside an existing "
                           "directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".podracer-write-test-", dir=probe_in)
        os.close(fd)
        os.remove(probe)
    except OSError as error:
        raise WorkdirError(f"--workdir={workdir}: cannot write in {probe_in} ({error.strerror}). "
                           "Fix: pass a directory you can write to") from None
    return path


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def allowed_changes(config: dict[str, Any]) -> tuple[str, ...]:
    """The fields `config.resume_allow_changes` lets a resumed run change."""
    return tuple(config.get(ALLOW_CHANGES_FIELD) or ())


def config_differences(saved: dict[str, Any], current: dict[str, Any],
                       ignore: Sequence[str] = ()) -> dict[str, tuple[Any, Any]]:
    """field -> (saved value, current value) for every differing field (dotted names)."""
    saved, current = _flatten(saved), _flatten(current)
    missing = object()
    out = {}
    for field in sorted(set(saved) | set(current)):
        if field in ignore:
            continue
        a, b = saved.get(field, missing), current.get(field, missing)
        if a != b:
            out[field] = (None if a is missing else a, None if b is missing else b)
    return out


def _fmt_leaf(leaf: tuple[Any, Any] | None) -> str:
    return "absent" if leaf is None else f"{leaf[1]}{list(leaf[0])}"


def _layout_differences(saved: list[list[Any]], current: list[list[Any]]) -> list[str]:
    saved_map = {p: (s, d) for p, s, d in saved}
    current_map = {p: (s, d) for p, s, d in current}
    lines = []
    for path in sorted(set(saved_map) | set(current_map)):
        a, b = saved_map.get(path), current_map.get(path)
        if a != b:
            lines.append(f"state{path}: checkpoint {_fmt_leaf(a)}, this run {_fmt_leaf(b)}")
    return lines


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """The checkpoint step a run will resume from, found from metadata alone."""

    step: int
    metadata: dict[str, Any]
    changes: dict[str, tuple[Any, Any]]  # opted-in changed fields: (checkpoint's, this run's)
    unreadable: tuple[int, ...]  # newer steps whose metadata could not be read (corrupt)


def recorded_config(config: dict[str, Any], choices: Mapping[str, Any]) -> dict[str, Any]:
    """`config` (plain data) with `choices`, what the agent chose for its fields left to it
    ("auto", or None), in their place: what a run records in config.json and compares on
    resume, so that a later version of the code whose "auto" chooses otherwise still resumes
    the run as it was (or says which field differs)."""
    if not choices:
        return config
    return {**config, "agent": {**config.get("agent", {}), **choices}}


def introduced_fields(introduced: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's introduced fields ({field: value}, declared at its registration) under the
    config's dotted names ("agent.<field>"), as `check_compatible` takes them."""
    return {f"agent.{field}": value for field, value in introduced.items()}


def check_compatible(metadata: dict[str, Any], *, directory: str, config: dict[str, Any],
                     layout: list[list[Any]], run_shape: dict[str, Any],
                     resumable: Sequence[str] = RESUMABLE_CHANGES,
                     introduced: Mapping[str, Any] = MappingProxyType({})
                     ) -> dict[str, tuple[Any, Any]]:
    """Raises `ResumeError` listing every way in which this run differs from the one that
    saved `metadata`, unless each difference is allowed; returns the opted-in changes.

    `introduced` ({dotted field: value}, `introduced_fields`) names fields added to the code
    since runs were made without them, each with the value that behaves as the code did
    before: a checkpoint whose config lacks the field is the same run when this run holds that
    value."""
    step = metadata.get("updates", "?")
    shape_lines, shape_fields = [], []
    for name, value in run_shape.items():
        if metadata.get(name) != value:
            shape_fields.append(name)
            shape_lines.append(f"{name}: checkpoint {metadata.get(name)!r}, this run {value!r}")
    saved_layout = metadata.get("layout")
    layout_lines = _layout_differences(saved_layout, layout) if saved_layout else []
    allow = allowed_changes(config)
    differences = config_differences(metadata.get("config", {}), config, ignore=resumable)
    # Checkpoints made before runs recorded the agent's own choices (`recorded_config`) hold
    # "auto" (or None, a width left to the agent) where this run holds what the agent chose:
    # the same run when every array agrees.
    saved_fields = _flatten(metadata.get("config", {}))
    # Fields the checkpoint predates: the same run when this run holds the value that behaves
    # as the code then did; otherwise a difference, reported with that value.
    predates = {f: introduced[f] for f in differences
                if f in introduced and f not in saved_fields}
    differences = {f: v for f, v in differences.items()
                   if not (f in predates and v[1] == predates[f])}
    chosen = {f: (a, b) for f, (a, b) in differences.items()
              if (a == "auto" or (a is None and f in saved_fields)) and b not in ("auto", None)}
    if saved_layout and not layout_lines:
        differences = {f: v for f, v in differences.items() if f not in chosen}
        chosen = {}  # nothing to say about them if another difference refuses the run
    refused = {f: v for f, v in differences.items() if f not in allow}
    if not shape_lines and not layout_lines and not refused:
        return {f: v for f, v in differences.items() if f in allow}

    lines = [(f"Cannot resume the checkpoint at update {step} in {directory}: it was made by "
              "a different run.")]
    for field, (a, b) in differences.items():
        mark = " (allowed by resume_allow_changes)" if field in allow else ""
        if field in predates:
            lines.append(f"  config.{field}: absent from the checkpoint, which was made before "
                         f"the field existed, when the code behaved as {predates[field]!r}; "
                         f"this run {b!r}{mark}")
        else:
            lines.append(f"  config.{field}: checkpoint {a!r}, this run {b!r}{mark}")
    lines += [f"  {line}" for line in shape_lines]
    if layout_lines:
        lines.append("  These changes reshape the saved state, so it cannot be continued:")
        lines += [f"    {line}" for line in layout_lines[:8]]
        if len(layout_lines) > 8:
            lines.append(f"    ... and {len(layout_lines) - 8} more arrays")
    workdir = os.path.dirname(directory)
    for field, value in predates.items():
        if field in differences and field not in allow:
            lines.append(f"To resume it as it ran, pass --config.{field}={value}.")
    for field, (saved, value) in chosen.items():
        lines.append(f"config.{field} was {json.dumps(saved)} when the checkpoint was made "
                     f"(left to the agent), and this version of the code chooses {value!r} "
                     "for it. To resume, pass the choice the checkpoint was made with: "
                     f"--config.{field}=<its value>.")
    lines.append(f"Nothing in {workdir} was changed. Either rerun with the checkpoint's values "
                 f"(they are in {os.path.join(workdir, 'config.json')}) to resume it, or pass a "
                 "new --workdir to start a new run.")
    if refused and not shape_lines and not layout_lines:
        fields = ", ".join(f'"{f}"' for f in refused)
        lines.append("To continue this run on purpose with these changed values (they change "
                     "no array's shape), list them: "
                     f"--config.{ALLOW_CHANGES_FIELD}='({fields},)'")
    raise ResumeError("\n".join(lines), [*differences, *shape_fields])


def find_resume_point(directory: str, *, config: dict[str, Any], layout: list[list[Any]],
                      run_shape: dict[str, Any],
                      resumable: Sequence[str] = RESUMABLE_CHANGES,
                      introduced: Mapping[str, Any] = MappingProxyType({})
                      ) -> ResumePoint | None:
    """The newest checkpoint step in `directory` whose metadata reads, checked against this
    run (see `check_compatible`); None when there is none. Reads files only: nothing is
    created, moved or written, so a run refused here leaves its workdir as it was."""
    if not os.path.isdir(directory):
        return None
    unreadable = []
    for step in sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True):
        metadata = read_metadata(directory, step)
        if metadata is None or "fingerprint" not in metadata:
            unreadable.append(step)
            continue
        changes = check_compatible(metadata, directory=directory, config=config, layout=layout,
                                   run_shape=run_shape, resumable=resumable,
                                   introduced=introduced)
        return ResumePoint(step=step, metadata=metadata, changes=changes,
                           unreadable=tuple(unreadable))
    return None


# ---------------------------------------------------------------------------------------------
# RESTORING, AND THE RECORDS


def restore(checkpointer: Checkpointer, point: ResumePoint | None, target: Any, *,
            config: dict[str, Any], layout: list[list[Any]], run_shape: dict[str, Any],
            resumable: Sequence[str] = RESUMABLE_CHANGES,
            introduced: Mapping[str, Any] = MappingProxyType({})
            ) -> tuple[Restored | None, ResumePoint | None]:
    """Loads `point` into the shape of `target`. Only steps that fail their integrity check
    (unreadable metadata, files that do not load, a state that does not match its saved
    fingerprint) are set aside, in `<checkpoints>.corrupt/`; then the next older step is
    checked and tried. Returns the restored state and the point it came from (None, None for
    a fresh start)."""
    for step in point.unreadable if point is not None else ():
        logging.warning("Checkpoint step %d in %s has unreadable metadata; setting it aside.",
                        step, checkpointer.directory)
        checkpointer.quarantine(step)
    while point is not None:
        try:
            return checkpointer.restore(point.step, target), point
        except Exception as error:  # noqa: BLE001 - the layout matched: this is damage
            logging.warning("Checkpoint step %d in %s fails its integrity check (%s: %.300s); "
                            "setting it aside and trying the previous one.", point.step,
                            checkpointer.directory, type(error).__name__, error)
            print(f"Checkpoint at update {point.step} in {checkpointer.directory} is damaged "
                  f"({type(error).__name__}); moved to {checkpointer.directory}.corrupt/ and "
                  "trying the previous one.", flush=True)
            checkpointer.quarantine(point.step)
        point = find_resume_point(checkpointer.directory, config=config, layout=layout,
                                  run_shape=run_shape, resumable=resumable,
                                  introduced=introduced)
        for step in point.unreadable if point is not None else ():
            checkpointer.quarantine(step)
    return None, None


class Records:
    """The records a run keeps in its workdir (process 0 writes; others hold no files):
    config.json/config.yaml, and per run directory metrics.jsonl and TensorBoard events.

    Opening for a resumed run rewinds each run directory's records to the checkpoint's update
    (what the interrupted run logged after it is logged again); opening for a fresh start
    replaces what an earlier attempt that never finished a checkpoint logged, instead of
    appending to it. Opted-in config changes are recorded in the first record written.
    """

    def __init__(self, writers: list[metrics_lib.MetricsWriter],
                 histories: list[list[dict[str, Any]]], first_extra: dict[str, Any]):
        self.writers = writers
        self.histories = histories
        self._first_extra = first_extra

    @classmethod
    def open(cls, workdir: str | None, run_dirs: Sequence[str | None], *, config: dict[str, Any],
             run_configs: Sequence[dict[str, Any]] | None = None, enabled: bool,
             resumed_from: int | None, total_env_steps: int, resume_env_steps: int | None,
             changes: dict[str, tuple[Any, Any]] | None = None,
             progress: bool = True) -> Records:
        histories: list[list[dict[str, Any]]] = [[] for _ in run_dirs]
        if enabled and workdir is not None:
            metrics_lib.save_config(config, workdir)
            for i, run_dir in enumerate(run_dirs):
                if run_configs is not None:
                    metrics_lib.save_config(run_configs[i], run_dir)
                if resumed_from is not None:
                    histories[i] = metrics_lib.rewind_records(run_dir, updates=resumed_from)
                else:
                    _remove_records(run_dir)
        writers = [metrics_lib.MetricsWriter(run_dir, enabled=enabled, progress=progress,
                                             total_env_steps=total_env_steps,
                                             resume_env_steps=resume_env_steps)
                   for run_dir in run_dirs]
        extra = {}
        if changes:
            extra = {"config_changes": {f: {"checkpoint": a, "now": b}
                                        for f, (a, b) in changes.items()},
                     "config_changed_at_update": resumed_from}
        return cls(writers, histories, extra)

    def write(self, run: int, record: dict[str, Any]) -> dict[str, Any]:
        """Writes run `run`'s record (with the opted-in changes, the first time) and keeps it
        in its history; returns what was written."""
        if self._first_extra:
            record = {**record, **self._first_extra}
            if run == len(self.writers) - 1:
                self._first_extra = {}
        self.histories[run].append(record)
        self.writers[run].write(record)
        return record

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def _remove_records(run_dir: str | None) -> None:
    """Removes metrics.jsonl and TensorBoard event files left by an attempt that never
    finished a checkpoint, so that a fresh start replaces them rather than appends."""
    if run_dir is None or not os.path.isdir(run_dir):
        return
    paths = [os.path.join(run_dir, "metrics.jsonl")]
    paths += glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    removed = [p for p in dict.fromkeys(paths) if os.path.isfile(p)]
    for path in removed:
        os.remove(path)
    if removed:
        print(f"Fresh start in {run_dir}: replacing the records of an earlier attempt that "
              "never finished a checkpoint.", flush=True)


__all__ = ["ALLOW_CHANGES_FIELD", "RESUMABLE_CHANGES", "Records", "ResumeError", "ResumePoint",
           "WorkdirError", "allowed_changes", "check_compatible", "check_writable",
           "config_differences", "find_resume_point", "introduced_fields", "recorded_config",
           "restore", "state_layout"]
