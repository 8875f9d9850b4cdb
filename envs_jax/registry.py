"""The environment registry: `make(name, **kwargs)` and `registered()`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envs_jax.base import Environment

_REGISTRY: dict[str, Callable[..., Environment[Any]]] = {}


def register(name: str, factory: Callable[..., Environment[Any]]) -> None:
    if name in _REGISTRY:
        raise ValueError(f"Environment {name!r} is already registered.")
    _REGISTRY[name] = factory


def registered() -> list[str]:
    """Names accepted by `make`, sorted."""
    return sorted(_REGISTRY)


def make(name: str, **kwargs: Any) -> Environment[Any]:
    """Builds the (unwrapped) environment registered as `name`."""
    if name not in _REGISTRY:
        raise KeyError(
            f"Unknown environment {name!r}. Registered environments: {', '.join(registered())}."
        )
    return _REGISTRY[name](**kwargs)
