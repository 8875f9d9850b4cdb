"""`lax.scan` for loops whose body returns metrics: the scalar metrics leave each iteration as
one float32 vector, so that a scanned update writes one output buffer per iteration, not one
per metric. On CPU every such write is a kernel launch of its own, and in a small update
(PPO's minibatches on CartPole) they are a measurable share of its time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def scan_with_metrics(body: Callable[[Any, Any], tuple[Any, dict[str, Any]]], init: Any,
                      xs: Any = None, *, length: int | None = None, unroll: int = 1
                      ) -> tuple[Any, dict[str, jax.Array]]:
    """`jax.lax.scan(body, init, xs, length, unroll)` for a `body(carry, x) -> (carry,
    metrics)` whose `metrics` is a dict; returns the final carry and the metrics stacked,
    `{name: [N, ...]}`, as `lax.scan` would stack them. Scalar metrics travel packed in one
    float32 vector (booleans and integers come back as float32: 0.0 / 1.0 and whole numbers);
    the others as they are."""
    names: list[str] = []

    def packed(carry, x):
        carry, metrics = body(carry, x)
        metrics = dict(metrics)
        names[:] = sorted(k for k, v in metrics.items() if jnp.ndim(v) == 0)
        vector = jnp.stack([jnp.asarray(metrics.pop(k), jnp.float32) for k in names])
        return carry, (vector, metrics)

    carry, (vectors, others) = jax.lax.scan(packed, init, xs, length=length, unroll=unroll)
    return carry, {**{k: vectors[..., i] for i, k in enumerate(names)}, **others}


__all__ = ["scan_with_metrics"]
