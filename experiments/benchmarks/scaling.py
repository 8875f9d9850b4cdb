"""Scaling curves: Anakin and Sebulba throughput against devices and processes, and Sebulba's
throughput against the actor batch size (the Podracer paper's Figure 4b), as tables and PNGs.

Every point is a fresh subprocess running an existing command, so that each gets its own
device count:
  Anakin, devices    `experiments.benchmarks.anakin` with N simulated CPU devices (256 envs
                     each); it also times the chunk without its cross-device means
  Anakin, processes  the same under `experiments.launch`, P processes of 1 device each
  Sebulba, devices   `experiments.sebulba` (V-trace on envpool CartPole-v1) with N simulated
                     devices: N/2 actor devices, each with 2 threads x 32 envs, and N/2
                     learner devices (N = 1: one device does both); steady-state env steps/s
                     from its metrics.jsonl (the first two records, compilation, excluded)
  Sebulba, processes the same, P processes of 1 device each under `experiments.launch`
  Figure 4b          `experiments.benchmarks.sebulba --batch_sizes=...` (its table, parsed)

Simulated CPU devices and local processes share this machine's cores: the curves show what
the runners' own overheads (replication, collectives, threads) cost, not how they would scale
on accelerators. Plots use matplotlib (a dependency); without it, tables only.

    python -m experiments.benchmarks.scaling --out=docs/scaling [--devices=1,2,4,8]
        [--processes=1,2] [--batch_sizes=8,16,32] [--parts=anakin,sebulba,fig4b] [--merge]

`--merge --parts=` measures nothing and redraws the tables and plots from results.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from experiments import _cli
from experiments.benchmarks import _fig4b

_OUT = flags.DEFINE_string("out", "docs/scaling", "Directory for the PNGs and results.json.")
_DEVICES = flags.DEFINE_list("devices", ["1", "2", "4", "8"], "Simulated CPU device counts.")
_PROCESSES = flags.DEFINE_list("processes", ["1", "2"], "Local process counts.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["8", "16", "32"],
                                 "Envs per actor thread for Figure 4b.")
_PARTS = flags.DEFINE_list("parts", ["anakin", "sebulba", "fig4b"], "What to measure.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "benchmarks.anakin's timed chunks per point.")
_SEBULBA_UPDATES = flags.DEFINE_integer("sebulba_updates", 40, "Updates per Sebulba point.")
_FIG4B_ARGS = flags.DEFINE_string(
    "fig4b_args", "--config.agent.torso=conv --sweep_torso=conv --seconds=6 "
    "--learner_updates=2 --e2e_updates=5", "Extra arguments for experiments.benchmarks.sebulba.")
_TIMEOUT_S = flags.DEFINE_float("timeout_s", 900.0, "Longest one point may take.")
_MERGE = flags.DEFINE_bool("merge", False, "Keep the parts not measured now from an existing "
                           "results.json in --out (and plot them all).")


def _env(devices: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    if devices is not None:
        kept = [f for f in env.get("XLA_FLAGS", "").split()
                if not f.startswith("--xla_force_host_platform_device_count")]
        env["XLA_FLAGS"] = " ".join(kept + [f"--xla_force_host_platform_device_count={devices}"])
    return env


def _run(args: list[str], devices: int | None) -> str:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *args], check=False, env=_env(devices),
                          capture_output=True,
                          text=True, timeout=_TIMEOUT_S.value)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    print(f"  ({time.perf_counter() - start:.0f}s, load {os.getloadavg()[0]:.1f})", flush=True)
    return proc.stdout


def _result_line(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[0][len("RESULT "):])


def anakin_devices(n: int) -> dict:
    out = _run(["experiments.benchmarks.anakin", f"--config.num_devices={n}",
                f"--repeats={_REPEATS.value}"], n)
    return _result_line(out)


def anakin_processes(p: int) -> dict:
    args = ["experiments.launch", f"--num_processes={p}", "--cpu_devices_per_process=1",
            "--module=experiments.benchmarks.anakin", "--", f"--repeats={_REPEATS.value}"]
    return _result_line(_run(args, None))


def _sebulba_args(workdir: str, actors: tuple[int, ...], learners: tuple[int, ...],
                  processes: int = 1) -> list[str]:
    threads, envs, length = 2, 32, 32
    steps = _SEBULBA_UPDATES.value * processes * len(actors) * threads * envs * length
    return ["--config=experiments/configs/sebulba_vtrace_cartpole.py",
            f"--config.actor_device_ids={actors!r}",
            f"--config.learner_device_ids={learners!r}",
            f"--config.actor_threads_per_device={threads}",
            f"--config.envs_per_actor_thread={envs}", f"--config.rollout_length={length}",
            f"--config.total_env_steps={steps}", "--config.log_every_updates=1",
            "--config.checkpoint_every_updates=0", "--config.eval_every_updates=0",
            f"--workdir={workdir}"]


def _sebulba_rate(workdir: str) -> float:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    first, last = records[2], records[-1]
    return (last["env_steps"] - first["env_steps"]) / (last["wall_time"] - first["wall_time"])


def sebulba_devices(n: int) -> dict:
    # Half the devices act, half learn (one device does both when there is one).
    actors = tuple(range(max(1, n // 2)))
    learners = (0,) if n == 1 else tuple(range(n // 2, n))
    with tempfile.TemporaryDirectory() as workdir:
        _run(["experiments.sebulba", *_sebulba_args(workdir, actors, learners)], n)
        return {"devices": n, "actor_devices": len(actors), "learner_devices": len(learners),
                "processes": 1, "sebulba_sps": _sebulba_rate(workdir)}


def sebulba_processes(p: int) -> dict:
    with tempfile.TemporaryDirectory() as workdir:
        _run(["experiments.launch", f"--num_processes={p}", "--cpu_devices_per_process=1",
              "--", *_sebulba_args(workdir, (0,), (0,), p)], None)
        return {"devices": p, "processes": p, "sebulba_sps": _sebulba_rate(workdir)}


def fig4b() -> list[dict]:
    out = _run(["experiments.benchmarks.sebulba",
                f"--batch_sizes={','.join(_BATCH_SIZES.value)}", *_FIG4B_ARGS.value.split()],
               None)
    rows = _fig4b.parse(out)
    if not rows:
        raise RuntimeError("no Figure 4b rows in benchmarks.sebulba's output:\n" + out[-3000:])
    return rows


def _table(rows: list[dict], keys: list[str]) -> str:
    lines = ["| " + " | ".join(keys) + " |", "|" + "---:|" * len(keys)]
    for row in rows:
        cells = [f"{row[k]:,.0f}" if isinstance(row.get(k), float) else str(row.get(k, ""))
                 for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(results: dict, out: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots")
        return []
    written = []

    def save(fig, name):
        path = os.path.join(out, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    for axis, label in (("devices", "simulated CPU devices (sharing 2 cores)"),
                        ("processes", "local processes (1 CPU device each)")):
        curves = []
        if results.get(f"anakin_{axis}"):
            rows = results[f"anakin_{axis}"]
            curves.append(("Anakin", rows, "anakin_sps", "o-"))
            if any("no_mean_sps" in r for r in rows):
                curves.append(("Anakin without cross-device means",
                               [r for r in rows if "no_mean_sps" in r], "no_mean_sps", "o--"))
        if results.get(f"sebulba_{axis}"):
            curves.append(("Sebulba (CartPole)", results[f"sebulba_{axis}"], "sebulba_sps", "s-"))
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, rows, key, style in curves:
            ax.plot([r[axis] for r in rows], [r[key] for r in rows], style, label=name)
        ax.set_xlabel(label)
        ax.set_ylabel("env steps / s")
        ax.set_yscale("log")
        ax.set_xticks(sorted({r[axis] for _, rows, _, _ in curves for r in rows}))
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_title(f"Throughput against {axis}")
        save(fig, f"scaling_{axis}.png")
    if results.get("fig4b"):
        every_row = results["fig4b"]
        fig, ax = plt.subplots(figsize=(6, 4))
        thread_counts = sorted({r["actor_threads"] for r in every_row})
        for threads in thread_counts:
            rows = [r for r in every_row if r["actor_threads"] == threads]
            for key, style in (("envpool", "^:"), ("actor", "v:"), ("learner", "d:"),
                               ("sebulba", "o-")):
                name = "Sebulba end to end" if key == "sebulba" else f"{key} alone"
                if len(thread_counts) > 1:
                    name += f", {threads} actor threads"
                ax.plot([r["envs_per_thread"] for r in rows], [r[key] for r in rows], style,
                        label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({r["envs_per_thread"] for r in every_row})
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("actor batch size (envs per actor thread)")
        ax.set_ylabel("frames / s")
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_title("Sebulba on Pong: throughput against actor batch size (Fig. 4b)")
        save(fig, "sebulba_fig4b.png")
    return written


def main(argv):
    del argv
    os.makedirs(_OUT.value, exist_ok=True)
    results: dict = {"hardware": f"{os.cpu_count()} CPU cores", "started_load":
                     os.getloadavg()[0]}
    parts = set(_PARTS.value)
    path = os.path.join(_OUT.value, "results.json")
    if _MERGE.value and os.path.exists(path):
        # Keep the other parts' figures from an earlier run; replace the ones measured now.
        with open(path) as f:
            earlier = json.load(f)
        measured = {"anakin": ("anakin_devices", "anakin_processes"),
                    "sebulba": ("sebulba_devices", "sebulba_processes"), "fig4b": ("fig4b",)}
        drop = {key for part in parts for key in measured.get(part, ())}
        results = {**{k: v for k, v in earlier.items() if k not in drop and k != "failed"},
                   **results, "earlier_started_load": earlier.get("started_load")}

    def measure(name: str, what: str, fn, arg) -> None:
        # One failed point is reported and skipped; the rest still run and are kept.
        print(f"{what}", flush=True)
        try:
            results.setdefault(name, []).append(fn(arg))
        except Exception as error:  # noqa: BLE001
            print(f"  failed: {error}", flush=True)
            results.setdefault("failed", []).append(f"{what}: {error}"[:3000])
        with open(path, "w") as f:
            json.dump(results, f, indent=1)

    if "anakin" in parts:
        for n in map(int, _DEVICES.value):
            measure("anakin_devices", f"Anakin, {n} device(s)", anakin_devices, n)
        for p in map(int, _PROCESSES.value):
            measure("anakin_processes", f"Anakin, {p} process(es)", anakin_processes, p)
    if "sebulba" in parts:
        for n in map(int, _DEVICES.value):
            measure("sebulba_devices", f"Sebulba, {n} device(s)", sebulba_devices, n)
        for p in map(int, _PROCESSES.value):
            measure("sebulba_processes", f"Sebulba, {p} process(es)", sebulba_processes, p)
    if "fig4b" in parts:
        measure("fig4b_runs", "Figure 4b", lambda _: fig4b(), None)
        if results.get("fig4b_runs"):
            results["fig4b"] = results.pop("fig4b_runs")[0]
    results["ended_load"] = os.getloadavg()[0]
    with open(path, "w") as f:
        json.dump(results, f, indent=1)

    if results.get("anakin_devices"):
        print("\nAnakin against devices\n" + _table(
            results["anakin_devices"],
            ["devices", "ceiling_sps", "anakin_sps", "no_mean_sps", "load"]))
    if results.get("anakin_processes"):
        print("\nAnakin against processes\n" + _table(
            results["anakin_processes"],
            ["processes", "devices", "ceiling_sps", "anakin_sps", "no_mean_sps", "load"]))
    if results.get("sebulba_devices"):
        print("\nSebulba against devices\n" + _table(
            results["sebulba_devices"],
            ["devices", "actor_devices", "learner_devices", "sebulba_sps"]))
    if results.get("sebulba_processes"):
        print("\nSebulba against processes\n" + _table(
            results["sebulba_processes"], ["processes", "sebulba_sps"]))
    if results.get("fig4b"):
        print("\nFigure 4b (frames/s)\n" + _table(
            results["fig4b"], ["actor_threads", "envs_per_thread", "envpool", "actor", "learner",
                                "sebulba"]))
    for path in _plot(results, _OUT.value):
        print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
