"""The Figure 4b table (Sebulba's throughput against actor threads and actor batch) as
`experiments.benchmarks.sebulba` prints it and `experiments.benchmarks.scaling` reads it back:
one definition of its columns for both."""

from __future__ import annotations

from collections.abc import Sequence

# (column heading, key in the parsed rows); the last is a percentage, not parsed.
COLUMNS = (
    ("actor threads per device", "actor_threads"),
    ("envs per actor thread", "envs_per_thread"),
    ("learner batch (trajectories)", "trajectories"),
    ("envpool alone", "envpool"),
    ("actor alone", "actor"),
    ("learner alone", "learner"),
    ("Sebulba end to end", "sebulba"),
    ("end to end / envpool alone", None),
)
RATES = ("envpool", "actor", "learner", "sebulba")  # frames/s, in the table's order


def header() -> str:
    """The table's heading and alignment rows."""
    return ("| " + " | ".join(name for name, _ in COLUMNS) + " |\n"
            + "|" + "---:|" * len(COLUMNS))


def row(threads: int, envs: int, trajectories: int, frames: Sequence[float]) -> str:
    """One point: `frames` are the frames/s of envpool alone, the actor alone, the learner
    alone and Sebulba end to end."""
    envpool, *_, sebulba = frames
    return (f"| {threads} | {envs} | {trajectories} | "
            + " | ".join(f"{rate:,.0f}" for rate in frames)
            + f" | {100 * sebulba / envpool:.0f}% |")


def parse(text: str) -> list[dict]:
    """The rows of every Figure 4b table in `text` (a run's output), read by column heading:
    integers for the sizes, floats (frames/s) for the rates. Lines that are not table rows
    (the runs' own logs, printed between the points) are skipped; another table's heading
    ends the Figure 4b table."""
    keys = dict(COLUMNS)
    rows, index = [], None
    for line in text.splitlines():
        if not line.lstrip().startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == COLUMNS[0][0]:
            index = {keys[name]: i for i, name in enumerate(cells) if keys.get(name)}
            missing = [key for _, key in COLUMNS if key and key not in index]
            if missing:
                raise ValueError(f"Figure 4b table without the columns {missing}: {line!r}")
            continue
        if set("".join(cells)) <= set("-:"):  # an alignment row
            continue
        if not cells[0].isdigit():  # another table's heading or row
            index = None
            continue
        if index is None:
            continue
        values = {key: cells[i].replace(",", "") for key, i in index.items()}
        rows.append({key: (float(v) if key in RATES else int(v)) for key, v in values.items()})
    return rows
