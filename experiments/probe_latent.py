"""Does a MuZero or EfficientZero run's representation still hold the board feature its value
needs? On a MinAtar board: where the player is (on Freeway, the chicken's row).

    python -m experiments.probe_latent --workdir=DIR [--samples=8192]

Reads the newest checkpoint of an Anakin workdir of either agent (EfficientZero's h and f are
MuZero's network), draws --samples stored observations from each run's replay and prints, for
each run (with `env.frame_stack`, the player is read from the newest frame):

  decoded   for the player's row, and for its column where that varies (not on Freeway):
            the share of held-out observations (the last quarter of the draw) whose row (or
            column) a linear read-out of the latent h(o) gets right, the read-out a ridge
            regression onto the one-hot codes fitted on the other three quarters; beside it the
            share of the most common row (what a read-out that ignores the latent gets), and
            the same read-out of the latent of a freshly initialised network of the run's
            architecture (what training added, or took away);
  value     the mean value v(h(o)) of the drawn observations on each of the player's rows, 0
            (the top; on Freeway where a crossing scores) to 9 (Freeway's start): whether the
            value tells the rows apart.

A latent the row cannot be read from leaves the value flat over the rows, so the search sees
no reason to move up: EfficientZero's consistency loss does this on Freeway
(docs/journal/2026-11-29.md, "after the last").
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags

from agents.muzero.search import value_to_scalar
from experiments import _cli
from experiments.probing import newest_frame, player_cell, saved_env, trained_network
from podracer import checkpoint
from podracer.types import EnvSpec

BOARD = 10  # MinAtar's boards are 10 × 10


def linear_readout(latents: np.ndarray, labels: np.ndarray, num_classes: int, *,
                   fit_fraction: float = 0.75, ridge: float = 1e-3) -> tuple[float, float]:
    """(accuracy, majority share) on the held-out rows of `latents` [N, D] (the last
    1 - `fit_fraction` of them) of the argmax of a ridge regression (with a bias, weight
    `ridge`) from the latent onto the one-hot code of `labels` [N], fitted on the first
    `fit_fraction`; the majority share is that of the held-out rows' most common label."""
    latents = np.asarray(latents, np.float64).reshape(len(labels), -1)
    x = np.concatenate([latents, np.ones((len(latents), 1))], axis=1)
    y = np.eye(num_classes)[labels]
    cut = int(len(labels) * fit_fraction)
    gram = x[:cut].T @ x[:cut] + ridge * np.eye(x.shape[1])
    weights = np.linalg.solve(gram, x[:cut].T @ y[:cut])
    held_out = labels[cut:]
    accuracy = float(np.mean(np.argmax(x[cut:] @ weights, axis=1) == held_out))
    majority = float(np.bincount(held_out, minlength=num_classes).max() / len(held_out))
    return accuracy, majority


def mean_by_label(values: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """[num_classes] the mean of `values` over each label's entries (NaN where none)."""
    sums = np.bincount(labels, weights=values, minlength=num_classes)
    counts = np.bincount(labels, minlength=num_classes)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def main(argv):
    del argv
    workdir, samples = flags.FLAGS.workdir, flags.FLAGS.samples
    with open(os.path.join(workdir, "config.json")) as f:
        config = json.load(f)
    agent_config = ml_collections.ConfigDict(config["agent"])
    if agent_config.name not in ("muzero", "efficientzero"):
        raise SystemExit(f"{workdir} is a run of {agent_config.name!r}; this probe reads "
                         "MuZero's or EfficientZero's representation h.")
    if "MinAtar" not in config["env"]["name"]:
        raise SystemExit(f"{workdir} ran {config['env']['name']!r}; this probe reads where the "
                         "player is on a MinAtar board.")
    env, frame_stack = saved_env(config)
    env_spec = EnvSpec(observation=env.observation_spec(), action=env.action_spec())
    state, metadata = checkpoint.load_arrays(os.path.join(workdir, "checkpoints"))
    items = state["learner_state"]["replay"]["items"]
    if "observation" not in items:
        raise SystemExit("This probe reads whole observations; the replay stores frames once.")
    params = state["learner_state"]["params"]["params"]
    params = params.get("muzero", params)  # EfficientZero's h, g and f
    network = trained_network(agent_config, env_spec, params)
    support = int(agent_config.support_size)

    @jax.jit
    def latent_and_value(p, observation):
        latent = network.apply(p, observation, method="represent")
        _, value_logits = network.apply(p, latent, method="predict")
        return latent, value_to_scalar(value_logits, support)

    runs = jax.tree.leaves(items)[0].shape[1]
    print(f"{config['env']['name']}, {agent_config.name} ({network.kind}), "
          f"{metadata['env_steps']:,} steps, {runs} run(s)")
    for r in range(runs):
        stored = np.asarray(items["observation"][0, r])
        stored = stored.reshape((-1,) + stored.shape[2:])
        pick = np.random.default_rng(r).choice(len(stored), min(samples, len(stored)),
                                               replace=False)
        observation = jnp.asarray(stored[pick])
        rows, columns = map(np.asarray, player_cell(newest_frame(observation, frame_stack)))
        run_params = {"params": jax.tree.map(lambda x, r=r: jnp.asarray(x[0, r]), params)}
        latent, value = map(np.asarray, latent_and_value(run_params, observation))
        fresh = network.init(jax.random.PRNGKey(r), observation[:1], jnp.zeros((1,), jnp.int32))
        fresh_latent = np.asarray(latent_and_value(fresh, observation)[0])
        for name, labels in (("row", rows), ("column", columns)):
            if np.all(labels == labels[0]):
                continue  # Freeway's chicken keeps to one column
            accuracy, majority = linear_readout(latent, labels, BOARD)
            at_init, _ = linear_readout(fresh_latent, labels, BOARD)
            print(f"decoded run {r}: the player's {name} from h(o) {accuracy:.3f} of the last "
                  f"quarter (the most common {name} {majority:.3f}; a fresh network "
                  f"{at_init:.3f})")
        by_row = mean_by_label(value, rows, BOARD)
        print(f"value run {r}: v(h(o)) by row 0..9: "
              + " ".join("   -  " if np.isnan(v) else f"{v:6.3f}" for v in by_row))


if __name__ == "__main__":
    # Defined here, not on import, so tests can import this module beside another probe's.
    flags.DEFINE_string("workdir", None, "An Anakin workdir of a MuZero or EfficientZero run "
                        "on a MinAtar game.")
    flags.DEFINE_integer("samples", 8192, "Stored observations drawn from each replay.")
    flags.mark_flag_as_required("workdir")
    app.run(main, flags_parser=_cli.parse_flags)
