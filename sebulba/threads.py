"""Sebulba's threads: the supervisor that runs them, the errors that stop them, and the bounded
waits between them.

Faults: every thread runs inside `Supervisor`, which records the first exception with its
traceback and sets the stop flag. Every blocking wait (queues, parameter versions) polls that
flag and gives up after `timeout_s` without progress from the other side (`ProgressClock`), so
a failure anywhere ends the run promptly, and `train` raises `ThreadFailure` (the failed
thread's name and traceback; `__cause__` is the original exception), or a `NonFiniteError`
as it is.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from podracer import faults

POLL_S = 0.05  # how often a blocked wait looks at the stop flag
JOIN_S = 10.0  # how long shutdown waits for all threads to stop


class StallError(TimeoutError):
    """A thread waited longer than `config.timeout_s` for another one."""


class ThreadFailure(RuntimeError):
    """A Sebulba thread raised; the original exception is the `__cause__`."""


class Supervisor:
    """Runs named threads; the first exception in any of them stops all of them."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.errors: list[tuple[str, BaseException, str]] = []
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self, name: str, fn: Callable[[], None]) -> threading.Thread:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - every failure must reach the main thread
                with self._lock:
                    self.errors.append((name, e, traceback.format_exc()))
                self.stop.set()

        # Daemon: a thread stuck in a device call must not keep a failed process alive.
        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    def join(self, timeout_s: float = JOIN_S) -> list[str]:
        """Stops and joins every thread; returns the names of those still running."""
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def raise_first_error(self) -> None:
        if self.errors:
            name, error, formatted = self.errors[0]
            if isinstance(error, faults.NonFiniteError):
                raise error  # its message says all; the entry point reports it as such
            raise ThreadFailure(f"Sebulba thread {name!r} failed:\n{formatted}") from error


class ProgressClock:
    """When one side (the learner, or the actors) last showed progress, for the other's waits.

    An actor waiting on the learner (for parameters, or for room in its queue) gives up only
    after `timeout_s` without progress from the learner; while the learner is busy with
    something other than consuming (an evaluation, however long), no wait expires. Likewise the
    learner waiting for rollouts gives up only after `timeout_s` in which no actor stepped,
    and not while an actor compiles its first inference.
    """

    def __init__(self) -> None:
        self._last = time.monotonic()
        self._busy = 0
        self._lock = threading.Lock()

    def tick(self) -> None:
        self._last = time.monotonic()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        with self._lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
            self.tick()

    def expired(self, started: float, timeout_s: float) -> bool:
        """Whether a wait begun at `started` has seen no learner progress for `timeout_s`."""
        if self._busy:
            return False
        return time.monotonic() - max(started, self._last) > timeout_s


def put(q: queue.Queue, item: Any, stop: threading.Event, timeout_s: float, what: str,
         clock: ProgressClock | None = None) -> bool:
    """Blocking put that gives up when `stop` is set (False) or after `timeout_s` without
    learner progress (raises)."""
    started = time.monotonic()
    clock = clock or ProgressClock()
    while not stop.is_set():
        try:
            q.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            if clock.expired(started, timeout_s):
                raise StallError(f"{what}: queue still full after {timeout_s:.0f}s; "
                                 "the learner has stopped consuming") from None
    return False


def get(q: queue.Queue, stop: threading.Event, timeout_s: float, what: str,
         clock: ProgressClock | None = None) -> Any:
    """Blocking get that returns None when `stop` is set, raises after `timeout_s` without
    actor progress."""
    started = time.monotonic()
    clock = clock or ProgressClock()
    while not stop.is_set():
        try:
            return q.get(timeout=POLL_S)
        except queue.Empty:
            if clock.expired(started, timeout_s):
                raise StallError(f"{what}: nothing arrived in {timeout_s:.0f}s; an actor thread "
                                 "has stopped producing") from None
    return None
