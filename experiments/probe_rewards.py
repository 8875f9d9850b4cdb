"""Does a MuZero run's learnt model predict the rewards in its own replay, and could its
network have learnt them from that data?

    python -m experiments.probe_rewards --workdir=/tmp/mz_asterix [--networks=mlp,conv_mlp]

Reads the newest checkpoint of an Anakin workdir (its config, parameters and replay; the
replay of the first device), takes every stored transition (o_t, a_t) -> r_{t+1} whose o_t
is not LAST, and prints:

  trained     for each run of the sweep, the mean reward r_hat = g(h(o_t), a_t) that the
              trained model (MuZero's) predicts for the transitions that were rewarded
              (r_{t+1} > 0) and for those that were not, and the share of rewarded ones
              predicted above 0.5 (recall); then the model's value one step on, v(g(h(o_t),
              a_t)), on the stored steps into a true terminal, where it is trained toward 0,
              and on the others, each beside the value v(h(o_t)) of the states they start
              from: whether the dynamics learnt the deaths it was trained on; and the value
              v(h(o)) of the stored terminal observations themselves, which no update
              trains (a LAST timestep is never sampled as the root of an unroll, as in
              MuZero's and EfficientZero's reference code): how the value head reads boards
              it has not learnt from; for a run with a terminal head (`terminal_head`), its
              P(end) on the steps into a terminal and on the others;
  fit         for each network of --networks, the same reward model (h, g and the reward
              head, the run's widths) trained from scratch on the first run's transitions
              alone (cross-entropy on the agent's support, Adam), then measured on the
              second run's transitions (held out; with one run, the second half of its
              windows): whether the network can generalise the reward from that much data;
              with --fit_target=terminal the same model learns instead whether o_{t+1} is a
              true terminal (target 1, else 0): whether a death can be told from (o_t, a_t)
              at all, where the trained dynamics does not tell it;
  terminal    with --decisive_states=N: up to N states that a uniformly random policy visits
              (64 environments, 200 steps) in the run's environment where some actions end
              the episode (a true terminal) and some do not, each action's outcome found by
              stepping a copy of the state. With --decisive_outcome=freeway_collision (MinAtar
              Freeway, whose collisions end nothing) an action is fatal when it sends the
              chicken back to the bottom row without a reward: hit by a car.
              For each run: the share of them where the action with the highest one-step
              model value Q = r_hat + gamma v(g(h(o), a)) survives, against the share of
              surviving actions (a uniform choice), and the mean Q of the surviving actions
              minus that of the fatal ones (0: the model does not tell them apart), and the
              mean value v(h(o)) of those states (what a death costs, roughly); then the same
              figures with each action valued from the state it really leads to, r +
              gamma d v(h(o')), d the environment's discount: after a true terminal (d = 0)
              that is r alone, so there the second figures only say what the model's would
              be were its dynamics exact; after a non-terminal outcome (a Freeway collision)
              they are the price the value head itself puts on it. A model whose first
              figures fall well short of these has not learnt it in its dynamics g.

  greedy      with --greedy_games=N: for each run, N fresh games of --greedy_steps steps
              played by the argmax of the run's search (no root noise), and along them the
              spread of Q over the root's visited actions (max - min, the environment's
              units), the most visited action's share of the visits, its lead in visits
              over the second, the root value, and the range of Q over every visited edge
              of the tree (what `q_transform="tree_min_max"` divides by, floored at 0.01 of
              the model's units): how much the search tells the actions apart where it
              acts (--greedy_simulations=N searches with N simulations instead of the
              run's); then, from the same games' starts, the return of the argmax of the
              policy prior alone (no search: what the search adds), and of pressing each
              single action throughout (Freeway's "always up" is the floor a learnt policy
              should clear).

A reward that the trained model misses but a fit on the same data finds points at the joint
training; one that no fit generalises points at the network (or at too few rewarded
transitions).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import app, flags

from agents.muzero import targets as tgt
from agents.muzero.agent import search_config
from agents.muzero.networks import make_network
from agents.muzero.search import (
    TREE_MIN_MAX_FLOOR,
    make_recurrent_fn,
    run_search,
    value_to_scalar,
    visited_q_bounds,
)
from envs_jax.wrappers import AutoReset
from experiments import _cli
from experiments.probing import freeway_row, newest_frame, saved_env, trained_network
from podracer import checkpoint
from podracer.types import Array, EnvSpec, StepType

_WORKDIR = flags.DEFINE_string("workdir", None, "An Anakin workdir of a MuZero run.")
_NETWORKS = flags.DEFINE_list("networks", ["mlp", "conv_mlp"],
                              "`agent.network` values to fit the reward with.")
_UPDATES = flags.DEFINE_integer("fit_updates", 4000, "Adam updates of each fit.")
_BATCH = flags.DEFINE_integer("fit_batch", 256, "Transitions per fit update.")
_LR = flags.DEFINE_float("fit_learning_rate", 3e-3, "Adam's step size in the fits.")
_FIT_TARGET = flags.DEFINE_enum(
    "fit_target", "reward", ["reward", "terminal"],
    "What the fits learn from (o_t, a_t): r_{t+1}, or 1 where o_{t+1} is a true terminal.")
_DECISIVE = flags.DEFINE_integer("decisive_states", 0, "States for the terminal probe (0: none).")
_GREEDY = flags.DEFINE_integer("greedy_games", 0, "Games for the greedy probe (0: none).")
_GREEDY_SIMULATIONS = flags.DEFINE_integer(
    "greedy_simulations", 0, "Simulations of the greedy probe's search (0: the run's).")
_GREEDY_STEPS = flags.DEFINE_integer("greedy_steps", 2500,
                                     "Steps of each greedy game (MinAtar Freeway's length).")


def transitions(items: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(o_t [N, ...], a_t [N], r_{t+1} [N]) of replay windows (leaves [W, L, ...]): every
    consecutive pair inside a window whose first timestep is not LAST (a LAST takes no
    action; the timestep after it starts another episode)."""
    valid = _pairs(items)
    observation = np.asarray(items["observation"])[:, :-1][valid]
    return (observation, np.asarray(items["action"])[:, :-1][valid],
            np.asarray(items["reward"])[:, 1:][valid])


def _pairs(items: dict) -> np.ndarray:
    """[W, L-1] bool: which consecutive pairs (o_t, o_{t+1}) of the windows `transitions`
    reads (o_t not LAST, o_{t+1} not FIRST)."""
    step_type = np.asarray(items["step_type"])
    return (step_type[:, :-1] != StepType.LAST) & (step_type[:, 1:] != StepType.FIRST)


def _in_chunks(fn, *arrays, size: int = 4096) -> np.ndarray:
    """`fn` over `arrays` [N, ...] in chunks of `size` along N, joined on the last axis."""
    return np.concatenate([np.asarray(fn(*(x[i:i + size] for x in arrays)))
                           for i in range(0, len(arrays[0]), size)], axis=-1)


def into_terminal(items: dict) -> np.ndarray:
    """[N] bool, aligned with `transitions(items)`: whether r_{t+1} arrives with a true
    terminal o_{t+1} (LAST with discount 0), where MuZero trains v(g(h(o_t), a_t)) to 0."""
    return terminal_observations(items)[:, 1:][_pairs(items)]


def terminal_observations(items: dict) -> np.ndarray:
    """[W, L] bool: which stored timesteps of replay windows (leaves [W, L, ...]) are true
    terminals (LAST with discount 0), whose value target is 0."""
    return ((np.asarray(items["step_type"]) == StepType.LAST)
            & (np.asarray(items["discount"]) == 0))


def values_fn(network, support_size: int):
    """jitted (params, o [N, ...], a [N]) -> [2, N]: the value of each state, v(h(o)), and the
    model's value one step on, v(g(h(o), a))."""

    @jax.jit
    def predict(params, observation, action):
        latent = network.apply(params, observation, method="represent")
        _, next_latent = network.apply(params, latent, action, method="dynamics")
        return jnp.stack([
            value_to_scalar(network.apply(params, x, method="predict")[1], support_size)
            for x in (latent, next_latent)])

    return lambda params, observation, action: _in_chunks(
        lambda o, a: predict(params, o, a), observation, action)


def end_probability_fn(network):
    """jitted (params, o [N, ...], a [N]) -> [N]: a terminal head's P(the step ends the
    episode), read from g(h(o), a)."""

    @jax.jit
    def predict(params, observation, action):
        latent = network.apply(params, observation, method="represent")
        _, next_latent = network.apply(params, latent, action, method="dynamics")
        return jax.nn.sigmoid(network.apply(params, next_latent, method="terminal_logit"))

    return lambda params, observation, action: _in_chunks(
        lambda o, a: predict(params, o, a), observation, action)


def terminal_recall(values: np.ndarray, terminal: np.ndarray) -> str:
    """The replay's terminal line for `values` [2, N] (`values_fn`): v(g(h(o), a)) on stored
    steps into a true terminal (trained toward 0) and on the others, each with the mean value
    v(h(o)) of the states they start from (a state about to end may be worth less already)."""
    if not terminal.any():
        return f"no steps into a terminal among {len(terminal):,}"
    state, next_value = values
    return (f"v(g(h(o), a)) {next_value[terminal].mean():.3f} on the {int(terminal.sum()):,} "
            f"steps into a terminal (target 0; v(h(o)) {state[terminal].mean():.3f}), "
            f"{next_value[~terminal].mean():.3f} on the other {int((~terminal).sum()):,} "
            f"(v(h(o)) {state[~terminal].mean():.3f})")


def reward_fn(network, support_size: int):
    """jitted (params, o [N, ...], a [N]) -> r_hat [N]: the model's reward for one step."""

    @jax.jit
    def predict(params, observation, action):
        latent = network.apply(params, observation, method="represent")
        logits, _ = network.apply(params, latent, action, method="dynamics")
        return value_to_scalar(logits, support_size)

    return lambda params, observation, action: _in_chunks(
        lambda o, a: predict(params, o, a), observation, action)


def summary(r_hat: np.ndarray, reward: np.ndarray, what: str = "rewarded") -> str:
    """The mean prediction on the transitions whose target is above 0 (`what`) and on the
    others, and the share of the first predicted above 0.5."""
    hit = reward > 0
    if not hit.any():
        return f"no {what} transitions among {len(reward):,}"
    return (f"r_hat {r_hat[hit].mean():.3f} on the {int(hit.sum()):,} {what}, "
            f"{r_hat[~hit].mean():.4f} on the other {int((~hit).sum()):,}; "
            f"recall@0.5 {np.mean(r_hat[hit] > 0.5):.3f}")


def fit_reward(network, support_size: int, train: tuple, *, updates: int, batch: int,
               learning_rate: float, seed: int = 0):
    """Parameters of `network` with h, g and the reward head trained from scratch by Adam on
    `train` = (o, a, r_next): the cross-entropy of the reward logits to `scalar_to_probs(r)`."""
    observation, action, reward = (jnp.asarray(x) for x in train)
    key, init_key = jax.random.split(jax.random.PRNGKey(seed))
    params = network.init(init_key, observation[:2], action[:2])
    optimizer = optax.adam(learning_rate)
    opt_state = optimizer.init(params)

    def loss(params, i):
        latent = network.apply(params, observation[i], method="represent")
        logits, _ = network.apply(params, latent, action[i], method="dynamics")
        return jnp.mean(optax.softmax_cross_entropy(
            logits, tgt.scalar_to_probs(reward[i], support_size, logits.shape[-1])))

    @jax.jit
    def step(params, opt_state, key):
        i = jax.random.randint(key, (batch,), 0, action.shape[0])
        grads = jax.grad(loss)(params, i)
        change, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, change), opt_state

    for step_key in jax.random.split(key, updates):
        params, opt_state = step(params, opt_state, step_key)
    return params


def ends_the_episode(timestep, next_timestep, *, frame_stack: int = 1) -> Array:
    """The terminal probe's default outcome: a true terminal (LAST with discount 0).
    `frame_stack` is unused: every outcome in `OUTCOMES` takes it."""
    del timestep, frame_stack
    return (next_timestep.step_type == StepType.LAST) & (next_timestep.discount == 0)


def freeway_collision(timestep, next_timestep, *, frame_stack: int = 1) -> Array:
    """Hit by a car: sent back to the bottom row from above it, without the crossing's
    reward (a crossing also restarts at the bottom, with a reward of 1). The rows are read
    from the newest of `frame_stack` stacked boards."""
    row = lambda t: freeway_row(newest_frame(t.observation, frame_stack))
    return (row(next_timestep) == 9) & (row(timestep) < 9) & (next_timestep.reward == 0)


OUTCOMES = {"terminal": ends_the_episode, "freeway_collision": freeway_collision}
_OUTCOME = flags.DEFINE_enum("decisive_outcome", "terminal", list(OUTCOMES),
                             "What makes an action fatal in the terminal probe.")


def decisive_states(env, key, *, num_envs: int = 64, steps: int = 200,
                    outcome=ends_the_episode, with_next: bool = False) -> tuple:
    """(o [N, ...], fatal [N, A] bool) of the states that a uniformly random policy visits in
    `num_envs` copies of `env` (an `envs_jax` environment, reset automatically) over `steps`
    steps, kept where some but not all actions are fatal from the state itself (`outcome`
    (timestep, next timestep): by default a true terminal): each action is stepped from a
    copy of the state, so with the state's own randomness. With `with_next`, also each
    action's next timestep, its leaves [N, A, ...]."""
    env = AutoReset(env)
    num_actions = env.action_spec().num_values
    reset_key, key = jax.random.split(key)
    state, timestep = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))

    def outcomes(one_state, one_timestep):
        def fatal(action):
            _, next_timestep = env.step(one_state, action)
            return outcome(one_timestep, next_timestep), next_timestep
        return jax.vmap(fatal)(jnp.arange(num_actions))

    def step(carry, step_key):
        state, timestep = carry
        action = jax.random.randint(step_key, (num_envs,), 0, num_actions)
        fatal, next_timesteps = jax.vmap(outcomes)(state, timestep)
        alive = timestep.step_type != StepType.LAST
        out = (timestep.observation, fatal, alive, next_timesteps if with_next else ())
        return jax.vmap(env.step)(state, action), out

    _, outs = jax.lax.scan(jax.jit(step), (state, timestep), jax.random.split(key, steps))
    observation, fatal, alive, next_timesteps = jax.tree.map(
        lambda x: np.asarray(x).reshape((-1,) + x.shape[2:]), outs)
    keep = alive & fatal.any(axis=1) & ~fatal.all(axis=1)
    if with_next:
        return observation[keep], fatal[keep], jax.tree.map(lambda x: x[keep], next_timesteps)
    return observation[keep], fatal[keep]


def one_step_q(network, params, observation, support_size: int, discount: float) -> Array:
    """[N, A] the model's Q = r_hat + gamma v(g(h(o), a)) of every action from `observation`
    [N, ...], as the search backs it up (`make_recurrent_fn`: with a terminal head, gamma
    (1 - P(end)) in place of gamma)."""
    latent = network.apply(params, observation, method="represent")
    step = make_recurrent_fn(network, support_size, discount)

    def q(action):
        out, _ = step(params, None, jnp.full(latent.shape[:1], action, jnp.int32), latent)
        return out.reward + out.discount * out.value

    return jax.vmap(q, out_axes=1)(jnp.arange(network.num_actions))


def root_statistics(q: np.ndarray, visits: np.ndarray) -> dict[str, np.ndarray]:
    """Per search, from the root's children's Q and visit counts ([..., A]): `spread`, max -
    min Q over the visited actions (NaN with fewer than two); `top_share`, the most visited
    action's share of the visits; `lead`, its visits minus the second most visited's."""
    visited = visits > 0
    high = np.where(visited, q, -np.inf).max(-1)
    low = np.where(visited, q, np.inf).min(-1)
    spread = np.where(visited.sum(-1) >= 2, high - low, np.nan)
    ordered = np.sort(visits, -1)
    return {"spread": spread, "top_share": ordered[..., -1] / visits.sum(-1),
            "lead": ordered[..., -1] - ordered[..., -2]}


def action_shares(actions: np.ndarray, num_actions: int) -> list[float]:
    """The share of each action among `actions` (any shape), rounded to 3 places."""
    counts = np.bincount(np.ravel(actions), minlength=num_actions)
    return np.round(counts / counts.sum(), 3).tolist()


def play(env, act, key, *, games: int, steps: int) -> dict[str, Array]:
    """`games` fresh games of `steps` steps, acted by `act(observation [games, ...], key) ->
    (action [games], extras)`: per step [steps, games, ...], the rewards, the actions and
    the extras; a game's rewards after its first LAST count as 0 (as the runners'
    evaluation). The games' starts depend on `key` only, not on `act`."""
    reset_key, play_key = jax.random.split(key)
    env_state, timestep = jax.vmap(env.reset)(jax.random.split(reset_key, games))

    def step(carry, key):
        env_state, timestep, done = carry
        action, extras = act(timestep.observation, key)
        env_state, next_timestep = jax.vmap(env.step)(env_state, action)
        reward = jnp.where(done, 0.0, next_timestep.reward)
        return (env_state, next_timestep, done | next_timestep.last()), {
            "reward": reward, "action": action, **extras}

    carry = (env_state, timestep, jnp.zeros(games, bool))
    _, outs = jax.lax.scan(step, carry, jax.random.split(play_key, steps))
    return outs


def greedy_play(network, params, env, settings, key, *, games: int, steps: int):
    """`play` with the argmax of the search's action weights (the visits, for PUCT; as the
    runners' evaluation, no root noise): besides the rewards and actions, per step the root
    value, the range of Q over the whole tree's visited edges (what `tree_min_max` divides
    by), and the root children's Q and visits ([steps, games, A])."""

    def act(observation, key):
        out = run_search(network, params, observation, key, settings, evaluation=True,
                         temperature=1.0)
        root = jnp.zeros(observation.shape[0], jnp.int32)
        low, high = jax.vmap(visited_q_bounds)(out.search_tree)
        return jnp.argmax(out.action_weights, -1).astype(jnp.int32), {
            "value": out.search_tree.node_values[:, 0], "q": out.search_tree.qvalues(root),
            "visits": out.search_tree.children_visits[:, 0], "tree_range": high - low}

    return play(env, act, key, games=games, steps=steps)


def prior_play(network, params, env, key, *, games: int, steps: int):
    """`play` with the argmax of the policy prior f(h(o)) alone, no search: what the
    search adds to the policy it was trained into."""

    def act(observation, key):
        del key
        latent = network.apply(params, observation, method="represent")
        prior_logits, _ = network.apply(params, latent, method="predict")
        return jnp.argmax(prior_logits, -1).astype(jnp.int32), {}

    return play(env, act, key, games=games, steps=steps)


def fixed_play(env, action: int, key, *, games: int, steps: int):
    """`play` pressing `action` at every step: what the same games' starts give without
    looking."""
    return play(env, lambda observation, key: (
        jnp.full(observation.shape[:1], action, jnp.int32), {}), key, games=games,
        steps=steps)


def terminal_summary(q: np.ndarray, fatal: np.ndarray) -> str:
    """The terminal probe's line (module docstring) for Q [N, A] on decisive states."""
    picked_safe = ~fatal[np.arange(len(q)), q.argmax(axis=1)]
    gap = np.mean([q[i][~fatal[i]].mean() - q[i][fatal[i]].mean() for i in range(len(q))])
    return (f"argmax Q survives in {picked_safe.mean():.3f} of {len(q):,} decisive states "
            f"(a uniform choice: {np.mean(~fatal):.3f}); Q(surviving) - Q(fatal) {gap:+.4f}")


def main(argv):
    del argv
    workdir = _WORKDIR.value
    with open(os.path.join(workdir, "config.json")) as f:
        config = json.load(f)
    agent_config = ml_collections.ConfigDict(config["agent"])
    prefix = agent_config.name == "efficientzero" and agent_config.get("value_prefix", True)
    if agent_config.name not in ("muzero", "efficientzero") or prefix:
        raise SystemExit(f"{workdir} is a run of {agent_config.name!r}; this probe reads "
                         "MuZero's one-step reward (EfficientZero's with value_prefix=False; "
                         "with value prefixes it predicts sums of rewards instead).")
    env, frame_stack = saved_env(config)
    env_spec = EnvSpec(observation=env.observation_spec(), action=env.action_spec())
    state, metadata = checkpoint.load_arrays(os.path.join(workdir, "checkpoints"))
    learner = state["learner_state"]
    items = learner["replay"]["items"]
    if "observation" not in items:
        raise SystemExit("This probe reads whole observations; the replay stores frames once.")
    params = learner["params"]["params"]
    params = params.get("muzero", params)  # EfficientZero's h, g and f (MuZero's network)
    runs = jax.tree.leaves(items)[0].shape[1]
    support = int(agent_config.support_size)
    network = trained_network(agent_config, env_spec, params)
    print(f"{config['env']['name']}, {agent_config.name} ({network.kind}), "
          f"{metadata['env_steps']:,} steps, {runs} run(s)")
    # A run with `reward_scale` stored its rewards, and learnt its model, in scaled units:
    # every figure below is divided back into the environment's.
    scale = float(agent_config.get("reward_scale", 1.0))
    data = [transitions(jax.tree.map(lambda x, r=r: x[0, r], items)) for r in range(runs)]
    data = [(o, a, r_next / scale) for o, a, r_next in data]
    run_params = [{"params": jax.tree.map(lambda x, r=r: jnp.asarray(x[0, r]), params)}
                  for r in range(runs)]
    reward_scaled = reward_fn(network, support)
    values_scaled = values_fn(network, support)
    predict = lambda *args: reward_scaled(*args) / scale
    values = lambda *args: values_scaled(*args) / scale
    v_fn = jax.jit(lambda p, o: value_to_scalar(network.apply(
        p, network.apply(p, o, method="represent"), method="predict")[1], support) / scale)
    for r in range(runs):
        print(f"trained run {r}: {summary(predict(run_params[r], *data[r][:2]), data[r][2])}")
        run_items = jax.tree.map(lambda x, r=r: np.asarray(x[0, r]), items)
        fatal = into_terminal(run_items)
        print(f"trained run {r}: "
              f"{terminal_recall(values(run_params[r], *data[r][:2]), fatal)}")
        if network.terminal_head and fatal.any():
            p_end = end_probability_fn(network)(run_params[r], *data[r][:2])
            print(f"trained run {r}: the terminal head's P(end) {p_end[fatal].mean():.3f} on "
                  f"the steps into a terminal (above 0.5 in {np.mean(p_end[fatal] > 0.5):.2f}),"
                  f" {p_end[~fatal].mean():.4f} on the others")
        ends = run_items["observation"][terminal_observations(run_items)]
        if len(ends):
            v_end = _in_chunks(lambda o, r=r: v_fn(run_params[r], o), ends)
            print(f"trained run {r}: v(h(o)) {v_end.mean():.3f} on the {len(ends):,} stored "
                  f"terminal observations (never an unroll's root; below 0.05 in "
                  f"{np.mean(v_end < 0.05):.2f})")
    what = "rewarded"
    if _FIT_TARGET.value == "terminal":
        # The fits' target: 1 where the step ends the episode in a true terminal, so a fit
        # that finds it says a death can be told from (o_t, a_t) in this data.
        what = "into a terminal"
        data = [(o, a, into_terminal(jax.tree.map(lambda x, r=r: np.asarray(x[0, r]), items))
                 .astype(np.float32)) for r, (o, a, _) in enumerate(data)]
    if runs > 1:
        train, held_out = data[0], data[1]
    else:
        half = len(data[0][2]) // 2
        train = tuple(x[:half] for x in data[0])
        held_out = tuple(x[half:] for x in data[0])
    if _DECISIVE.value:
        observation, fatal, following = decisive_states(
            env, jax.random.PRNGKey(0), with_next=True,
            outcome=functools.partial(OUTCOMES[_OUTCOME.value], frame_stack=frame_stack))
        observation, fatal = observation[:_DECISIVE.value], fatal[:_DECISIVE.value]
        following = jax.tree.map(lambda x: x[:_DECISIVE.value], following)
        num_actions = fatal.shape[1]
        q_fn = jax.jit(lambda p, o: one_step_q(network, p, o, support,
                                               float(agent_config.discount)) / scale)
        for r in range(runs):
            print(f"terminal run {r}: "
                  f"{terminal_summary(np.asarray(q_fn(run_params[r], observation)), fatal)}; "
                  f"mean v(h(o)) {float(np.mean(v_fn(run_params[r], observation))):.3f}")
            # The same actions valued from the states they really lead to: r + gamma d v(h(o')),
            # so r alone after a true terminal.
            next_v = np.asarray(v_fn(run_params[r], following.observation.reshape(
                (-1,) + following.observation.shape[2:]))).reshape(fatal.shape)
            real_q = (following.reward + float(agent_config.discount) * following.discount
                      * next_v)
            print(f"terminal run {r}, from the real next states: "
                  f"{terminal_summary(real_q, fatal)} ({num_actions} actions)")
    if _GREEDY.value:
        settings = search_config(agent_config)
        if _GREEDY_SIMULATIONS.value:
            settings = dataclasses.replace(settings,
                                           num_simulations=_GREEDY_SIMULATIONS.value)
        play_greedy = jax.jit(lambda p, k: greedy_play(
            network, p, env, settings, k, games=_GREEDY.value, steps=_GREEDY_STEPS.value))
        play_prior = jax.jit(lambda p, k: prior_play(
            network, p, env, k, games=_GREEDY.value, steps=_GREEDY_STEPS.value))
        play_fixed = jax.jit(lambda a, k: fixed_play(
            env, a, k, games=_GREEDY.value, steps=_GREEDY_STEPS.value), static_argnums=0)
        for r in range(runs):
            out = jax.tree.map(np.asarray, play_greedy(run_params[r], jax.random.PRNGKey(0)))
            stats = root_statistics(out["q"] / scale, out["visits"])
            # The games' rewards are the environment's; the model's Q and values are scaled.
            print(f"greedy run {r}: return {out['reward'].sum(0).mean():.2f} over "
                  f"{_GREEDY.value} games of {_GREEDY_STEPS.value:,} steps with "
                  f"{settings.num_simulations} simulations; root value "
                  f"{out['value'].mean() / scale:.3f}; Q spread over the visited actions: "
                  f"median {np.nanmedian(stats['spread']):.4f}, mean "
                  f"{np.nanmean(stats['spread']):.4f}; most visited share: median "
                  f"{np.median(stats['top_share']):.3f}; its lead: median "
                  f"{np.median(stats['lead']):.0f} visits; Q range over the tree: median "
                  f"{np.median(out['tree_range']) / scale:.4f}, below the "
                  f"{TREE_MIN_MAX_FLOOR} floor in "
                  f"{np.mean(out['tree_range'] < TREE_MIN_MAX_FLOOR):.2f}; actions "
                  f"{action_shares(out['action'], network.num_actions)}")
            out = jax.tree.map(np.asarray, play_prior(run_params[r], jax.random.PRNGKey(0)))
            print(f"prior run {r}: return {out['reward'].sum(0).mean():.2f} by the argmax of "
                  f"the prior alone, no search; actions "
                  f"{action_shares(out['action'], network.num_actions)}")
        for action in range(network.num_actions):
            out = play_fixed(action, jax.random.PRNGKey(0))
            print(f"always action {action}: return {float(out['reward'].sum(0).mean()):.2f} "
                  f"over the same {_GREEDY.value} games' starts")
    for kind in _NETWORKS.value:
        config_k = ml_collections.ConfigDict(config["agent"])
        config_k.network = kind
        network_k = make_network(config_k, env_spec)
        fitted = fit_reward(network_k, support, train, updates=_UPDATES.value,
                            batch=_BATCH.value, learning_rate=_LR.value)
        predict_k = reward_fn(network_k, support)
        print(f"fit {kind}: train {summary(predict_k(fitted, *train[:2]), train[2], what)}")
        print(f"fit {kind}: held out "
              f"{summary(predict_k(fitted, *held_out[:2]), held_out[2], what)}")


if __name__ == "__main__":
    flags.mark_flag_as_required("workdir")
    app.run(main, flags_parser=_cli.parse_flags)
