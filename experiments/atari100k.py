"""The Atari 100k benchmark: its 26 games, human-normalised scores, and a results table.

    python -m experiments.atari100k                      # EfficientZero's published table
    python -m experiments.atari100k --runs='/tmp/a100k/*' --out=results.md

Atari 100k (Kaiser et al., 2020) allows 100K agent steps (400K frames at frame skip 4) per game
on 26 games. A score s on a game is reported human-normalised, (s - random) / (human - random),
with the random and human scores of the DQN and Rainbow literature (`GAMES`), and a set of games
by the mean and the median of its human-normalised scores.

`--runs` takes finished Sebulba workdirs (comma-separated, shell globs allowed). Each must have
run under the `atari100k` (or `atari100k_grey`) protocol on one of the 26 games and reached
100K agent steps: its score is the `eval_return` of its last evaluation at or below the budget
(plus the one update by which a run may pass it). Runs of the same game are averaged (seeds).
A run that breaks a rule is refused with a message naming it; `--allow_partial` accepts runs
that stopped short of 100K steps (its table then says so). See docs/atari100k.md.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence

from absl import app, flags

from experiments import _cli
from podracer.metrics import read_records

BUDGET = 100_000  # agent steps per game
PROTOCOLS = ("atari100k", "atari100k_grey")  # sebulba.ATARI_PROTOCOLS entries for this benchmark


@dataclasses.dataclass(frozen=True)
class Game:
    random: float  # the score of uniformly random actions
    human: float  # the human tester's score
    efficientzero: float  # Ye et al. (2021), its per-game table


# Random and human scores as in the Atari 100k papers (from the DQN and Rainbow literature);
# EfficientZero's scores from its paper's per-game table, whose human-normalised mean and median
# are 1.943 and 1.090 (the 194.3% and 109.0% the NeurIPS 2021 version states).
GAMES: dict[str, Game] = {
    "Alien": Game(227.8, 7127.7, 808.5),
    "Amidar": Game(5.8, 1719.5, 148.6),
    "Assault": Game(222.4, 742.0, 1263.1),
    "Asterix": Game(210.0, 8503.3, 25557.8),
    "BankHeist": Game(14.2, 753.1, 351.0),
    "BattleZone": Game(2360.0, 37187.5, 13871.2),
    "Boxing": Game(0.1, 12.1, 52.7),
    "Breakout": Game(1.7, 30.5, 414.1),
    "ChopperCommand": Game(811.0, 7387.8, 1117.3),
    "CrazyClimber": Game(10780.5, 35829.4, 83940.2),
    "DemonAttack": Game(152.1, 1971.0, 13003.9),
    "Freeway": Game(0.0, 29.6, 21.8),
    "Frostbite": Game(65.2, 4334.7, 296.3),
    "Gopher": Game(257.6, 2412.5, 3260.3),
    "Hero": Game(1027.0, 30826.4, 9315.9),
    "Jamesbond": Game(29.0, 302.8, 517.0),
    "Kangaroo": Game(52.0, 3035.0, 724.1),
    "Krull": Game(1598.0, 2665.5, 5663.3),
    "KungFuMaster": Game(258.5, 22736.3, 30944.8),
    "MsPacman": Game(307.3, 6951.6, 1281.2),
    "Pong": Game(-20.7, 14.6, 20.1),
    "PrivateEye": Game(24.9, 69571.3, 96.7),
    "Qbert": Game(163.9, 13455.0, 13781.9),
    "RoadRunner": Game(11.5, 7845.0, 17751.3),
    "Seaquest": Game(68.4, 42054.7, 1100.2),
    "UpNDown": Game(533.4, 11693.2, 17264.2),
}


class RunError(ValueError):
    """A workdir that cannot count as an Atari 100k result; the message names it and why."""


def human_normalised(game: str, score: float) -> float:
    """(score - random) / (human - random) on `game` (one of `GAMES`)."""
    g = GAMES[game]
    return (score - g.random) / (g.human - g.random)


def mean_and_median(normalised: Iterable[float]) -> tuple[float, float]:
    """The mean and the median of human-normalised scores (over games)."""
    values = list(normalised)
    return statistics.fmean(values), statistics.median(values)


def game_of_task(task: str) -> str:
    """"Breakout-v5" -> "Breakout" (envpool's task ids are "<Game>-v5")."""
    return task.rsplit("-", 1)[0]


@dataclasses.dataclass(frozen=True)
class RunResult:
    workdir: str
    game: str
    seed: int | None
    env_steps: int  # agent steps when the evaluation was made
    score: float  # its eval_return: mean unclipped game score of the evaluation's episodes
    partial: bool  # fewer than BUDGET agent steps (accepted with allow_partial)


def read_run(workdir: str, *, allow_partial: bool = False) -> RunResult:
    """The Atari 100k result of one finished run's workdir, or a `RunError` saying why not."""
    try:
        with open(os.path.join(workdir, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise RunError(f"{workdir}: no readable config.json ({e})") from None
    env = config.get("env", {})
    protocol, task = env.get("protocol"), env.get("task", "")
    if protocol not in PROTOCOLS:
        raise RunError(f"{workdir}: ran under protocol {protocol!r}, not one of {PROTOCOLS}; "
                       "Atari 100k results need --config.env.protocol=atari100k")
    game = game_of_task(task)
    if game not in GAMES:
        raise RunError(f"{workdir}: task {task!r} is not one of the 26 Atari 100k games")
    evals = [r for r in read_records(workdir)
             if isinstance(r.get("eval_return"), (int, float)) and "env_steps" in r]
    if not evals:
        raise RunError(f"{workdir}: no evaluation (eval_return) in metrics.jsonl; set "
                       "config.eval_every_updates to a divisor of the run's updates so that one "
                       "falls at its end")
    # A run ends at the first whole update at or past its total_env_steps: allow that update.
    per_update = max(r["env_steps"] / max(r.get("updates", 1), 1) for r in evals)
    within = [r for r in evals if r["env_steps"] < BUDGET + per_update]
    if not within:
        raise RunError(f"{workdir}: its first evaluation is at {evals[0]['env_steps']:,} agent "
                       f"steps, past the {BUDGET:,}-step budget")
    last = max(within, key=lambda r: r["env_steps"])
    partial = last["env_steps"] < BUDGET
    if partial and not allow_partial:
        raise RunError(f"{workdir}: its last evaluation within the budget is at "
                       f"{last['env_steps']:,} agent steps, short of {BUDGET:,} (an unfinished "
                       "run, or no evaluation at its end); --allow_partial to include it anyway")
    return RunResult(workdir=workdir, game=game, seed=config.get("seed"),
                     env_steps=int(last["env_steps"]), score=float(last["eval_return"]),
                     partial=partial)


def expand(patterns: Sequence[str]) -> list[str]:
    """Workdirs named by `patterns` (paths or shell globs), in order, without repeats."""
    workdirs: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise RunError(f"{pattern}: matches no workdir")
        workdirs += [m for m in matches if m not in workdirs]
    return workdirs


def _fmt(x: float) -> str:
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def results_table(results: Sequence[RunResult]) -> str:
    """A markdown table: per game the mean score over its runs, its human-normalised score and
    EfficientZero's; then the mean and median human-normalised score over these games."""
    by_game: dict[str, list[RunResult]] = {}
    for r in results:
        by_game.setdefault(r.game, []).append(r)
    header = ("| game | runs | score | human-normalised | EfficientZero "
              "| EfficientZero normalised |")
    lines = [header, "|---|---|---|---|---|---|"]
    ours, theirs = {}, {}
    for game in sorted(by_game):
        runs = by_game[game]
        score = statistics.fmean(r.score for r in runs)
        ours[game] = human_normalised(game, score)
        theirs[game] = human_normalised(game, GAMES[game].efficientzero)
        note = " (partial)" if any(r.partial for r in runs) else ""
        lines.append(f"| {game} | {len(runs)}{note} | {_fmt(score)} | {ours[game]:.3f} | "
                     f"{_fmt(GAMES[game].efficientzero)} | {theirs[game]:.3f} |")
    mean, median = mean_and_median(ours.values())
    ez_mean, ez_median = mean_and_median(theirs.values())
    all_mean, all_median = efficientzero_summary()
    lines += ["", (f"Over {len(ours)} of 26 games: mean human-normalised score {mean:.3f}, "
                   f"median {median:.3f} (EfficientZero on the same games: mean {ez_mean:.3f}, "
                   f"median {ez_median:.3f}; on all 26: {all_mean:.3f} and {all_median:.3f}).")]
    partial = [r for r in results if r.partial]
    if partial:
        lines.append("Partial runs (fewer than 100,000 agent steps): " + ", ".join(
            f"{r.workdir} ({r.env_steps:,})" for r in partial) + ".")
    return "\n".join(lines) + "\n"


def efficientzero_summary() -> tuple[float, float]:
    """EfficientZero's mean and median human-normalised score over the 26 games."""
    return mean_and_median(human_normalised(g, s.efficientzero) for g, s in GAMES.items())


def reference_table(games: Mapping[str, Game] = GAMES) -> str:
    """The random, human and EfficientZero scores of every game, as markdown."""
    lines = ["| game | random | human | EfficientZero | normalised |", "|---|---|---|---|---|"]
    for name, g in games.items():
        lines.append(f"| {name} | {_fmt(g.random)} | {_fmt(g.human)} | {_fmt(g.efficientzero)} "
                     f"| {human_normalised(name, g.efficientzero):.3f} |")
    mean, median = efficientzero_summary()
    lines += ["", f"EfficientZero: mean {mean:.3f}, median {median:.3f}."]
    return "\n".join(lines) + "\n"


def _define_flags() -> None:
    """The command's flags, defined only when it runs as a command: importing this module
    (the tests do, next to `experiments.plot`, which also has `--out`) defines none."""
    flags.DEFINE_list("runs", None, "Finished run workdirs (paths or shell globs).")
    flags.DEFINE_bool("allow_partial", False,
                      "Include runs that stopped short of 100K agent steps.")
    flags.DEFINE_string("out", None, "Also write the markdown table to this file.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}; give workdirs with --runs.")
    args = flags.FLAGS
    if not args.runs:
        table = reference_table()
    else:
        try:
            results = [read_run(w, allow_partial=args.allow_partial) for w in expand(args.runs)]
        except RunError as e:
            sys.exit(f"atari100k: {e}")
        table = results_table(results)
    print(table, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=_cli.parse_flags)
