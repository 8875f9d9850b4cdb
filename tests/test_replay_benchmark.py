"""The replay benchmark (`experiments.benchmarks.replay`) at tiny sizes, so that it cannot rot."""

import math

from experiments.benchmarks import replay


def test_replay_benchmark_times_every_figure_at_tiny_sizes(capsys):
    rows = replay.run(capacity=512, t=4, b=4, batch=8, n=2, obs_shape=(3,), calls=2,
                      repeats=1)
    names = [name for name, _, _ in rows]
    assert names == ["ceiling: dynamic_update_slice of the bytes", "transition replay add",
                     "position replay add", "ceiling: jnp.take of the same timesteps",
                     "transition replay sample, uniform",
                     "transition replay sample, uniform, alpha traced",
                     "transition replay sample, prioritised",
                     "position replay sample, uniform, alpha traced",
                     "position replay sample, prioritised"]
    for name, items, calls in rows:
        assert math.isfinite(items) and items > 0, name
        per_call = 16 if "add" in name or "update_slice" in name else 8  # T x B, or S
        assert math.isclose(items, per_call * calls), name
    out = capsys.readouterr().out
    assert "16 timesteps of 25 bytes" in out  # 3 float32, int32 action, reward, discount, bool
