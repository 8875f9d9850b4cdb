"""How a check that must end within a given time shares it among its parts, and reads what a
part run as a process of its own finished (the device check's). No flags and no JAX, so that
tests import it beside other benchmarks.

- `part_cap`: a part's cap, its own or its share of the time left.
- `Budget`: a part's cap while it runs, and whether to start its next point.
- `run_parts`: the parts in order within the check's time, skipping a part left none.
- `child_results`: the rows of a part's process, as far as it got before it was stopped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Seconds a part's process takes to start (importing JAX, starting its backend) and to write
# its files: left out of the time its own parts share (`child_check_s`).
STARTUP_S = 20.0


def part_cap(caps: Mapping[str, float], name: str, to_run: Sequence[str],
             left_s: float) -> float:
    """The cap of part `name` with `left_s` seconds of the check left and `to_run` (`name`
    first) still to run: its own cap (`caps[name]`), or less when the parts before it ran
    long, its share of the time left in proportion to the caps of the parts still to run."""
    return min(caps[name], left_s * caps[name] / sum(caps[p] for p in to_run))


class Budget:
    """A part's time cap: `spent()` once `cap_s` seconds have passed since it began."""

    def __init__(self, cap_s: float):
        self.start, self.cap_s = time.perf_counter(), cap_s
        self._point_start: float | None = None
        self._last_point_s, self._open = 0.0, True

    def spent(self) -> bool:
        return time.perf_counter() - self.start > self.cap_s

    def left(self) -> float:
        return max(0.0, self.cap_s - (time.perf_counter() - self.start))

    def next_point(self) -> bool:
        """Called before each of a part's points, in order: whether to start it. The first
        starts unless the cap is spent; a later one only while the time left would hold
        another point as long as the one before it (a point under way is not stopped, so one
        started near the cap would run past it into the next part's time). Once a point is
        not started, no later one is."""
        now = time.perf_counter()
        if self._point_start is not None:
            self._last_point_s = now - self._point_start
        self._point_start = now
        self._open = self._open and self.left() > self._last_point_s
        return self._open


SPENT = "the check's time was spent"


def run_parts(parts: Sequence[str], caps: Mapping[str, float],
              run_part: Callable[[str, float | None], dict[str, Any]],
              check_s: float | None,
              after_part: Callable[[str, dict[str, Any]], None] = lambda name, record: None,
              ) -> dict[str, dict[str, Any]]:
    """Runs `parts` in order, each as `run_part(name, cap_s)` (a record with at least
    "status", "reason" and "seconds"), within `check_s` seconds from now: `cap_s` from
    `part_cap`, or None (the part's own cap) where `check_s` is None. A part left no time is
    not run: its record says it was skipped because the check's time was spent. Calls
    `after_part(name, record)` after each; returns the records by part."""
    start = time.perf_counter()
    records: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(parts):
        cap_s = None
        if check_s is not None:
            cap_s = part_cap(caps, name, parts[i:], check_s - (time.perf_counter() - start))
        if cap_s is not None and cap_s <= 0:
            records[name] = {"status": "skipped", "reason": SPENT, "cap_s": 0.0, "rows": [],
                             "capped": [], "seconds": 0.0}
        else:
            records[name] = run_part(name, cap_s)
        after_part(name, records[name])
    return records


def child_check_s(left_s: float) -> float:
    """The `--check_s` for a part's process with `left_s` seconds of the part's cap left: its
    own parts share what is left after its start-up, so that it writes what it measured
    before it is stopped at the cap."""
    return max(left_s - STARTUP_S, 1.0)


def child_results(out: str, points: Sequence[str], stopped: str = ""
                  ) -> tuple[dict[str, Any], list[str]]:
    """A part's process's results from its `out`/device_check.json ({part: record}, with its
    "xla_flags" and "memory"), and, where the process was `stopped` (the reason), the parts
    among `points` it did not finish, each with that reason. Raises RuntimeError where the
    process wrote no results."""
    try:
        with open(os.path.join(out, "device_check.json")) as f:
            child = json.load(f)
    except FileNotFoundError:
        raise RuntimeError(f"{stopped or 'its process ended'} before it finished a "
                           f"part") from None
    unfinished = [f"{name}: {stopped}" for name in points if name not in child["parts"]]
    return child, unfinished
