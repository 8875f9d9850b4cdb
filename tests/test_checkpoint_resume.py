"""Pre-emption end to end, with real processes: a run killed with SIGKILL, then stopped with
SIGTERM, then finished by rerunning the same command ends bit-identical to an uninterrupted
run with the same seed and device count.

The uninterrupted reference runs in this process, and the three real processes share a JAX
compilation cache, so that only the first compiles. Bit for bit is the right comparison here,
unlike between a sweep's run and the run alone (tests/test_sweep.py): a resumed run runs the
same compiled chunk program as the uninterrupted one (the restored state has the same shapes,
and nothing in the program depends on where the run starts), with the same seed on the same
number of devices of the same machine, and XLA is deterministic for that whatever else the
process holds (the reference's process has 8 simulated devices, the real ones 2).
"""

import json
import os
import signal

import numpy as np
from conftest import checkpoint_steps, flat_arrays, start_experiment, wait_until

import anakin
from experiments.configs import vtrace_catch
from podracer.checkpoint import load_arrays, read_metadata

# The shape of the other Anakin tests' small runs, so that the in-process reference can reuse
# the programs they compiled.
UPDATES_PER_CHUNK = 5
CHECKPOINT_EVERY = 3 * UPDATES_PER_CHUNK  # every third chunk
NUM_CHUNKS = 24
STEPS_PER_CHUNK = 16 * 10 * UPDATES_PER_CHUNK
# Fields that measure time, not the run.
TIMING = {"steps_per_second", "wall_time"}


OVERRIDES = {
    "seed": 5,
    "num_devices": 2,
    "num_envs": 16,
    "rollout_length": 10,
    "updates_per_chunk": UPDATES_PER_CHUNK,
    "total_env_steps": NUM_CHUNKS * STEPS_PER_CHUNK,
    "checkpoint_every_updates": CHECKPOINT_EVERY,
    "eval_every_updates": 0,
}


def _command(workdir):
    return ["-m", "experiments.anakin",
            "--config=experiments/configs/vtrace_catch.py",
            *(f"--config.{k}={v}" for k, v in OVERRIDES.items()), f"--workdir={workdir}"]


def _start(workdir, cache):
    return start_experiment(_command(workdir), cache=cache, num_devices=2)


def _records(workdir):
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def _without_timing(records):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def test_killed_then_preempted_run_resumes_bit_identical(tmp_path):
    reference, interrupted = str(tmp_path / "reference"), str(tmp_path / "interrupted")
    cache = str(tmp_path / "jax_cache")
    final_updates = NUM_CHUNKS * UPDATES_PER_CHUNK

    # An uninterrupted run.
    config = vtrace_catch.get_config()
    for key, value in OVERRIDES.items():
        config[key] = value
    result = anakin.train(config, reference)
    assert not result.interrupted and result.resumed_from_updates is None
    assert checkpoint_steps(reference)[-1] == final_updates

    # The same command, killed outright once it has written a checkpoint: whatever it logged
    # after that checkpoint is lost work.
    proc = _start(interrupted, cache)
    wait_until(proc, lambda: len(checkpoint_steps(interrupted)) >= 1 and len(_records(interrupted)) >= 8,
                "a checkpoint and 8 chunks")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = checkpoint_steps(interrupted)[-1]
    assert killed_at < final_updates

    # Rerun: it resumes, and is pre-empted (SIGTERM) a few chunks later.
    proc = _start(interrupted, cache)
    # (A checkpoint newer than the one it resumed from shows it is past start-up and into
    # its chunks; the old run's records are still in metrics.jsonl until it rewinds them.)
    wait_until(proc, lambda: checkpoint_steps(interrupted)[-1] > killed_at,
                "a checkpoint after resuming")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert f"Resuming from the checkpoint at update {killed_at:,}" in out, out
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "Stopped by signal 15" in out and "rerun the same command to resume" in out
    # SIGTERM saved a checkpoint at the chunk it stopped after, whatever the schedule.
    stopped_at = _records(interrupted)[-1]["updates"]
    assert checkpoint_steps(interrupted)[-1] == stopped_at < final_updates
    assert read_metadata(os.path.join(interrupted, "checkpoints"))["updates"] == stopped_at

    # Rerun again: it finishes.
    proc = _start(interrupted, cache)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert f"Resuming from the checkpoint at update {stopped_at:,}" in out, out

    # Everything a run carries is bit-identical: parameters, optimiser state, environment
    # states, RNG keys, counters.
    expected, expected_meta = load_arrays(os.path.join(reference, "checkpoints"))
    actual, actual_meta = load_arrays(os.path.join(interrupted, "checkpoints"))
    assert expected_meta["updates"] == actual_meta["updates"] == final_updates
    flat_expected = flat_arrays(expected)
    flat_actual = flat_arrays(actual)
    assert flat_expected.keys() == flat_actual.keys()
    assert any("params" in k for k in flat_expected) and any("key" in k for k in flat_expected)
    for name, value in flat_expected.items():
        assert value.dtype == flat_actual[name].dtype, name
        np.testing.assert_array_equal(flat_actual[name], value, err_msg=name)
    assert expected_meta["fingerprint"] == actual_meta["fingerprint"]
    # And so is the log: one record per chunk, no repeats, the same losses and returns.
    assert _without_timing(_records(interrupted)) == _without_timing(_records(reference))
    # TensorBoard, reading the three processes' event files, hides what the killed and the
    # pre-empted process logged after their checkpoints, which their successors logged again.
    assert _tensorboard(interrupted) == _tensorboard(reference)


def _tensorboard(workdir):
    from tensorboard.backend.event_processing import event_accumulator

    reader = event_accumulator.EventAccumulator(workdir)
    reader.Reload()
    return [(e.step, e.value) for e in reader.Scalars("loss")]
