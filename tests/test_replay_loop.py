"""`podracer.replay_loop`: the warm-up and replay-ratio loop (no update before every device
is ready, then exactly `updates_per_step` of them, metrics averaged over them) and the memory
check naming the largest capacity that fits."""

import jax
import jax.numpy as jnp
import pytest

from podracer import replay_loop
from podracer.config import ConfigError


def _update(state, key):
    return state + 1, {"loss": state.astype(jnp.float32)}


@pytest.mark.parametrize("size, expected_state, expected_loss", [(3, 0, 0.0), (4, 3, 1.0)])
def test_updates_wait_for_the_warm_up_then_run_the_replay_ratio(size, expected_state,
                                                                expected_loss):
    state, metrics = jax.jit(lambda s: replay_loop.train_when_ready(
        _update, s, jax.random.key(0), size=jnp.asarray(size), updates_per_step=3,
        min_items=4, metric_names=("loss",), axis_name=None))(jnp.zeros((), jnp.int32))
    assert int(state) == expected_state
    assert float(metrics["loss"]) == expected_loss  # the mean of 0, 1, 2 once ready


def test_every_device_waits_for_the_slowest_replay():
    # Under pmap over two devices whose replays hold 3 and 4 items (min 4): neither updates,
    # so the replicated update runs everywhere or nowhere; at 4 and 5 both make 3 updates.
    step = jax.pmap(lambda size, s: replay_loop.train_when_ready(
        _update, s, jax.random.key(0), size=size, updates_per_step=3, min_items=4,
        metric_names=("loss",), axis_name="d"), axis_name="d")
    for sizes, expected in [((3, 4), [0, 0]), ((4, 5), [3, 3])]:
        state, _ = step(jnp.asarray(sizes), jnp.zeros((2,), jnp.int32))
        assert state.tolist() == expected, sizes


def test_each_update_gets_its_own_key():
    def update(state, key):  # writes its key's draw into the next slot
        count, draws = state
        return (count + 1, draws.at[count].set(jax.random.uniform(key))), {}

    (count, draws), _ = replay_loop.train_when_ready(
        update, (jnp.asarray(0), jnp.zeros(3)), jax.random.key(0), size=jnp.asarray(4),
        updates_per_step=3, min_items=4, metric_names=(), axis_name=None)
    assert int(count) == 3 and len(set(draws.tolist())) == 3  # three different draws


class _Device:
    platform = "gpu"

    def memory_stats(self):
        return {"bytes_limit": 1000}


def test_a_replay_beyond_the_devices_memory_is_refused_with_the_capacity_that_fits():
    replay_loop.check_memory(800, capacity=100, field="agent.replay_capacity",
                             unit="timesteps", device=_Device())  # 80% fits
    with pytest.raises(ConfigError, match="use at most 80 timesteps") as info:
        replay_loop.check_memory(1000, capacity=100, field="agent.replay_capacity",
                                 unit="timesteps", device=_Device())
    assert info.value.field == "agent.replay_capacity"
