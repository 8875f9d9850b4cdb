"""Metrics on the host: `<workdir>/metrics.jsonl` (one JSON object per log step) and a
compact progress line. Values arrive already reduced inside the compiled program, once per
chunk; nothing here touches devices.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, TextIO

import numpy as np


def _plain(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.item() if np.ndim(value) == 0 else np.asarray(value).tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a missing value reads as null.
    return value


class MetricsWriter:
    """Appends one JSON line per `write` and prints a progress line.

    Only process 0 of a multi-process run should write (pass `enabled=False` elsewhere).
    """

    PROGRESS_KEYS = ("env_steps", "updates", "episode_return", "steps_per_second")

    def __init__(self, workdir: str | None, *, enabled: bool = True, stream: TextIO | None = None):
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self._file = None
        if enabled and workdir:
            os.makedirs(workdir, exist_ok=True)
            self.path = os.path.join(workdir, "metrics.jsonl")
            self._file = open(self.path, "a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {k: _plain(v) for k, v in record.items()}
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
        print(format_progress(record), file=self.stream, flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def format_progress(record: dict[str, Any]) -> str:
    def fmt(key: str, value: Any) -> str:
        if value is None:
            return f"{key}=-"
        if isinstance(value, float):
            if key == "steps_per_second":
                return f"sps={value:,.0f}"
            return f"{key}={value:.3g}"
        if isinstance(value, int):
            return f"{key}={value:,}"
        return f"{key}={value}"

    keys = [k for k in MetricsWriter.PROGRESS_KEYS if k in record]
    keys += [k for k in ("loss", "entropy", "policy_lag") if k in record]
    return "  ".join(fmt(k, record[k]) for k in keys)
