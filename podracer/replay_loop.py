"""What every replay agent's learner step shares, whichever replay it keeps (positions,
transitions): the warm-up and replay-ratio loop, and the memory check made before a replay is
allocated.

    check_memory(needed_bytes, capacity=..., field="agent.replay_capacity", unit="positions")
    state, metrics = train_when_ready(update, state, key, size=replay.size(state.replay),
                                      updates_per_step=4, min_items=640, ...)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from podracer.config import ConfigError
from podracer.position_replay import device_memory_bytes
from podracer.types import Array, Metrics, PRNGKey

# A replay may take at most this share of a learner device's memory.
MEMORY_SHARE = 0.8


def check_memory(needed: int, *, capacity: int, field: str, unit: str,
                 allocated: int | None = None, device: jax.Device | None = None) -> None:
    """Raises `ConfigError` on `field` when a replay of `capacity` `unit` (the config's;
    `allocated` of them when it rounds up) needing `needed` bytes would take more than
    `MEMORY_SHARE` of `device`'s memory (the first local device by default), naming the
    largest capacity that fits; nothing when the backend does not say."""
    device = jax.local_devices()[0] if device is None else device
    available = device_memory_bytes(device)
    if available is not None and needed > MEMORY_SHARE * available:
        per_item = needed / (capacity if allocated is None else allocated)
        raise ConfigError(
            field,
            f"{capacity} {unit} need {needed / 2**30:.2f} GiB per device, more than 80% of the "
            f"{available / 2**30:.2f} GiB the device has",
            f"use at most {int(MEMORY_SHARE * available / per_item)} {unit}",
        )


def train_when_ready(update: Callable[[Any, PRNGKey], tuple[Any, Metrics]], state: Any,
                     key: PRNGKey, *, size: Array, updates_per_step: int, min_items: int,
                     metric_names: tuple[str, ...], axis_name: str | None
                     ) -> tuple[Any, Metrics]:
    """`update` applied `updates_per_step` times (`lax.scan`, keys split from `key`) once
    every device's replay holds `min_items` sampleable items (`size` is this device's count);
    before that the state is returned as it is with zeros for `metric_names`. The metrics are
    averaged over the updates, not over `axis_name`: the caller adds its own and averages."""

    def train(state):
        keys = jax.random.split(key, updates_per_step)
        state, metrics = jax.lax.scan(update, state, keys)
        return state, jax.tree.map(jnp.mean, metrics)

    def wait(state):
        return state, {name: jnp.zeros((), jnp.float32) for name in metric_names}

    # Devices may hold different counts (flags differ between their environments): all wait
    # for the slowest, so that the replicated update runs everywhere or nowhere.
    ready = size >= min_items
    if axis_name is not None:
        ready = jax.lax.pmin(ready.astype(jnp.int32), axis_name) > 0
    return jax.lax.cond(ready, train, wait, state)
