"""The dtype in which host environments' observations reach the agents, shared by the
gymnasium and envpool kinds of `sebulba.host_env`."""

from __future__ import annotations

from typing import Any

import numpy as np


def observation_dtype(dtype: Any) -> np.dtype:
    """The dtype in which a host environment's observations of `dtype` reach the agent:
    float64 (gymnasium's default for a `Box`, envpool's MuJoCo tasks) as float32, what the
    agents compute in and what JAX makes of it without 64-bit mode; any other as it is."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float64 else np.dtype(dtype)


def as_observations(obs: Any) -> np.ndarray:
    """`obs` as a numpy array of `observation_dtype(obs.dtype)`."""
    obs = np.asarray(obs)
    return obs.astype(observation_dtype(obs.dtype), copy=False)
