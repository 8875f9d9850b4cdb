"""Numerical faults: a loss or parameter that is NaN or inf stops a run, named by its update,
before anything built on it is checkpointed. The check runs inside the compiled programs (one
boolean per update), so it costs no host synchronisation."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


class NonFiniteError(FloatingPointError):
    """A learner update produced a NaN or inf loss, metric or parameter."""


# The metric an update reports (both runners): its loss, metrics and parameters are all finite.
FINITE = "_finite"


def all_finite(*trees: Any) -> jax.Array:
    """Whether every floating-point element of `trees` is finite (a scalar bool, jittable).

    The leaves are checked as one flat vector: one reduction, not one per leaf (inside a
    scanned update each is a kernel of its own on CPU)."""
    floats = [jnp.ravel(x) for x in jax.tree.leaves(trees)
              if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
    return jnp.all(jnp.isfinite(jnp.concatenate(floats))) if floats else jnp.asarray(True)


def first_false(flags: jax.Array) -> jax.Array:
    """The index of the first False in the 1-D `flags`, or its length if all are True."""
    bad = ~flags
    return jnp.where(jnp.any(bad), jnp.argmax(bad), flags.shape[0]).astype(jnp.int32)


def nonfinite_message(update: int, where: str, checkpoint: str | None) -> str:
    kept = (f"the last good checkpoint in {checkpoint} is kept (no checkpoint is written from "
            "a non-finite state)" if checkpoint else "no checkpoint was being written")
    return (f"update {update:,}: the loss or the parameters became NaN or inf ({where}); "
            f"stopping the run: {kept}. Lower the learning rate, clip gradients harder, or "
            "look at the last records in metrics.jsonl.")


__all__ = ["NonFiniteError", "all_finite", "first_false", "nonfinite_message"]
