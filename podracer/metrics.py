"""Metrics on the host: `<workdir>/metrics.jsonl` (one JSON object per log step), TensorBoard
event files beside it, the resolved config as `config.json`/`config.yaml`, and console
progress (a bar with rate and ETA on a terminal, plain lines otherwise). Values arrive already
reduced (Anakin's inside the compiled program, once per chunk; Sebulba's learner averages its
updates' metrics over each log interval); nothing here touches devices.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Self, TextIO

import ml_collections
import numpy as np
from absl import logging


def _plain(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.item() if np.ndim(value) == 0 else np.asarray(value).tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a missing value reads as null.
    return value


class MetricsWriter:
    """Appends one JSON line per `write`, logs its numbers to TensorBoard and shows progress.

    Only process 0 of a multi-process run should write (pass `enabled=False` elsewhere).

    Args:
      workdir: where `metrics.jsonl` and the TensorBoard event files go; None for neither.
      enabled: False makes every method a no-op.
      stream: where progress goes (default stdout).
      tensorboard: also write TensorBoard event files into `workdir`.
      progress: show progress on `stream` (see `Progress`).
      total_env_steps: the run's length, for the progress bar's percentage and ETA.
      resume_env_steps: a resumed run's starting point: TensorBoard hides events logged
        after it by the interrupted run, which the resumed one logs again.
    """

    PROGRESS_KEYS = ("env_steps", "updates", "episode_return", "steps_per_second")

    def __init__(self, workdir: str | None, *, enabled: bool = True, stream: TextIO | None = None,
                 tensorboard: bool = True, progress: bool = True,
                 total_env_steps: int | None = None, resume_env_steps: int | None = None):
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self._file = None
        self._tensorboard = None
        self._progress = None
        if not enabled:
            return
        if progress:
            self._progress = Progress(total_env_steps, self.stream,
                                      start_env_steps=resume_env_steps or 0)
        if workdir:
            os.makedirs(workdir, exist_ok=True)
            self.path = os.path.join(workdir, "metrics.jsonl")
            self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed by close()
            if tensorboard:
                self._tensorboard = _tensorboard_writer(workdir, resume_env_steps)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {k: _plain(v) for k, v in record.items()}
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
        if self._tensorboard is not None:
            step = record.get("env_steps", record.get("updates", 0))
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                        key != "env_steps":
                    self._tensorboard.add_scalar(key, value, global_step=step)
            self._tensorboard.flush()
        if self._progress is not None:
            self._progress.update(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._progress is not None:
            self._progress.close()
            self._progress = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def format_progress(record: dict[str, Any], runs: int = 1) -> str:
    """One plain progress line. `runs` > 1: `record` is a sweep's, its returns the mean over
    the runs and its steps per second their sum, which the line says."""
    def fmt(key: str, value: Any) -> str:
        if value is None:
            return f"{key}=-"
        if isinstance(value, float):
            if key == "steps_per_second":
                return f"sps={value:,.0f}" + (f" (sum over {runs} runs)" if runs > 1 else "")
            if key in ("episode_return", "eval_return") and runs > 1:
                return f"{key}={value:.3g} (mean over {runs} runs)"
            return f"{key}={value:.3g}"
        if isinstance(value, int):
            return f"{key}={value:,}"
        return f"{key}={value}"

    keys = [k for k in MetricsWriter.PROGRESS_KEYS if k in record]
    keys += [k for k in ("eval_return", "loss", "entropy", "policy_lag") if k in record]
    return "  ".join(fmt(k, record[k]) for k in keys)


def _returned(record: dict[str, Any]) -> float | None:
    value = record.get("episode_return")
    return None if value is None or not math.isfinite(value) else float(value)


def final_return_text(history: list[dict[str, Any]]) -> str:
    """The end-of-run line's return: the last record's mean episode return, or, when no episode
    ended within it (long fixed-length episodes end in bursts), the latest that had one."""
    final = _returned(history[-1]) if history else None
    if final is not None:
        return f"final mean episode return {final:.3f}"
    for record in reversed(history):
        earlier = _returned(record)
        if earlier is not None:
            return (f"no episode ended in the last record; the latest mean episode return "
                    f"{earlier:.3f}, at {record.get('env_steps', 0):,} env steps")
    return "no episode ended"


def print_end_of_run(history: list[dict[str, Any]], *, interrupted: bool,
                     signal_received: int | None, checkpoint_directory: str | None,
                     saved_update: int | None, run_seconds: float, compile_seconds: float,
                     checkpoint_seconds: float, eval_seconds: float) -> None:
    """The line a runner prints when it ends: done, with its timings and the run's records'
    return (`final_return_text`), or stopped by a signal (this process's, or one sent to
    another process of the run) and where to resume from."""
    steps = history[-1].get("env_steps", 0) if history else 0
    if interrupted:
        where = ("no --workdir, so no checkpoint" if checkpoint_directory is None else
                 f"checkpoint saved at update {saved_update:,} in {checkpoint_directory}; "
                 "rerun the same command to resume")
        by = (f"signal {signal_received}" if signal_received is not None
              else "a signal to another process of the run")
        print(f"Stopped by {by} after {steps:,} env steps: {where}.", flush=True)
    else:
        print(f"Done: {steps:,} env steps in {run_seconds:.1f}s (+{compile_seconds:.1f}s "
              f"compile, {checkpoint_seconds:.1f}s checkpoints, {eval_seconds:.1f}s evaluation); "
              f"{final_return_text(history)}", flush=True)


def _format_duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _format_count(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


class Progress:
    """Console progress, one update per log record.

    On a terminal: one line redrawn in place, a bar with the percentage, environment steps,
    rate and ETA. Elsewhere (a log file, a notebook, CI): one plain `format_progress` line per
    record, with the ETA appended, so logs stay greppable. For a sweep of `runs` runs each
    record is the runs' mean, steps per second their sum, and both lines say so.
    """

    BAR_WIDTH = 24

    def __init__(self, total_env_steps: int | None, stream: TextIO | None = None, *,
                 tty: bool | None = None, start_env_steps: int = 0, runs: int = 1):
        self.total = total_env_steps
        self.runs = runs
        self.stream = stream if stream is not None else sys.stdout
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty and isatty())
        self.tty = tty
        self._start_steps = start_env_steps
        self._start_time = time.monotonic()
        self._drawn = False

    def eta_seconds(self, env_steps: int) -> float | None:
        """Remaining time at the mean rate since this object was made (None if unknown)."""
        done = env_steps - self._start_steps
        elapsed = time.monotonic() - self._start_time
        if not self.total or done <= 0 or elapsed <= 0:
            return None
        return max(self.total - env_steps, 0) * elapsed / done

    def update(self, record: dict[str, Any]) -> None:
        steps = record.get("env_steps")
        eta = self.eta_seconds(steps) if isinstance(steps, (int, float)) else None
        if not self.tty:
            line = format_progress(record, self.runs)
            if eta is not None:
                line += f"  eta={_format_duration(eta)}"
            print(line, file=self.stream, flush=True)
            return
        parts = []
        if self.total and steps is not None:
            fraction = min(max(steps / self.total, 0.0), 1.0)
            filled = int(fraction * self.BAR_WIDTH)
            parts.append(f"[{'#' * filled}{'.' * (self.BAR_WIDTH - filled)}] {fraction:4.0%}")
            parts.append(f"{_format_count(steps)}/{_format_count(self.total)} steps")
        elif steps is not None:
            parts.append(f"{_format_count(steps)} steps")
        summed, mean = ((f" (sum over {self.runs} runs)", f" (mean over {self.runs} runs)")
                        if self.runs > 1 else ("", ""))
        if isinstance(record.get("steps_per_second"), (int, float)):
            parts.append(f"{_format_count(record['steps_per_second'])} steps/s{summed}")
        if eta is not None:
            parts.append(f"ETA {_format_duration(eta)}")
        for key in ("episode_return", "eval_return"):
            if isinstance(record.get(key), float):
                parts.append(f"{key.split('_')[0]} {record[key]:.3g}{mean}")
        # \r returns to the line start and ESC[K clears what a longer previous line left.
        self.stream.write("\r" + "  ".join(parts) + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


class _EventFile:
    """A TensorBoard event file written synchronously: `flush` returns once the events are on
    disk. (tensorboardX's `SummaryWriter` queues events for a background thread, and its `flush`
    does not wait for that queue, so a process killed just after logging lost them.)"""

    def __init__(self, logdir: str, purge_step: int | None):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.summary import scalar

        self._event, self._scalar = Event, scalar
        # tensorboardX names the file by the second and opens it with "wb": the suffix keeps two
        # writers started within one second (a rerun of a finished run) from clobbering each
        # other, and keeps the names in the order they were made.
        self._writer = EventsWriter(os.path.join(logdir, "events"),
                                    f".{time.time_ns()}.{os.getpid()}")
        if purge_step is not None:
            # A session start at step T: TensorBoard hides events at steps >= T in earlier files.
            self._writer.write_event(Event(step=purge_step, wall_time=time.time(),
                                           session_log=SessionLog(status=SessionLog.START)))
        self.flush()

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        event = self._event(wall_time=time.time(), step=int(global_step),
                            summary=self._scalar(tag, value))
        self._writer.write_event(event)

    def flush(self) -> None:
        self._writer.flush()  # flushes and fsyncs the file

    def close(self) -> None:
        self._writer.close()


def _tensorboard_writer(logdir: str, resume_env_steps: int | None) -> _EventFile | None:
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        logging.warning("tensorboardX is not installed: no TensorBoard event files in %s.",
                        logdir)
        return None
    # The purge step makes TensorBoard hide what an interrupted run logged after its checkpoint.
    purge = resume_env_steps + 1 if resume_env_steps is not None else None
    return _EventFile(logdir, purge)


def read_records(workdir: str) -> list[dict[str, Any]]:
    """The records of `<workdir>/metrics.jsonl` (a cut-off last line, from a killed process, is
    skipped)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def rewind_records(workdir: str, *, updates: int) -> list[dict[str, Any]]:
    """Drops the records past `updates` from `<workdir>/metrics.jsonl` (what an interrupted
    run logged after its last checkpoint, which the resumed run logs again) and returns the
    rest. The file is replaced atomically."""
    kept = [r for r in read_records(workdir) if r.get("updates", 0) <= updates]
    path = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(path):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        os.replace(tmp, path)
    return kept


def config_to_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The resolved config as plain JSON values (tuples become lists, references resolve)."""
    return json.loads(config.to_json_best_effort(sort_keys=True))


def save_config(config: ml_collections.ConfigDict | dict[str, Any], workdir: str) -> None:
    """Writes the resolved config as `<workdir>/config.json` and `<workdir>/config.yaml`."""
    import yaml

    plain = config if isinstance(config, dict) else config_to_dict(config)
    os.makedirs(workdir, exist_ok=True)
    for name, text in (("config.json", json.dumps(plain, indent=2, sort_keys=True) + "\n"),
                       ("config.yaml", yaml.safe_dump(plain, sort_keys=True))):
        path = os.path.join(workdir, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
