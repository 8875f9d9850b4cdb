"""Benchmark: what the host's work (logging, evaluation, checkpoints) costs an Anakin run.

`anakin.train` end to end, the same compiled programs each time, with:
  off          no workdir (no metrics files, TensorBoard or checkpoints), no evaluation
  ckpt         a workdir and a checkpoint after every chunk, no evaluation
  all          a workdir (metrics.jsonl, TensorBoard), a greedy evaluation and a checkpoint
               after every chunk
  shipped      a workdir, with the config's own evaluation and checkpoint intervals
Every variant runs once to compile and warm up; then `--rounds` rounds run them in turn
(interleaved, the order rotating, so that other load on the machine falls on all alike). Two
throughputs per run, both excluding compilation:
  chunks   env steps between the first and the last chunk's metrics over the seconds between
           them: the steady state, with every logging, evaluation and checkpoint hand-off that
           falls between them (the host loop fetches a chunk's metrics while the next computes)
  run      env steps over the run's seconds, from its first chunk's dispatch to the last
           checkpoint on disk: adds the first chunk and the wait for the final save
The load average is printed with every round.

    python -m experiments.benchmarks.anakin_host [--config=...] [--chunks=12] [--rounds=3]
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile

import jax
import numpy as np
from absl import app, flags, logging

import anakin
from experiments import _cli

# experiments/configs/, next to this package.
_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
_CONFIG = _cli.define_config_file(
    os.path.join(_CONFIGS, "vtrace_catch.py"),
    "Experiment config.")
_CHUNKS = flags.DEFINE_integer("chunks", 12, "Chunks per timed run (at least 2: the chunk "
                               "throughput is measured between the first and the last).",
                               lower_bound=2)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved rounds of every variant.")
# The workload of the figures in docs/benchmarks.md (Anakin's default batch was 256 x 20 then).
_NUM_ENVS = flags.DEFINE_integer("num_envs", 256, "Environments (overrides the config's).")
_ROLLOUT_LENGTH = flags.DEFINE_integer("rollout_length", 20, "T (overrides the config's).")
_VARIANTS = flags.DEFINE_list("variants", ["off", "ckpt", "all", "shipped"],
                              "Variants to run; the first is the baseline.")


def _variant(config, name: str, chunks: int):
    config = config.copy_and_resolve_references()
    per_chunk = config.updates_per_chunk * config.rollout_length * config.num_envs
    config.total_env_steps = chunks * per_chunk
    config.checkpoint_keep = 2
    if name != "shipped":
        config.eval_every_updates = config.updates_per_chunk if name == "all" else 0
        config.checkpoint_every_updates = config.updates_per_chunk if name != "off" else 0
    return config, name != "off"


def _run(config, name: str, chunks: int) -> tuple[float, float]:
    """(chunks, run) env steps per second of one run of variant `name` (module docstring)."""
    config, with_workdir = _variant(config, name, chunks)
    workdir = tempfile.mkdtemp(prefix=f"anakin-host-{name}-") if with_workdir else None
    try:
        result = anakin.train(config, workdir)
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    first, last = result.history[0], result.history[-1]
    chunk_rate = ((last["env_steps"] - first["env_steps"])
                  / (last["wall_time"] - first["wall_time"]))
    return chunk_rate, result.final_metrics["env_steps"] / result.run_seconds


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax's INFO lines, one per save
    config = _CONFIG.value
    config.num_envs, config.rollout_length = _NUM_ENVS.value, _ROLLOUT_LENGTH.value
    device = jax.devices()[0]
    print(f"# Anakin host-work benchmark: {config.agent.name} on {config.env.name}, "
          f"{config.num_envs} envs, T={config.rollout_length}, {config.updates_per_chunk} "
          f"updates/chunk, {_CHUNKS.value} chunks/run; {jax.device_count()} x {device.platform}, "
          f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}); "
          f"jax {jax.__version__}; shipped: eval every {config.eval_every_updates}, "
          f"checkpoint every {config.checkpoint_every_updates} updates", flush=True)
    for name in _VARIANTS.value:  # compile and warm up every program, the evaluator included
        _run(config, name, 2)
    rates = {kind: {name: [] for name in _VARIANTS.value} for kind in ("chunks", "run")}
    for r in range(_ROUNDS.value):
        load = os.getloadavg()[0]
        row = []
        # The order rotates from round to round, so that no variant always runs first.
        shift = r % len(_VARIANTS.value)
        for name in _VARIANTS.value[shift:] + _VARIANTS.value[:shift]:
            chunk_rate, run_rate = _run(config, name, _CHUNKS.value)
            rates["chunks"][name].append(chunk_rate)
            rates["run"][name].append(run_rate)
            row.append(f"{name} {chunk_rate:,.0f} / {run_rate:,.0f}")
        print(f"round {r}: load {load:.1f} -> {os.getloadavg()[0]:.1f}; env steps/s (chunks / "
              "run): " + ", ".join(row), flush=True)
    base_name = _VARIANTS.value[0]
    for kind, by_name in rates.items():
        base = np.median(by_name[base_name])
        print(f"\n{kind}: | variant | median env steps/s | rounds | share of '{base_name}' |"
              "\n|---|---:|---|---:|")
        for name, values in by_name.items():
            print(f"| {name} | {np.median(values):,.0f} | "
                  + ", ".join(f"{v:,.0f}" for v in values)
                  + f" | {100 * np.median(values) / base:.1f}% |")
        # Per-round ratios (the same round's variants ran back to back under the same load).
        for name in _VARIANTS.value[1:]:
            ratios = [a / b for a, b in zip(by_name[name], by_name[base_name])]
            print(f"{kind}: {name} / {base_name} per round: "
                  + ", ".join(f"{100 * x:.1f}%" for x in ratios)
                  + f" (median {100 * np.median(ratios):.1f}%)")


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
