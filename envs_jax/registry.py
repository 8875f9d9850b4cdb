"""The environment registry: `make(name, **kwargs)` and `registered()`.

Two kinds of names:

- native environments, registered one by one with `register` (`"catch"`, `"CartPole-v1"`);
- adapted libraries, registered as a namespace with `register_namespace`: every environment the
  library registers is available as `"<namespace>:<library name>"` (`"gymnax:Breakout-MinAtar"`,
  `"pgx:minatar-breakout"`). A namespace is listed by `registered()` only when its library is
  installed (its optional extra); `make` on a missing one says which extra to install. The
  library is imported on first use, not when `envs_jax` is imported.

Time limits: `make` returns an environment with its standard time limit already applied, the
one gymnasium registers for the classic-control tasks (`CartPole-v1`: 500 steps). Pass
`max_episode_steps=N` to replace it, or `max_episode_steps=0` for none. A truncated end is a
LAST timestep with discount 1 (see `envs_jax.TimeLimit`). Adapted libraries keep their own
time limits (reported as truncation); `max_episode_steps=N` adds ours on top.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import itertools
from collections.abc import Callable
from typing import Any

from envs_jax.base import Environment


@dataclasses.dataclass(frozen=True)
class _Entry:
    factory: Callable[..., Environment[Any]]
    max_episode_steps: int | None
    serial: int  # distinct for every registration, so a replaced one is told apart


@dataclasses.dataclass(frozen=True)
class _Namespace:
    library: str  # the module that must be importable, e.g. "gymnax"
    adapter: str  # our module with `names() -> list[str]` and `make(name, **kwargs)`
    extra: str  # the optional extra of this project that installs the library


_REGISTRY: dict[str, _Entry] = {}
_NAMESPACES: dict[str, _Namespace] = {}
_SEPARATOR = ":"
_SERIALS = itertools.count(1)


def register(
    name: str, factory: Callable[..., Environment[Any]], *, max_episode_steps: int | None = None,
    replace: bool = False,
) -> None:
    """Registers a native environment; `max_episode_steps` is its standard time limit. A name
    registered already is refused unless `replace=True` (a notebook cell that defines and
    registers an environment can then be rerun after an edit)."""
    if _SEPARATOR in name:
        raise ValueError(f"Native environment names cannot contain {_SEPARATOR!r}: {name!r}.")
    if name in _REGISTRY and not replace:
        raise ValueError(f"Environment {name!r} is already registered. Pass replace=True to "
                         "replace it (e.g. after editing it in a notebook), or choose another "
                         "name.")
    _REGISTRY[name] = _Entry(factory, max_episode_steps, next(_SERIALS))


def registration_id(name: str) -> int:
    """A number that differs for every registration of native environment `name` (0 for
    adapted and unknown names): what compiled from one registration is not reused for the
    next."""
    entry = _REGISTRY.get(name)
    return 0 if entry is None else entry.serial


def register_namespace(namespace: str, *, library: str, adapter: str, extra: str) -> None:
    """Makes every environment of `library` available as `"<namespace>:<name>"`."""
    if namespace in _NAMESPACES:
        raise ValueError(f"Namespace {namespace!r} is already registered.")
    _NAMESPACES[namespace] = _Namespace(library=library, adapter=adapter, extra=extra)


def installed(namespace: str) -> bool:
    """Whether the library behind `namespace` can be imported here."""
    return importlib.util.find_spec(_NAMESPACES[namespace].library) is not None


def missing_extra(name: str) -> str | None:
    """For `"<namespace>:<env>"` whose library is not installed, the project extra that installs
    it (e.g. "gymnax"); None for every other name."""
    namespace, sep, _ = name.partition(_SEPARATOR)
    if sep and namespace in _NAMESPACES and not installed(namespace):
        return _NAMESPACES[namespace].extra
    return None


def describe(name: str) -> dict[str, Any]:
    """What a run records about environment `name`: `kind` "native" (this package's code), or
    the adapter namespace, with the `library` behind it and its installed `library_version`."""
    namespace, sep, _ = name.partition(_SEPARATOR)
    if not sep or namespace not in _NAMESPACES:
        return {"name": name, "kind": "native"}
    library = _NAMESPACES[namespace].library
    try:
        version = importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:  # a module installed some other way
        version = getattr(importlib.import_module(library), "__version__", None)
    return {"name": name, "kind": namespace, "library": library, "library_version": version}


def namespaces() -> list[str]:
    """All adapter namespaces, installed or not, sorted."""
    return sorted(_NAMESPACES)


@functools.cache
def _adapter_names(namespace: str) -> tuple[str, ...]:
    adapter = importlib.import_module(_NAMESPACES[namespace].adapter)
    return tuple(f"{namespace}{_SEPARATOR}{name}" for name in adapter.names())


def registered(*, adapters: bool = True) -> list[str]:
    """Names accepted by `make`, sorted: the native ones, then (if `adapters`) those of every
    installed adapter namespace. Listing a namespace imports its library (once)."""
    names = sorted(_REGISTRY)
    if adapters:
        for namespace in namespaces():
            if installed(namespace):
                names.extend(sorted(_adapter_names(namespace)))
    return names


def default_max_episode_steps(name: str) -> int | None:
    """The standard time limit `make(name)` applies, or None (adapters: the library's own)."""
    entry = _REGISTRY.get(name)
    return entry.max_episode_steps if entry is not None else None


def make(name: str, *, max_episode_steps: int | None = None, **kwargs: Any) -> Environment[Any]:
    """Builds the environment registered as `name`, with its standard time limit.

    Args:
      name: a name from `registered()`.
      max_episode_steps: None for the standard limit, N > 0 to replace it, 0 for none.
      **kwargs: passed to the environment's constructor (for adapters: to the library's).
    """
    from envs_jax.wrappers import TimeLimit  # wrappers import this module's users, not it

    if max_episode_steps is not None and max_episode_steps < 0:
        raise ValueError(f"max_episode_steps must be >= 0 (0 = none), got {max_episode_steps}.")
    namespace, sep, library_name = name.partition(_SEPARATOR)
    if sep:
        if namespace not in _NAMESPACES:
            raise KeyError(
                f"Unknown environment namespace {namespace!r} in {name!r}. "
                f"Namespaces: {', '.join(namespaces())}."
            )
        spec = _NAMESPACES[namespace]
        if not installed(namespace):
            raise ModuleNotFoundError(
                f"{name!r} needs the {spec.library!r} library: "
                f"pip install -e '.[{spec.extra}]' (see pyproject.toml)."
            )
        adapter = importlib.import_module(spec.adapter)
        env = adapter.make(library_name, **kwargs)
        limit = max_episode_steps or None
    else:
        if name not in _REGISTRY:
            raise KeyError(
                f"Unknown environment {name!r}. Registered environments: "
                f"{', '.join(registered(adapters=False))}; adapter namespaces: "
                f"{', '.join(f'{n}:<name>' for n in namespaces())}."
            )
        entry = _REGISTRY[name]
        env = entry.factory(**kwargs)
        limit = entry.max_episode_steps if max_episode_steps is None else max_episode_steps
    return TimeLimit(env, limit) if limit else env
