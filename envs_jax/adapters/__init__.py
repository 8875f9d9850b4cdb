"""Adapters that put whole JAX environment libraries under the `envs_jax` API.

One module per library, each importing its library on use only, and each exposing
`names() -> list[str]` (every environment the library registers) and `make(name, **kwargs)`.
Reach them through the registry: `envs_jax.make("gymnax:Breakout-MinAtar")`,
`envs_jax.make("pgx:minatar-breakout")`, `envs_jax.make("jumanji:Snake-v1")`,
`envs_jax.make("brax:ant")`. Each library is an optional extra of this project
(`pip install -e '.[gymnax]'`, ..., or `'.[envs]'` for all), pinned in pyproject.toml to the
versions the tests were run with.

Every adapter keeps termination and truncation apart (a library's own time limit becomes a
LAST timestep with discount 1) and never resets by itself, so the final observation stays on
the LAST timestep; `envs_jax.AutoReset` starts the next episode as for native environments.
Their spec methods are wrapped in `_specs.concrete`, so a spec asked for under a JAX trace
equals the eager one.
"""
