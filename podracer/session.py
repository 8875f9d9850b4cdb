"""A run's session: what both runners do around their host loop, in one place.

    session = RunSession.open(workdir)     # after validation, before compiling: checks the
                                           # workdir and locks it (process 0 of the run)
    point = session.find_resume_point(...) # metadata only; a refused run changes nothing
    ... build ...
    restored = session.restore(target, checkpoint_keep=...)  # the checkpoint's state, if any
    ... compile ...
    session.start_checkpointer()           # makes <workdir>/checkpoints if it is missing
    records = session.open_records(...)    # config files, metrics.jsonl, TensorBoard
    session.print_resume(...)              # says where a resumed run continues from
    ... the runner's host loop ...
    session.close()                        # records, the last checkpoint's write, the lock
    print_end_of_run(...)                  # the summary line

The lock. Two runs writing one workdir damage each other: the second restores the checkpoint the
first is rotating out, sets it aside as damaged, and both append to one metrics file. So a run
holds `<workdir>/run.lock` from before it compiles until it ends. The lock is an advisory
`flock` on that file, which the operating system drops when its process dies, however it dies;
the file's content names the holder (host, process id, start time, command line). A second run
on a workdir whose lock is held exits before compiling (`WorkdirLockedError`, status 2 from the
command line), names the holder, and changes nothing. A lock file left by a process that died
is taken over, and the run says so. A multi-process run locks once, from process 0, and every
process learns the outcome from process 0 (a broadcast), so all of them stop together. A
workdir the lock had to make is removed again when the lock is released if it is still empty:
a run refused while it compiles (an agent's `ConfigError` raised as its step is traced) leaves
no trace of itself.

Where `flock` is not supported (some network filesystems), the lock falls back to the process
id in the file: a holder on this host is alive while its process exists; a holder on another
host is taken to be alive, and the message says how to remove the file if it is not.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from podracer import replication
from podracer import workdir as workdir_lib
from podracer.checkpoint import Checkpointer, Restored
from podracer.metrics import print_end_of_run
from podracer.workdir import Records, ResumePoint, WorkdirError

LOCK_FILE = "run.lock"
# Folded into a run's seed for its evaluation's keys, apart from training's (both runners).
EVAL_STREAM = 0x5EED


def eval_key(seed: int, update: int) -> jax.Array:
    """The key of a run's greedy evaluation after `update` (both runners)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), EVAL_STREAM), update)


# ---------------------------------------------------------------------------------------------
# RESULTS


@dataclasses.dataclass
class TrainResult:
    """What `anakin.train` and `sebulba.train` return.

    `state` is the runner's whole device state, stacked over devices: Anakin's `RunnerState`
    (for a sweep, leaves `[devices, runs, ...]`), Sebulba's `LearnerRun` (the learner state
    and the learner devices' RNG keys). Both hold `learner_state`."""

    state: Any
    final_metrics: dict[str, Any]  # the last log record
    history: list[dict[str, Any]]  # every log record (a resumed run: earlier ones included)
    compile_seconds: float
    run_seconds: float
    # Stopped by SIGTERM or Ctrl-C (`signal_received`) after saving a checkpoint (with a
    # workdir).
    interrupted: bool = False
    signal_received: int | None = None
    resumed_from_updates: int | None = None  # the checkpoint this run started from
    checkpoint_seconds: float = 0.0  # time spent writing checkpoints
    eval_seconds: float = 0.0  # time spent evaluating (compilation included)
    # Anakin sweeps: each run's own records (`history` averages the runs).
    run_histories: list[list[dict[str, Any]]] = dataclasses.field(default_factory=list)
    # Sebulba: one policy lag per update of this call, (u - 1) - the oldest version in batch u;
    # (version, params) newest on each actor device; the last update's input.
    policy_lags: list[int] = dataclasses.field(default_factory=list)
    actor_params: list[tuple[int, Any]] = dataclasses.field(default_factory=list)
    last_batch: tuple[Any, ...] = ()
    # What was run (both runners; <workdir>/run_info.json): the environment with its library's
    # version or protocol, the agent, devices, machine, sizes and config.
    run_info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        # The summary only: the state, records and parameters are fields to read, and would
        # print every array.
        final = self.final_metrics
        parts = [f"{key}={final[key]}" for key in ("updates", "env_steps") if key in final]
        parts += [f"final_{key}={final[key]:.4g}" for key in ("episode_return", "eval_return")
                  if isinstance(final.get(key), (int, float))]
        parts += [f"run_seconds={self.run_seconds:.1f}",
                  f"compile_seconds={self.compile_seconds:.1f}"]
        if self.run_histories and len(self.run_histories) > 1:
            parts.append(f"runs={len(self.run_histories)}")
        if self.resumed_from_updates is not None:
            parts.append(f"resumed_from_updates={self.resumed_from_updates}")
        if self.interrupted:
            parts.append("interrupted=True")
        return f"TrainResult({', '.join(parts)})"

    @property
    def learner_state(self) -> Any:
        return self.state.learner_state

    @property
    def learner_keys(self) -> Any:
        """Sebulba: each learner device's RNG key."""
        return self.state.learner_keys

    @property
    def params(self) -> Any:
        """The learner parameters of this process's first (learner) device."""
        return replication.unreplicate(self.state.learner_state.params)


# ---------------------------------------------------------------------------------------------
# THE LOCK


class WorkdirLockedError(WorkdirError):
    """Another run that is still alive holds the workdir."""

    def __init__(self, message: str, holder: dict[str, Any]):
        super().__init__(message)
        self.holder = holder


def _describe(holder: dict[str, Any]) -> str:
    text = f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("started"):
        text += f", started {holder['started']}"
    if holder.get("command"):
        text += f" ({holder['command']})"
    return text


def _read_holder(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    try:
        holder = json.loads(data.decode()) if data.strip() else {}
    except ValueError:
        holder = {"unreadable": data[:200].decode(errors="replace")}
    return holder if isinstance(holder, dict) else {}


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def _locked_message(workdir: str, holder: dict[str, Any], extra: str = "") -> str:
    return (f"--workdir={workdir} is in use by a run that is still alive: {_describe(holder)}. "
            f"Nothing in {workdir} was changed.{extra} Fix: wait for that run to end (or stop "
            "it), or pass another --workdir.")


class WorkdirLock:
    """This process's hold on `<workdir>/run.lock` (see the module docstring)."""

    def __init__(self, path: str, fd: int, previous: dict[str, Any], made: bool = False):
        self.path = path
        self._fd: int | None = fd
        self.previous = previous  # what a dead holder left in the file ({} if none)
        self.made = made  # whether the workdir was made for this lock

    @classmethod
    def acquire(cls, workdir: str) -> WorkdirLock:
        """Locks `workdir` (made if missing) or raises `WorkdirLockedError` naming the live
        holder, having changed nothing."""
        made = not os.path.isdir(workdir)
        os.makedirs(workdir, exist_ok=True)
        path = os.path.join(workdir, LOCK_FILE)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise WorkdirLockedError(_locked_message(workdir, holder), holder) from None
            except OSError as error:
                if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    os.close(fd)
                    raise
                cls._check_by_pid(fd, workdir)
            # The file may have been removed (by its holder, ending) between open and flock:
            # then this lock is on a name nobody else sees; start again on the new file.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = _read_holder(fd)
        me = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "command": " ".join(sys.argv)[:500]}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(me) + "\n").encode())
        os.fsync(fd)
        lock = cls(path, fd, previous, made)
        if previous:
            print(f"Took over the lock on {workdir} left by a run that is no longer running "
                  f"({_describe(previous)}).", flush=True)
        return lock

    @staticmethod
    def _check_by_pid(fd: int, workdir: str) -> None:
        holder = _read_holder(fd)
        if not holder:
            return
        here = holder.get("host") == socket.gethostname()
        if here and not _pid_alive(holder.get("pid")):
            return
        if holder.get("pid") == os.getpid() and here:
            return
        os.close(fd)
        extra = ("" if here else " (This filesystem has no flock, so a holder on another host "
                 f"cannot be checked: if it is not running, delete {LOCK_FILE} in the workdir.)")
        raise WorkdirLockedError(_locked_message(workdir, holder, extra), holder)

    def release(self) -> None:
        """Removes the lock file and drops the lock (idempotent); then the workdir too, if it
        was made for this lock and nothing else was written in it."""
        if self._fd is None:
            return
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None
        if self.made:
            try:
                os.rmdir(os.path.dirname(self.path))  # only ever removes an empty directory
            except OSError:
                pass

    @property
    def held(self) -> bool:
        return self._fd is not None


def lock_workdir(workdir: str) -> WorkdirLock | None:
    """Process 0 locks `workdir`; every process of the run raises `WorkdirLockedError` if it
    could not. Returns process 0's lock (None elsewhere)."""
    lock, error = None, None
    if jax.process_index() == 0:
        try:
            lock = WorkdirLock.acquire(workdir)
        except WorkdirLockedError as refused:
            error = refused
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        refused = bool(multihost_utils.broadcast_one_to_all(np.int32(error is not None)))
        if refused and error is None:
            holder = {}
            try:
                with open(os.path.join(workdir, LOCK_FILE), "rb") as f:
                    holder = _read_holder(f.fileno())
            except OSError:
                pass
            error = WorkdirLockedError(
                "process 0 of this run found the workdir locked: "
                + _locked_message(workdir, holder), holder)
    if error is not None:
        raise error
    return lock


# ---------------------------------------------------------------------------------------------
# THE SESSION


class RunSession:
    """A run's hold on its workdir (or on nothing, without one): the lock, the resume decision,
    the checkpointer and the records, closed together."""

    def __init__(self, workdir: str | None, lock: WorkdirLock | None):
        self.workdir = workdir
        self.lock = lock
        self.checkpoint_dir = None if workdir is None else os.path.join(workdir, "checkpoints")
        self.checkpointer: Checkpointer | None = None
        self.records: Records | None = None
        self.point: ResumePoint | None = None
        self.checkpoint_close_seconds = 0.0
        self._resume_args: dict[str, Any] = {}
        self._checkpoint_keep = 1

    @classmethod
    def open(cls, workdir: str | None) -> RunSession:
        """Checks `workdir` (see `podracer.workdir.check_writable`) and locks it; call after
        the config is validated and before compiling."""
        if workdir is None:
            return cls(None, None)
        workdir = workdir_lib.check_writable(workdir)
        return cls(workdir, lock_workdir(workdir))

    def find_resume_point(self, *, config: dict[str, Any], layout: list[list[Any]],
                          run_shape: dict[str, Any], resumable: Sequence[str],
                          introduced: Mapping[str, Any] | None = None) -> ResumePoint | None:
        """The checkpoint this run will resume, decided from metadata alone: a run that may
        not resume it raises `ResumeError` here and changes nothing. `introduced`: see
        `podracer.workdir.check_compatible`."""
        self._resume_args = {"config": config, "layout": layout, "run_shape": run_shape,
                             "resumable": resumable, "introduced": dict(introduced or {})}
        if self.checkpoint_dir is not None:
            self.point = workdir_lib.find_resume_point(self.checkpoint_dir, **self._resume_args)
        return self.point

    def restore(self, target: Any, *, checkpoint_keep: int) -> Restored | None:
        """Restores the resume point found before (or, if it proves damaged, an older one)
        into the shape of `target`, with the (asynchronous) checkpointer it starts. Where the
        workdir has no checkpoints directory yet, nothing is started or made here:
        `start_checkpointer`, called once the run's programs have compiled, makes it."""
        self._checkpoint_keep = checkpoint_keep
        if self.checkpoint_dir is None or not os.path.isdir(self.checkpoint_dir):
            return None
        self.start_checkpointer()
        restored, self.point = workdir_lib.restore(self.checkpointer, self.point, target,
                                                   **self._resume_args)
        return restored

    def start_checkpointer(self) -> Checkpointer | None:
        """The run's checkpointer, started (its directory made) on the first call after
        `restore`: a run refused while its programs compile leaves no checkpoints directory
        behind. None without a workdir."""
        if self.checkpoint_dir is not None and self.checkpointer is None:
            self.checkpointer = Checkpointer(self.checkpoint_dir,
                                             max_to_keep=self._checkpoint_keep,
                                             asynchronous=True)
        return self.checkpointer

    @property
    def changes(self) -> dict[str, tuple[Any, Any]]:
        """The opted-in config changes (`resume_allow_changes`) of a resumed run."""
        return {} if self.point is None else self.point.changes

    def changes_hparams(self, names: Sequence[str]) -> bool:
        """Whether the opted-in changes touch hyperparameters the learner state holds."""
        held = {f"agent.{n}" for n in names} | {f"sweep.agent.{n}" for n in names}
        return bool(held & set(self.changes))

    def open_records(self, run_dirs: Sequence[str | None], **kwargs: Any) -> Records:
        """The run's records (see `podracer.workdir.Records.open`)."""
        self.records = Records.open(self.workdir, run_dirs, changes=self.changes or None,
                                    **kwargs)
        return self.records

    def print_resume(self, resumed_from: int, done: str, note: str = "") -> None:
        """Says where a resumed run continues from, and with which changed values."""
        print(f"Resuming from the checkpoint at update {resumed_from:,} ({done}) in "
              f"{self.checkpointer.directory}{note}", flush=True)
        if self.changes:
            changed = ", ".join(f"{f}: {a!r} -> {b!r}" for f, (a, b) in self.changes.items())
            print(f"Continuing with changed config values (resume_allow_changes): {changed}",
                  flush=True)

    def close(self, *, checkpoints: bool = True) -> None:
        """Closes the records, waits for the last checkpoint (unless `checkpoints=False`: a
        thread may still be writing) and releases the lock. Idempotent."""
        try:
            if self.records is not None:
                self.records.close()
                self.records = None
            if self.checkpointer is not None and checkpoints:
                started = time.perf_counter()
                self.checkpointer.close()
                self.checkpoint_close_seconds += time.perf_counter() - started
                self.checkpointer = None
        finally:
            if self.lock is not None:
                self.lock.release()


__all__ = [
    "EVAL_STREAM",
    "LOCK_FILE",
    "RunSession",
    "TrainResult",
    "WorkdirLock",
    "WorkdirLockedError",
    "eval_key",
    "lock_workdir",
    "print_end_of_run",
]
