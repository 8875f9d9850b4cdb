"""Probes of what MuZero's and EfficientZero's learnt models know about Catch, after training
each with its shipped config (same seed, same budget): every state and transition of Catch is
enumerated from its rules, so nothing is held out by chance.

    python -m experiments.probe_catch [--seed=0] [--total_env_steps=48000] \
        [--efficientzero=past_end_targets=masked,q_transform=tree_min_max]

    # seeds as one vmapped sweep, probed at several budgets (the run resumed from its
    # checkpoint in a temporary workdir between budgets); one line per agent and budget,
    # the mean over seeds
    python -m experiments.probe_catch --seeds=0,1,2,3,4,5 --budgets=8000,16000,24000,32000

For each agent it prints:
  value error     mean |v(o) - v*(o)| over the 225 states with the ball above the bottom row,
                  v* the optimal value (a catchable ball is worth gamma^(steps left - 1),
                  an uncatchable one minus that);
  reward error    mean |r_hat - r| of the model's reward (EfficientZero: its value prefix)
                  for the 75 last-step transitions, r = +1 caught, -1 missed;
  search entropy  mean entropy (nats) of the acting search's visit distribution over the
                  225 states (log 3 = 1.10 is uniform);
  greedy optimal  the share of the catchable states where some action loses the ball
                  (the decisive ones) in which the greedy search's action (no noise, most
                  visits) keeps it catchable;
  with --budgets also
  near, far       the value error over the states with the ball 1-3 rows above the
                  paddle's row ("near") and 7-9 rows ("far"): how far back the value of
                  the last reward has reached;
  and for EfficientZero the consistency probes of `agents.efficientzero.probes`.
"""

from __future__ import annotations

import ast
import tempfile

import jax
import numpy as np
from absl import app, flags

import anakin
import envs_jax
from agents import efficientzero as ez
from agents import muzero
from agents.efficientzero import probes
from experiments import _cli
from experiments.configs import efficientzero_catch, muzero_catch

_SEED = flags.DEFINE_integer("seed", 0, "Seed of both runs.")
_STEPS = flags.DEFINE_integer("total_env_steps", 48_000, "Environment steps of each run.")
_SEEDS = flags.DEFINE_list("seeds", [], "Seeds as one sweep (with --budgets); overrides --seed.")
_BUDGETS = flags.DEFINE_list("budgets", [], "Environment steps at which to probe the sweep.")
_EZ = flags.DEFINE_list("efficientzero", [], "field=value changes to EfficientZero's agent "
                        "config (Python literals, e.g. False or 0.5, or strings).")

ROWS, COLUMNS = 10, 5


def _board(ball_y: int, ball_x: int, paddle: int) -> np.ndarray:
    o = np.zeros((ROWS, COLUMNS), np.float32)
    o[ball_y, ball_x] = 1.0
    o[ROWS - 1, paddle] = 1.0
    return o


def catch_enumeration(discount: float):
    """(states [225, 10, 5], v* [225], last-step observations [75, 10, 5], actions [75],
    rewards [75], transitions (o [675], a [675], o' [675]))."""
    states, values, last, last_actions, last_rewards = [], [], [], [], []
    obs, actions, following = [], [], []
    for y in range(ROWS - 1):
        for x in range(COLUMNS):
            for p in range(COLUMNS):
                left = ROWS - 1 - y  # moves (and transitions) before the ball lands
                states.append(_board(y, x, p))
                values.append((1.0 if abs(p - x) <= left else -1.0) * discount ** (left - 1))
                for a in range(3):
                    moved = min(max(p + a - 1, 0), COLUMNS - 1)
                    obs.append(_board(y, x, p))
                    actions.append(a)
                    following.append(_board(y + 1, x, moved))
                    if y == ROWS - 2:
                        last.append(_board(y, x, p))
                        last_actions.append(a)
                        last_rewards.append(1.0 if moved == x else -1.0)
    return (np.stack(states), np.asarray(values, np.float32), np.stack(last),
            np.asarray(last_actions, np.int32), np.asarray(last_rewards, np.float32),
            (np.stack(obs), np.asarray(actions, np.int32), np.stack(following)))


def probe(name: str, config) -> str:
    config.seed = _SEED.value
    config.total_env_steps = _STEPS.value
    result = anakin.train(config)
    m = probe_params(config, result.params)
    line = (f"{name:<14} return {result.final_metrics['episode_return']:.3f}  value error "
            f"{m['value error']:.3f}  reward error {m['reward error']:.3f}  search entropy "
            f"{m['search entropy']:.3f}  greedy optimal {m['greedy optimal']:.3f}")
    if "projection cosine" in m:
        true_next, unrelated = m["prediction true/unrelated"]
        line += (f"  projection cosine {m['projection cosine']:.3f}  prediction vs true next "
                 f"{true_next:.3f}, vs unrelated {unrelated:.3f}")
    return line


def optimal_actions(states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([N] bool catchable, [N, 3] bool: the action keeps the ball catchable) for Catch
    boards [N, 10, 5] with the ball above the bottom row."""
    catchable, good = [], []
    for o in states:
        y, x = (int(i) for i in np.argwhere(o[:ROWS - 1] > 0)[0])
        p = int(np.argmax(o[ROWS - 1]))
        left = ROWS - 1 - y
        catchable.append(abs(p - x) <= left)
        good.append([abs(min(max(p + a - 1, 0), COLUMNS - 1) - x) <= left - 1
                     for a in range(3)])
    return np.asarray(catchable), np.asarray(good)


def probe_params(config, params) -> dict[str, float]:
    """The probes of one run's `params` (unstacked), as numbers."""
    a = config.agent.copy_and_resolve_references()
    spec = envs_jax.make("catch").spec()
    is_ez = a.name == "efficientzero"
    network = (ez.make_ez_network if is_ez else muzero.make_network)(a, spec)
    states, v_star, last, last_actions, last_rewards, transitions = catch_enumeration(a.discount)
    latent = network.apply(params, states, method="represent")
    _, value_logits = network.apply(params, latent, method="predict")
    error = np.abs(np.asarray(muzero.value_to_scalar(value_logits, a.support_size)) - v_star)
    rows_left = ROWS - 1 - np.argwhere(states[:, :ROWS - 1] > 0)[:, 1]
    last_latent = network.apply(params, last, method="represent")
    reward_logits, next_latent = network.apply(params, last_latent, last_actions,
                                               method="dynamics")
    if is_ez and a.value_prefix:
        reward_logits, _ = network.apply(params, next_latent,
                                         ez.initial_carry(len(last), a.lstm_size),
                                         method="prefix")
    reward = np.asarray(muzero.value_to_scalar(reward_logits, a.support_size))
    out = {"value error": error.mean(), "near": error[rows_left <= 3].mean(),
           "far": error[rows_left >= 7].mean(),
           "reward error": np.abs(reward - last_rewards).mean()}
    def visits(evaluation: bool) -> np.ndarray:
        if is_ez:
            search = ez.run_search(network, params, states, jax.random.key(0),
                                   muzero.search_config(a), value_prefix=a.value_prefix,
                                   value_prefix_horizon=a.value_prefix_horizon,
                                   lstm_size=a.lstm_size, evaluation=evaluation)
        else:
            search = muzero.run_search(network, params, states, jax.random.key(0),
                                       muzero.search_config(a), evaluation=evaluation)
        return np.asarray(search.action_weights)

    weights = visits(evaluation=False)
    out["search entropy"] = -np.sum(weights * np.log(np.maximum(weights, 1e-12)), -1).mean()
    catchable, good = optimal_actions(states)
    decisive = catchable & ~good.all(-1)
    greedy = visits(evaluation=True).argmax(-1)
    out["greedy optimal"] = good[np.arange(len(states)), greedy][decisive].mean()
    if is_ez:
        out["projection cosine"] = float(probes.projection_similarity(network, params, states))
        out["prediction true/unrelated"] = tuple(
            map(float, probes.prediction_alignment(network, params, *transitions)))
    return out


def probe_budgets(name: str, config, seeds: list[int], budgets: list[int]) -> list[str]:
    """Trains `seeds` as one sweep, stopping at each budget to probe every run."""
    lines = []
    config.sweep.seeds = tuple(seeds)
    config.checkpoint_every_updates = 10**9  # the final checkpoint only
    with tempfile.TemporaryDirectory() as workdir:
        for budget in budgets:
            config.total_env_steps = budget
            result = anakin.train(config, workdir)
            returns = [h[-1]["episode_return"] for h in result.run_histories]
            rows = [probe_params(config, jax.tree.map(lambda x, r=r: x[r], result.params))
                    for r in range(len(seeds))]
            keys = [k for k in rows[0] if k != "prediction true/unrelated"]
            text = "  ".join(f"{k} {np.mean([row[k] for row in rows]):.3f}" for k in keys)
            if "prediction true/unrelated" in rows[0]:
                pairs = np.asarray([row["prediction true/unrelated"] for row in rows])
                text += f"  prediction {pairs[:, 0].mean():.3f}/{pairs[:, 1].mean():.3f}"
            lines.append(f"{name:<14} {result.final_metrics['env_steps']:>7}  return "
                         f"{np.mean(returns):.3f}  {text}")
            print(lines[-1], flush=True)
    return lines


def main(argv):
    del argv
    ez_config = efficientzero_catch.get_config()
    for change in _EZ.value:
        field, value = change.split("=")
        try:
            ez_config.agent[field] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            ez_config.agent[field] = value  # a string
    if _BUDGETS.value:
        seeds = [int(s) for s in _SEEDS.value] or [_SEED.value]
        budgets = [int(b) for b in _BUDGETS.value]
        lines = (probe_budgets("MuZero", muzero_catch.get_config(), seeds, budgets)
                 + probe_budgets("EfficientZero", ez_config, seeds, budgets))
        print(f"seeds {seeds}; EfficientZero changes: {_EZ.value or 'none'}; mean over seeds")
        print("\n".join(lines))
        return
    lines = [probe("MuZero", muzero_catch.get_config()), probe("EfficientZero", ez_config)]
    print(f"seed {_SEED.value}, {_STEPS.value} environment steps each; EfficientZero "
          f"changes: {_EZ.value or 'none'}")
    print("\n".join(lines))


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
