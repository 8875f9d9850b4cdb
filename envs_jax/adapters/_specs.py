"""Spec helpers shared by the adapters: shapes and dtypes read off the functions themselves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from podracer.types import ArraySpec


def specs_of(fn: Callable[..., Any], *args: Any) -> Any:
    """The pytree of `ArraySpec`s (shape and dtype, no bounds) of `fn(*args)`'s outputs.

    Traced abstractly (`jax.eval_shape`): nothing is computed.
    """
    shapes = jax.eval_shape(fn, *args)
    return jax.tree.map(lambda s: ArraySpec(tuple(s.shape), np.dtype(s.dtype)), shapes)


def with_bounds(spec: ArraySpec, minimum: Any, maximum: Any, name: str = "") -> ArraySpec:
    """`spec` with bounds broadcast to its shape (None stays None)."""

    def fit(bound: Any) -> Any:
        if bound is None:
            return None
        return np.broadcast_to(np.asarray(bound, spec.dtype), spec.shape).copy()

    return ArraySpec(spec.shape, spec.dtype, fit(minimum), fit(maximum), name=name)
