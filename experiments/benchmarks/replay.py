"""Benchmark: the transition replay (DQN) next to the position replay (MuZero) at the same
sizes, and each next to a plain copy of the same bytes, measured in the same run.

- Add: one [T, B] trajectory of timesteps (observation, action, reward, discount, last)
  inserted, for the transition replay (`podracer.transition_replay`, one ring of timesteps)
  and the position replay (`podracer.position_replay`, one window of H + P + T timesteps per
  column, period T, lookahead P = n, no history); ceiling: the same T x B timesteps written
  into a ring of the same size with `lax.dynamic_update_slice` (no index arithmetic, no
  priorities).
- Sample: a batch of S positions with the n timesteps after each, uniform (alpha = 0) and
  prioritised (alpha = 0.6, beta = 0.4, random priorities; traced, as MuZero passes them),
  from full replays of the same capacity; the transition replay's uniform draw also with
  alpha a Python 0, as DQN passes it when its config's is 0 (by rejection, without reading
  every priority; the indices, timesteps and weights DQN reads); ceiling: `jnp.take` of the
  same S x (n + 1) timesteps (each position and the n timesteps B slots after it, as the
  transition replay reads them) at indices drawn outside the timed call: the gather alone,
  without drawing the positions over the whole replay.

Each figure is one jitted call of `--calls` adds or samples in a `lax.scan` (as a learner step
runs them, the replay updated in place), the best of `--repeats` calls after compilation.

    python -m experiments.benchmarks.replay [--capacity=100000] [--T=16] [--B=32] \
        [--batch=128] [--n=3] [--obs=10,10,4]
"""

from __future__ import annotations

import functools
import os
import platform

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from experiments import _cli
from experiments.benchmarks._ceiling import best_time
from podracer import position_replay as pr
from podracer import transition_replay as tr

_CAPACITY = flags.DEFINE_integer("capacity", 100_000, "Timesteps (positions) each replay "
                                 "holds (the position replay: capacity // T windows).")
_T = flags.DEFINE_integer("T", 16, "Timesteps per column of each added trajectory.")
_B = flags.DEFINE_integer("B", 32, "Columns (environments) of each added trajectory.")
_BATCH = flags.DEFINE_integer("batch", 128, "Positions per sampled batch (S).")
_N = flags.DEFINE_integer("n", 3, "Timesteps after each sampled position (n-step lookahead).")
_OBS = flags.DEFINE_list("obs", ["10", "10", "4"], "Observation shape (float32).")
_CALLS = flags.DEFINE_integer("calls", 20, "Adds or samples per timed (scanned) call.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per figure (best is kept).")


def example_step(obs_shape: tuple[int, ...]) -> dict:
    """One stored timestep, as DQN stores it (`agents.dqn.to_replay_steps`)."""
    return {"observation": jnp.zeros(obs_shape, jnp.float32),
            "action": jnp.zeros((), jnp.int32), "reward": jnp.zeros((), jnp.float32),
            "discount": jnp.zeros((), jnp.float32), "last": jnp.zeros((), bool)}


def trajectories(key, calls: int, t: int, b: int, obs_shape: tuple[int, ...]):
    """`calls` random trajectories, leaves [calls, T, B, ...], and their sampleable flags."""
    k1, k2, k3 = jax.random.split(key, 3)
    steps = {"observation": jax.random.normal(k1, (calls, t, b) + obs_shape),
             "action": jax.random.randint(k2, (calls, t, b), 0, 4),
             "reward": jax.random.normal(k3, (calls, t, b)),
             "discount": jnp.ones((calls, t, b)), "last": jnp.zeros((calls, t, b), bool)}
    return steps, jnp.ones((calls, t, b), bool)


def step_bytes(obs_shape: tuple[int, ...]) -> int:
    return tr.transition_replay_bytes(1, example_step(obs_shape)) - 4  # less the priority


def run(capacity: int, t: int, b: int, batch: int, n: int, obs_shape: tuple[int, ...],
        calls: int, repeats: int) -> list[tuple[str, float, float]]:
    """Prints and returns (name, items/s, calls/s) for each figure."""
    example = example_step(obs_shape)
    transition = tr.make_transition_replay(capacity, lookahead=n)
    windows = capacity // t
    position = pr.make_position_replay(windows, period=t, lookahead=n)
    steps, sampleable = trajectories(jax.random.PRNGKey(0), calls, t, b, obs_shape)
    rows = []

    def report(name, items, unit, call_unit, seconds):
        per_call = seconds / calls
        rows.append((name, items / per_call, 1 / per_call))
        print(f"{name:<44} {items / per_call:>14,.0f} {unit}/s {1 / per_call:>12,.0f} "
              f"{call_unit}/s")

    def adds(replay):
        @functools.partial(jax.jit, donate_argnums=0)
        def fn(state):
            def body(state, xs):
                return replay.add(state, *xs), None
            state, _ = jax.lax.scan(body, state, (steps, sampleable))
            return state, state.next_index
        return fn

    # ADD
    print(f"add: [T={t}, B={b}] trajectories ({t * b} timesteps of {step_bytes(obs_shape):,} "
          f"bytes) into {capacity:,} timesteps")
    ring = jax.tree.map(lambda x: jnp.zeros((capacity,) + x.shape, x.dtype), example)

    @functools.partial(jax.jit, donate_argnums=0)
    def copy_in(state):
        def body(carry, xs):
            buffers, start = carry
            new = jax.tree.map(lambda buf, x: jax.lax.dynamic_update_slice_in_dim(
                buf, x.reshape((t * b,) + x.shape[2:]).astype(buf.dtype), start, 0),
                buffers, xs)
            return (new, (start + t * b) % (capacity - t * b + 1)), None
        state, _ = jax.lax.scan(body, state, steps)
        return state, state[1]

    report("ceiling: dynamic_update_slice of the bytes", t * b, "timesteps", "adds",
           best_time(copy_in, (ring, jnp.zeros((), jnp.int32)), repeats))
    del ring
    transition_state = transition.init(example)
    transition_add = adds(transition)
    report("transition replay add", t * b, "timesteps", "adds",
           best_time(transition_add, transition_state, repeats))
    position_state = position.init(example)
    position_add = adds(position)
    report("position replay add", t * b, "timesteps", "adds",
           best_time(position_add, position_state, repeats))

    # SAMPLE, from full replays
    fills = -(-capacity // (t * b * calls)) + 1
    transition_state = transition.init(example)
    position_state = position.init(example)
    for _ in range(fills):
        transition_state, _ = transition_add(transition_state)
        position_state, _ = position_add(position_state)
    print(f"sample: {batch} positions x {n + 1} timesteps ({batch * (n + 1) * step_bytes(obs_shape):,}"
          f" bytes) from full replays (transition {int(transition.size(transition_state)):,}, "
          f"position {int(position.size(position_state)):,} sampleable)")
    keys = jax.random.split(jax.random.PRNGKey(1), calls)
    # The transition replay's pattern: each position and the n timesteps B slots apart after it.
    positions = jax.random.randint(jax.random.PRNGKey(2), (calls, batch, 1), 0, capacity)
    indices = (positions + b * jnp.arange(n + 1)) % capacity  # [calls, S, n + 1]

    @jax.jit
    def gather(items, indices):
        return jax.lax.map(lambda i: jax.tree.map(
            lambda buf: jnp.take(buf, i, axis=0, mode="clip"), items), indices)

    report("ceiling: jnp.take of the same timesteps", batch, "positions", "batches",
           best_time(lambda s: (s, gather(transition_state.items, indices)), None, repeats))
    rng = np.random.default_rng(3)
    transition_state = transition.update_priorities(
        transition_state, jnp.arange(capacity),
        jnp.asarray(rng.uniform(0.01, 2.0, capacity), jnp.float32))
    position_state = position_state.replace(priorities=jnp.where(
        position_state.priorities > 0,
        jnp.asarray(rng.uniform(0.01, 2.0, position_state.priorities.shape), jnp.float32), 0.0))
    for name, replay, state in (("transition", transition, transition_state),
                                ("position", position, position_state)):
        # alpha and beta traced, as MuZero passes them and DQN when prioritised (swept).
        @jax.jit
        def samples(state, keys, alpha, replay=replay):
            return jax.lax.map(lambda k: replay.sample(state, k, batch, alpha=alpha,
                                                       beta=jnp.float32(0.4)), keys)

        kinds = [("uniform, alpha traced", 0.0), ("prioritised", 0.6)]
        if name == "transition":
            # alpha a Python 0, as DQN passes it when its config's is 0: the draw by rejection.
            # What DQN reads of it (its probabilities, which count the sampleable slots over
            # the whole replay, it does not read, and they are compiled away).
            @jax.jit
            def uniform_samples(state, keys, replay=replay):
                def one(k):
                    sample = replay.sample(state, k, batch, alpha=0.0, beta=0.4)
                    return sample.indices, sample.items, sample.weights
                return jax.lax.map(one, keys)

            report(f"{name} replay sample, uniform", batch, "positions", "batches",
                   best_time(lambda s, state=state: (s, uniform_samples(state, keys)), None,
                             repeats))
        for kind, alpha in kinds:
            alpha = jnp.float32(alpha)
            report(f"{name} replay sample, {kind}", batch, "positions", "batches",
                   best_time(lambda s, fn=samples, state=state, alpha=alpha:
                             (s, fn(state, keys, alpha)), None, repeats))
    return rows


def main(argv):
    del argv
    obs_shape = tuple(int(d) for d in _OBS.value)
    device = jax.devices()[0]
    print(f"hardware: {platform.machine()}, {os.cpu_count()} CPU cores; {device.platform} "
          f"({device.device_kind}); jax {jax.__version__}")
    print(f"each figure: {_CALLS.value} calls in one jitted scan, best of {_REPEATS.value}; "
          f"observation {obs_shape} float32, n = {_N.value}")
    run(_CAPACITY.value, _T.value, _B.value, _BATCH.value, _N.value, obs_shape, _CALLS.value,
        _REPEATS.value)


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
