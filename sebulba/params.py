"""Versioned actor parameters on the actor devices, and the staleness protocol that says which
version each rollout acts with.

Parameters carry a version: the number of learner updates behind them. Update u consumes
rollout u of each actor thread; its policy lag is (u - 1) - (the oldest version that acted in
the batch), logged for every update.
  - "fixed" (default, reproducible): rollout k acts with exactly version max(k - 1 - lag, 0)
    (`rollout_version`), waiting for it if the learner is behind. With lag = 1 the actors
    collect batch u + 1 while the learner computes update u, and the whole run is a pure
    function of (config, seed, device count). lag = 0 is synchronous, on-policy learning.
  - "latest": before every inference an actor switches to the newest published version; it
    never waits. The queue bounds the lag: at most queue_size + 1.
A resumed run starts the store at the checkpoint's version u0, which then stands for 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import jax

from sebulba.threads import POLL_S, ProgressClock, StallError


def rollout_version(k: int, *, policy_lag: int, start_update: int = 0) -> int:
    """The version rollout k (which feeds update k) acts with under "fixed" staleness."""
    return max(k - 1 - policy_lag, start_update)


def versions_to_keep(staleness: str, policy_lag: int) -> int:
    """How many versions a `ParamsStore` must hold for the protocol: under "fixed", rollout k
    asks for k - 1 - lag while the learner may already have published k - 1."""
    return policy_lag + 2 if staleness == "fixed" else 1


class ParamsStore:
    """Versioned actor parameters, one copy on every actor device.

    The learner publishes version u after update u; actor threads read either an exact version
    (fixed lag) or the newest. The last `keep` versions are kept, enough for the fixed-lag
    protocol: when rollout k asks for version k - 1 - lag, the learner is at most at k - 1.
    """

    def __init__(self, devices: Sequence[jax.Device], keep: int):
        self.devices = list(devices)
        self.keep = keep
        self._cond = threading.Condition()
        self._versions: dict[int, list[Any]] = {}
        self._newest = -1

    def publish(self, version: int, params: Any) -> None:
        copies = [jax.device_put(params, d) for d in self.devices]
        with self._cond:
            self._versions[version] = copies
            for old in [v for v in self._versions if v <= version - self.keep]:
                del self._versions[old]
            self._newest = version
            self._cond.notify_all()

    def newest(self, device_index: int) -> tuple[int, Any]:
        with self._cond:
            return self._newest, self._versions[self._newest][device_index]

    def wait_for(self, version: int, device_index: int, stop: threading.Event,
                 timeout_s: float, clock: ProgressClock | None = None) -> Any:
        """Exactly `version` on actor device `device_index`; None if stopped first. Raises
        after `timeout_s` without learner progress (see `ProgressClock`)."""
        started = time.monotonic()
        clock = clock or ProgressClock()
        with self._cond:
            while self._newest < version:
                if stop.is_set():
                    return None
                if clock.expired(started, timeout_s):
                    raise StallError(f"parameters version {version} not published after "
                                     f"{timeout_s:.0f}s (newest: {self._newest})")
                self._cond.wait(POLL_S)
            if version not in self._versions:
                raise RuntimeError(f"parameters version {version} already dropped (keeping "
                                   f"{self.keep}, newest {self._newest}): staleness bug")
            return self._versions[version][device_index]
