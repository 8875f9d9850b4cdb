"""Spec helpers shared by the adapters: shapes and dtypes read off the functions themselves,
and specs that come out the same whether or not they are asked for under a JAX trace."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import numpy as np

from podracer.types import ArraySpec

F = TypeVar("F", bound=Callable[..., Any])


def concrete(method: F) -> F:
    """Runs a spec method with `jnp` evaluated eagerly, so that it gives the same concrete
    spec whether or not it is called under a JAX trace.

    Runners ask for specs inside traced code (Anakin's per-device `init` is jitted and
    replicated), and libraries compute bounds with `jnp` (gymnax's spaces). Under a trace
    every `jnp` operation is staged out, even on constants, so its result is a tracer that
    `np.asarray` cannot read. `jax.ensure_compile_time_eval` runs them eagerly instead; their
    inputs (the environment's static parameters) are concrete, so the result is the eager
    one. Caching a spec computed once would not be enough: the first call may itself be under
    a trace.
    """

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with jax.ensure_compile_time_eval():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


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
