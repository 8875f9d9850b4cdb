"""Results suite: each agent's *default* config on each standard environment it can act in.

    python -m experiments.benchmarks.suite --out_dir=/tmp/results \
        [--agents=vtrace,ppo,muzero,gumbel_muzero,efficientzero,stochastic_muzero,dqn,pqn,sampled_muzero] \
        [--envs=catch,CartPole-v1,...] \
        [--seeds=0,1,2] [--steps=0] [--minatar_steps=0]

Every (agent, environment) pair is one Anakin run of `anakin.default_config()` with
`config.agent = agents.default_config(agent)` and only `env.name`, the budget and the seeds
set: nothing is tuned per environment. The value-based agents (`dqn`, `pqn`; `SHIPPED`) run
instead with the runner's and the agent's settings of their shipped CartPole config (for DQN 8
environments x T = 8 into one replay, 2 updates per step, LayerNorm and a target copy every 100
updates; for PQN 32 x 64, 16 minibatches, 256 wide, lambda 0.95, rewards x 0.1), or on MinAtar
of their shipped MinAtar config where there is one (`SHIPPED_MINATAR`: PQN's `pqn_minatar.py`,
its reference's MinAtar settings), their epsilon (and PQN's step size) annealed over the same
fraction of the run as there, whatever the budget. Sampled MuZero (continuous actions only:
Pendulum) runs with its shipped Pendulum config's (16 environments x T = 16, rewards scaled by
0.1). The seeds run as one vmapped sweep (one compiled program, `config.sweep.seeds`). A pair
whose action space the agent cannot act in (a discrete-action agent on Pendulum, Sampled MuZero
on a discrete one) is skipped and listed as such.

Budgets (environment steps per seed), unless `--steps` sets one for every pair:
  classic control and Catch: 1M;
  MinAtar (gymnax): 10M for the model-free agents (V-trace, PPO, DQN, PQN), 1M for MuZero,
  EfficientZero and Stochastic MuZero (`--minatar_steps` overrides both).

Written to `--out_dir`: `results.md` (the table: mean and min-max over seeds of the mean training
episode return at a quarter and half of the budget and at the end (a run ends at the first
whole chunk past its budget), the wall time of each pair, the hardware and versions), `results.json` (the same, machine-readable), one learning-curve PNG per
environment (`curves_<env>.png`, every agent's mean and range over seeds), and each pair's
workdir (`runs/<agent>/<env>/`, its `run_<i>/metrics.jsonl`). An existing `--out_dir` is refused
unless `--resume`, which skips the pairs already done. A pair stopped by SIGTERM (preemption) stops
the suite: it is not marked done, no later pair starts, and `--resume` continues it from its
checkpoint. Send the signal to the Python process (`pkill -TERM -f experiments.benchmarks.suite`):
a shell that started it as part of a longer command dies and leaves the suite running.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import platform
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import app, flags

import agents
import anakin
import envs_jax
from experiments import _cli
from experiments import plot
from podracer import machine
from podracer.types import DiscreteSpec

CLASSIC = ("catch", "CartPole-v1", "Acrobot-v1", "Pendulum-v1")
MINATAR = tuple(f"gymnax:{game}-MinAtar"
                for game in ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"))
MODEL_FREE = ("vtrace", "ppo", "dqn", "pqn")  # 10M steps on MinAtar
# Agents run with their shipped config's runner and agent settings (see `pair_config`).
# Sampled MuZero's: its Pendulum config, whose reward scale keeps Pendulum's values inside the
# value support (the default's 1.0 does not).
SHIPPED = {"dqn": "experiments.configs.dqn_cartpole", "pqn": "experiments.configs.pqn_cartpole",
           "sampled_muzero": "experiments.configs.sampled_muzero_pendulum"}
# On MinAtar, where an agent ships a MinAtar config, that one instead.
SHIPPED_MINATAR = {"pqn": "experiments.configs.pqn_minatar"}
# Agents that act in continuous action spaces only (skipped on discrete ones).
CONTINUOUS_ONLY = ("sampled_muzero",)
# The runner's fields taken from a shipped config: how many environments feed each learner
# step (for a replay agent, its replay ratio) and how many learner steps each compiled call
# makes.
SHIPPED_RUNNER_FIELDS = ("num_devices", "num_envs", "rollout_length", "updates_per_chunk")
# The shipped agent fields that count learner steps (epsilon's and the step size's anneals).
ANNEALED = ("epsilon_anneal_steps", "anneal_lr_updates")
FRACTIONS = (0.25, 0.5, 1.0)  # of the budget, where the table reads the returns
RECORDS = 20  # records (chunks) per run, about: the curves' resolution

_AGENTS = flags.DEFINE_list("agents", ["vtrace", "ppo", "muzero", "gumbel_muzero",
                                       "efficientzero", "stochastic_muzero", "dqn", "pqn",
                                       "sampled_muzero"],
                            "Registered agents to run, each with its default config (or, in "
                            "SHIPPED, its shipped config's settings).")
_ENVS = flags.DEFINE_list("envs", list(CLASSIC + MINATAR), "envs_jax environments.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds, run as one vmapped sweep.")
_STEPS = flags.DEFINE_integer("steps", 0, "Environment steps per seed for every pair; 0 = the "
                              "budgets of the module docstring.")
_MINATAR_STEPS = flags.DEFINE_integer("minatar_steps", 0, "Environment steps per seed on "
                                      "MinAtar for every agent; 0 = the docstring's.")
_OUT = flags.DEFINE_string("out_dir", None, "Directory for the table, curves and workdirs.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue into an existing --out_dir, skipping the "
                            "pairs it has finished.")


def budget(agent: str, env: str, *, steps: int = 0, minatar_steps: int = 0) -> int:
    """Environment steps per seed of the pair (see the module docstring)."""
    if steps:
        return steps
    if env in MINATAR:
        if minatar_steps:
            return minatar_steps
        return 10_000_000 if agent in MODEL_FREE else 1_000_000
    return 1_000_000


def can_act(agent: str, env: str) -> bool:
    """Whether `agent` acts in `env`'s action space (discrete, unless the agent is in
    `CONTINUOUS_ONLY`; or continuous when the agent is registered with
    `continuous_actions`)."""
    discrete = isinstance(envs_jax.make(env).spec().action, DiscreteSpec)
    if discrete:
        return agent not in CONTINUOUS_ONLY
    return agents.accepts_continuous_actions(agent)


def pair_config(agent: str, env: str, seeds: Sequence[int], total_env_steps: int):
    """The run of one pair: the runner's and the agent's defaults, and nothing else but the
    environment, the budget and the seeds (and the chunk length, which sets only how often
    the run logs: about `RECORDS` records per run). An agent in `SHIPPED` takes its shipped
    config's agent settings and runner fields (`SHIPPED_RUNNER_FIELDS`) instead of the
    defaults, its schedules (`ANNEALED`) over the same fraction of the run as in that
    config."""
    config = anakin.default_config()
    config.agent = agents.default_config(agent)
    if agent in SHIPPED:
        module = SHIPPED_MINATAR.get(agent) if env in MINATAR else None
        shipped = importlib.import_module(module or SHIPPED[agent]).get_config()
        for field in SHIPPED_RUNNER_FIELDS:
            config[field] = shipped[field]
        config.agent = shipped.agent
    config.env.name = env
    config.total_env_steps = total_env_steps
    updates = total_env_steps // (config.num_envs * config.rollout_length)
    if agent in SHIPPED:
        # The schedules count learner steps: keep their share of the run, not their length.
        shipped_updates = shipped.total_env_steps // (config.num_envs * config.rollout_length)
        for field in ANNEALED:
            length = shipped.agent.get(field, 0)
            if length:
                config.agent[field] = max(1, round(length / shipped_updates * updates))
    config.updates_per_chunk = max(1, min(config.updates_per_chunk, updates // RECORDS))
    config.sweep.seeds = tuple(seeds)
    return config


def returns_at(records: list[dict[str, Any]], steps: float) -> float:
    """The mean training episode return of the last record at or before `steps` environment
    steps (the first record if none is); NaN when no record has one."""
    rows = [r for r in records if isinstance(r.get("episode_return"), (int, float))
            and math.isfinite(r["episode_return"])]  # a chunk with no episode ended: null
    if not rows:
        return float("nan")
    before = [r for r in rows if r["env_steps"] <= steps] or rows[:1]
    return float(before[-1]["episode_return"])


def summarise(runs: Sequence[plot.Run], total: int) -> dict[str, Any]:
    """Per budget fraction: the steps, and the mean, min and max over the runs."""
    points = []
    for fraction in FRACTIONS:
        # The run ends at the first whole chunk past the budget: its end is its last record.
        at = fraction * total if fraction < 1 else math.inf
        values = np.array([returns_at(run.records, at) for run in runs])
        points.append({"fraction": fraction, "env_steps": int(min(at, run_end(runs))),
                       "mean": float(np.mean(values)), "min": float(np.min(values)),
                       "max": float(np.max(values)), "seeds": values.tolist()})
    return {"points": points, "env_steps": run_end(runs)}


def run_end(runs: Sequence[plot.Run]) -> int:
    """The environment steps of the runs' last record."""
    return max(int(r.records[-1]["env_steps"]) for r in runs if r.records)


def hardware() -> dict[str, Any]:
    """The CPU model and core count, JAX's devices and the versions that fix the results."""
    return {"cpu": machine.cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "jax": jax.__version__,
            "devices": [str(d) for d in jax.devices()]}


def _fmt(point: dict[str, Any]) -> str:
    return f"{point['mean']:.2f} ({point['min']:.2f} to {point['max']:.2f})"


def _steps(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}K"


def write_table(out: str, results: dict[str, Any]) -> str:
    """`results.md`: one row per pair, the budget points as columns."""
    lines = ["# Results: each agent's default config", "",
             (f"Seeds {results['seeds']} as one vmapped sweep per pair; mean training episode "
              "return of the last record at or before each point, mean (min to max) over the "
              "seeds."), "",
             "| agent | environment | budget | at 1/4 | at 1/2 | at the end | wall time |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in results["pairs"]:
        if row.get("skipped"):
            lines.append(f"| {row['agent']} | {row['env']} | – | {row['skipped']} | | | |")
            continue
        points = row["points"]
        lines.append(f"| {row['agent']} | {row['env']} | {_steps(row['budget'])} | "
                     + " | ".join(_fmt(p) for p in points)
                     + f" | {row['wall_seconds'] / 60:.1f} min |")
    hw = results["hardware"]
    lines += ["", (f"Hardware: {hw['cpu']}, {hw['cores']} cores; {hw['platform']}; Python "
                   f"{hw['python']}, jax {hw['jax']}; devices {', '.join(hw['devices'])}."),
              f"Suite wall time: {results['wall_seconds'] / 60:.1f} min.", ""]
    path = os.path.join(out, "results.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def run_suite(out: str, agent_names: Sequence[str], env_names: Sequence[str],
              seeds: Sequence[int], *, steps: int = 0, minatar_steps: int = 0,
              resume: bool = False) -> dict[str, Any]:
    """Runs every pair into `out` and writes the table, the JSON and the curves. If SIGTERM
    stops a pair, returns at once with `results["interrupted"]` naming it, writing no table."""
    if os.path.exists(out) and os.listdir(out) and not resume:
        raise FileExistsError(f"--out_dir={out} exists and is not empty: choose a new directory, "
                              "or pass --resume to continue into it.")
    unknown = [a for a in agent_names if a not in agents.registered()]
    unknown += [e for e in env_names if e not in envs_jax.registered()]
    if unknown:
        raise ValueError(f"Unknown agents or environments: {unknown}. Agents: "
                         f"{agents.registered()}; environments: envs_jax.registered().")
    os.makedirs(out, exist_ok=True)
    started = time.perf_counter()
    results: dict[str, Any] = {"seeds": list(seeds), "hardware": hardware(), "pairs": []}
    curves: dict[str, list[plot.Run]] = {}
    for env in env_names:
        for agent in agent_names:
            row: dict[str, Any] = {"agent": agent, "env": env}
            results["pairs"].append(row)
            if not can_act(agent, env):
                row["skipped"] = "not run (discrete actions only)"
                continue
            total = budget(agent, env, steps=steps, minatar_steps=minatar_steps)
            workdir = os.path.join(out, "runs", agent, env.replace(":", "_"))
            done = os.path.join(workdir, "suite_done.json")
            if os.path.exists(done):
                with open(done) as f:
                    wall = json.load(f)["wall_seconds"]
            else:
                os.makedirs(os.path.dirname(workdir), exist_ok=True)
                # A pair stopped by SIGTERM left its wall time so far here, and a checkpoint.
                partial = os.path.join(workdir, "suite_partial.json")
                wall = 0.0
                if os.path.exists(partial):
                    with open(partial) as f:
                        wall = json.load(f)["wall_seconds"]
                pair_started = time.perf_counter()
                result = anakin.train(pair_config(agent, env, seeds, total), workdir)
                wall += time.perf_counter() - pair_started
                if result.interrupted:
                    # Preempted: the pair is not done and no further pair may start. Its
                    # checkpoint is in its workdir; --resume continues from it.
                    with open(partial, "w") as f:
                        json.dump({"wall_seconds": wall}, f)
                    results["interrupted"] = {"agent": agent, "env": env, "workdir": workdir}
                    return results
                with open(done, "w") as f:
                    json.dump({"wall_seconds": wall}, f)
            runs = plot.load_runs(workdir, label=agent)
            row.update(budget=total, wall_seconds=wall, **summarise(runs, total))
            curves.setdefault(env, []).extend(runs)
    results["wall_seconds"] = time.perf_counter() - started
    for env, runs in curves.items():
        plot.plot_curves(runs, os.path.join(out, f"curves_{env.replace(':', '_')}.png"),
                         title=f"{env}: default configs, seeds {list(seeds)}")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    write_table(out, results)
    return results


def main(argv: list[str]) -> None:
    del argv
    if not _OUT.value:
        raise app.UsageError("--out_dir is required (a new directory).")
    results = run_suite(_OUT.value, _AGENTS.value, _ENVS.value, [int(s) for s in _SEEDS.value],
                        steps=_STEPS.value, minatar_steps=_MINATAR_STEPS.value,
                        resume=_RESUME.value)
    if "interrupted" in results:
        stopped = results["interrupted"]
        raise SystemExit(f"Stopped by SIGTERM during {stopped['agent']} on {stopped['env']}: "
                         f"its checkpoint is in {stopped['workdir']}. Run the same command with "
                         "--resume to continue from it; no later pair was started.")
    with open(os.path.join(_OUT.value, "results.md")) as f:
        print(f.read())
    del results


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
