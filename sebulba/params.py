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
    never waits. The queue bounds the lag: at most queue_size + 2. (An actor starts rollout u
    once rollout u - 1 is in its queue of Q, so once the learner has taken rollout u - 1 - Q;
    the learner takes rollout j only when version j - 2 is on every actor device; so rollout u
    acts with versions >= u - 3 - Q, and update u's lag (u - 1) - oldest is <= Q + 2.)
A resumed run starts the store at the checkpoint's version u0, which then stands for 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import jax

from sebulba.threads import POLL_S, ProgressClock, StallError

READY_POLL_S = 0.001  # how often a wait looks whether an update has finished


def rollout_version(k: int, *, policy_lag: int, start_update: int = 0) -> int:
    """The version rollout k (which feeds update k) acts with under "fixed" staleness."""
    return max(k - 1 - policy_lag, start_update)


def versions_to_keep(staleness: str, policy_lag: int) -> int:
    """How many versions a `ParamsStore` must hold for the protocol: under "fixed", rollout k
    asks for k - 1 - lag while the learner may already have published k - 1."""
    return policy_lag + 2 if staleness == "fixed" else 1


def _ready(tree: Any) -> bool:
    return all(x.is_ready() for x in jax.tree.leaves(tree))


class ParamsStore:
    """Versioned actor parameters, one copy on every actor device.

    The learner publishes version u right after dispatching update u, before it is computed:
    publishing never waits on a device. Actor threads read either an exact version (fixed
    lag), waiting until it is published and computed, or the newest version already computed
    (so that an actor never stalls behind an update in progress). The last `keep` versions are
    kept, enough for the fixed-lag protocol: when rollout k asks for version k - 1 - lag, the
    learner is at most at k - 1. An older version goes only once a newer one is computed, so
    that the newest computed version is always here, whenever it finished: a version dropped
    while still computing would leave "latest" actors an older one than the lag bound allows.
    The learner keeps at most two updates in flight, so this holds at most two versions more.
    """

    def __init__(self, devices: Sequence[jax.Device], keep: int):
        self.devices = list(devices)
        self.keep = keep
        self._cond = threading.Condition()
        self._versions: dict[int, list[Any]] = {}
        self._newest = -1

    def publish(self, version: int, params: Any) -> list[Any]:
        """Adds `version` and returns its copies, one per actor device (dispatched, not
        awaited)."""
        copies = [jax.device_put(params, d) for d in self.devices]
        with self._cond:
            self._versions[version] = copies
            ready = [v for v in self._versions if _ready(self._versions[v])]
            newest_ready = max(ready, default=-1)
            for old in [v for v in self._versions
                        if v <= version - self.keep and v < newest_ready]:
                del self._versions[old]
            self._newest = version
            self._cond.notify_all()
        return copies

    @property
    def newest_version(self) -> int:
        """The newest published version, computed or not."""
        return self._newest

    def get(self, version: int, device_index: int) -> Any:
        """Version `version` on actor device `device_index`, computed or not."""
        with self._cond:
            return self._versions[version][device_index]

    def newest(self, device_index: int) -> tuple[int, Any]:
        """The newest version already computed (on this device), and its parameters."""
        with self._cond:
            for version in sorted(self._versions, reverse=True):
                copy = self._versions[version][device_index]
                if _ready(copy):
                    return version, copy
            oldest = min(self._versions)  # nothing computed yet: the one to finish first
            return oldest, self._versions[oldest][device_index]

    def wait_for(self, version: int, device_index: int, stop: threading.Event,
                 timeout_s: float, clock: ProgressClock | None = None) -> Any:
        """Exactly `version` on actor device `device_index`, computed; None if stopped first.
        Raises after `timeout_s` without learner progress (see `ProgressClock`)."""
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
            params = self._versions[version][device_index]
        # Published as soon as dispatched: wait here, outside the lock, for the update that
        # computes it, still watching the stop flag and the learner's progress.
        while not _ready(params):
            if stop.is_set():
                return None
            if clock.expired(started, timeout_s):
                raise StallError(f"parameters version {version} not computed after "
                                 f"{timeout_s:.0f}s")
            time.sleep(READY_POLL_S)
        return params
