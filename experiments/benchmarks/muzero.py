"""Benchmark: MuZero search throughput and MuZero-Anakin speed, each next to the cost of the
network forward passes alone, measured in the same run.

- Search: simulations per second for a batch of roots, for `muzero_policy` (PUCT),
  `gumbel_muzero_policy`, PUCT with the agent's default value term (`muzero_ez`: Q normalised
  by the tree's range, unvisited children at their parent's mean Q, as EfficientZero; the
  Catch config uses mctx's), Stochastic MuZero's `stochastic_muzero_policy` (Catch, C = 4 chance
  codes) and Sampled MuZero's search (Pendulum-v1, K sampled torques per node), all at the
  MuZero Catch config's widths and the same simulations, each relative to PUCT's, next to
  MuZero's forward passes (one representation + prediction, then one dynamics + prediction per
  simulation) run in a scan with no tree: the difference is the search's own overhead. With
  `muzero_ez`, also its search alone with the parent's mean Q by each of `muzero.mean_q`'s
  methods (a walk up the tree; pointer jumps, with no loop), relative to the walk.
- Anakin: environment steps per second of the compiled MuZero-Anakin chunk on Catch (acting
  with search, replay insertion, updates) next to the acting network passes alone.
- Learner: MuZero learner updates per second on the replay that run filled, with the target
  network (and Reanalyse) on the K+1 observations the targets bootstrap from
  (`agent.target_positions="bootstrap"`) and on every position of each sampled window
  ("window", the width of computing targets for whole segments), same config, same run.

    python -m experiments.benchmarks.muzero [--roots=256] [--simulations=16]
        [--searches=muzero,gumbel,muzero_ez,stochastic,sampled3,sampled20] [--anakin=false]
"""

from __future__ import annotations

import functools
import os
import platform
import time

import jax
import jax.numpy as jnp
import ml_collections
from absl import app, flags

import agents
import envs_jax
from agents import muzero, sampled_muzero
from experiments import _cli
from experiments.benchmarks._ceiling import (
    anakin_replay_chunk,
    best_call_time,
    mean_q_searches,
    muzero_passes,
)
from experiments.configs import muzero_catch
from experiments.configs.stochastic_muzero_catch import with_stochastic_agent

_ROOTS = flags.DEFINE_integer("roots", 256, "Batch of search roots.")
_SIMS = flags.DEFINE_integer("simulations", 16, "Simulations per search.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per figure (best is kept).")
_LEARNER_UPDATES = flags.DEFINE_integer("learner_updates", 20, "Learner updates per timed call.")
_TD_STEPS = flags.DEFINE_integer("td_steps", 0, "n of the learner figures; 0: the config's.")
_SEARCHES = flags.DEFINE_list(
    "searches", ["muzero", "gumbel", "muzero_ez", "stochastic", "sampled3", "sampled20"],
    "Searches to time, PUCT first: muzero (PUCT), gumbel, muzero_ez (PUCT with "
    "EfficientZero's value term), stochastic, sampled<K>.")
_ANAKIN = flags.DEFINE_bool("anakin", True,
                             "Also time MuZero-Anakin and the learner (False: searches only).")
_REANALYSE = flags.DEFINE_float("reanalyse_fraction", 0.0,
                                "Share of each learner batch reanalysed, learner figures.")


def _best(fn, *args):
    return best_call_time(fn, *args, repeats=_REPEATS.value)


def _searches(muzero_config, env):
    """(name, agent config, environment) of each search `--searches` names, at the widths and
    simulations of `muzero_config` (MuZero's, on Catch): PUCT first, the others' figures are
    relative to it."""
    if _SEARCHES.value[:1] != ["muzero"]:
        raise ValueError("--searches: put muzero (PUCT) first; the others are timed against it")
    out = []
    for name in _SEARCHES.value:
        if name in ("muzero", "gumbel"):
            config = muzero_config.copy_and_resolve_references()
            config.search = name
            out.append((f"MuZero, {'PUCT' if name == 'muzero' else 'Gumbel'}", config, env))
        elif name == "muzero_ez":
            out.append(("MuZero, PUCT, EfficientZero's Q", _with_default_value_term(
                muzero_config), env))
        elif name == "stochastic":
            holder = ml_collections.ConfigDict({"agent": muzero_config.copy_and_resolve_references(),
                                                "rollout_length": muzero_config.rollout_length})
            config = with_stochastic_agent(holder).copy_and_resolve_references()
            config.num_chance_outcomes = 4
            out.append(("Stochastic MuZero, C = 4", config, env))
        elif name.startswith("sampled"):  # "sampled<K>": K actions sampled per node
            k = int(name[len("sampled"):] or 20)
            config = sampled_muzero.default_config()
            for field in ("hidden_sizes", "latent_size", "num_simulations", "rollout_length"):
                config[field] = muzero_config[field]
            config.num_samples = k
            pendulum = envs_jax.wrap_for_training(envs_jax.make("Pendulum-v1"))
            out.append((f"Sampled MuZero, K = {k} (Pendulum)", config, pendulum))
        else:
            raise ValueError(f"--searches: unknown search {name!r}; choose from muzero, "
                             "gumbel, muzero_ez, stochastic, sampled<K>")
    return out


def _with_default_value_term(muzero_config):
    """`muzero_config` with PUCT's value term as the agent's default (EfficientZero's); the
    Catch config has mctx's."""
    config, default = muzero_config.copy_and_resolve_references(), muzero.default_config()
    config.q_transform, config.unvisited_q = default.q_transform, default.unvisited_q
    return config


def _time_mean_q_methods(network, params, obs, agent_config, forward_s: float) -> None:
    """`muzero_ez`'s search alone (no actor step around it), with its parents' mean Q computed
    each way `muzero.mean_q` can: a walk up the tree, or pointer jumps with no loop."""
    search_config = muzero.search_config(_with_default_value_term(agent_config))
    b, sims = obs.shape[0], search_config.num_simulations
    walk_s = None
    for method, search in mean_q_searches(network, search_config).items():
        seconds = _best(search, params, obs, jax.random.PRNGKey(2))
        walk_s = walk_s or seconds
        print(f"{'search alone, mean Q by ' + method:>32} ({b} roots x {sims} simulations): "
              f"{b * sims / seconds:>12,.0f} simulations/s, {walk_s / seconds:.2f} x the walk's "
              f"({100 * forward_s / seconds:.0f}% of the time in MuZero's network passes)")


def main(argv):
    del argv
    config = muzero_catch.get_config()
    if _TD_STEPS.value:
        config.agent.td_steps = _TD_STEPS.value
    env = envs_jax.wrap_for_training(envs_jax.make(config.env.name))
    spec = env.spec()
    b, sims = _ROOTS.value, _SIMS.value
    device = jax.devices()[0]
    print(f"hardware: {platform.machine()}, {os.cpu_count()} CPU cores; {device.platform} "
          f"({device.device_kind}); jax {jax.__version__}")
    print(f"network: MuZero MLP, latent {config.agent.latent_size}, hidden "
          f"{tuple(config.agent.hidden_sizes)}, {spec.action.num_values} actions")

    # SEARCH
    agent_config = config.agent.copy_and_resolve_references()
    agent_config.num_simulations = sims
    network = muzero.make_network(agent_config, spec)
    params = network.init(jax.random.PRNGKey(0), jnp.zeros((1,) + spec.observation.shape),
                          jnp.zeros((1,), jnp.int32))
    obs = jax.vmap(lambda k: env.reset(k)[1].observation)(jax.random.split(jax.random.PRNGKey(1), b))

    forward_s = _best(muzero_passes(network, sims), params, obs)
    print(f"network passes alone ({b} roots x {sims} steps): "
          f"{b * sims / forward_s:>12,.0f} simulation-equivalents/s")
    puct_s = None
    for name, search_config, search_env in _searches(agent_config, env):
        search_spec = search_env.spec()
        agent = agents.make(search_config, search_spec)
        state = agent.init(jax.random.PRNGKey(0), search_spec)
        timestep = jax.vmap(lambda k, e=search_env: e.reset(k)[1])(
            jax.random.split(jax.random.PRNGKey(1), b))
        act = jax.jit(functools.partial(lambda a, p, t, k: a.actor_step(p, (), t, k)[0], agent))
        seconds = _best(act, agent.actor_params(state), timestep, jax.random.PRNGKey(2))
        puct_s = puct_s or seconds
        print(f"{name:>32} ({b} roots x {sims} simulations): "
              f"{b * sims / seconds:>12,.0f} simulations/s, {puct_s / seconds:.2f} x PUCT's "
              f"({100 * forward_s / seconds:.0f}% of the time in MuZero's network passes)")
    if "muzero_ez" in _SEARCHES.value:
        _time_mean_q_methods(network, params, obs, agent_config, forward_s)

    if not _ANAKIN.value:
        return

    # ANAKIN
    agent = agents.make(config.agent, spec)
    n = config.num_envs
    chunk, state, steps = anakin_replay_chunk(agent, env, config)
    best = float("inf")
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        state, metrics = chunk(state)
        jax.block_until_ready(metrics)
        best = min(best, time.perf_counter() - start)
    acting_sims = config.agent.num_simulations
    acting_s = _best(muzero_passes(network, acting_sims), params, obs[:n])
    print(f"MuZero-Anakin on Catch ({n} envs, {config.agent.num_simulations} simulations, "
          f"{config.agent.updates_per_step} x {config.agent.batch_size} updates/step): "
          f"{steps / best:>10,.0f} env steps/s")
    print(f"  acting network passes alone (1 + {acting_sims} per env step): "
          f"{n / acting_s:>10,.0f} env steps/s")

    # LEARNER: targets where they are used vs on whole windows, timed alternately
    learner_state = state.learner_state
    programs = {}
    for positions in ("window", "bootstrap"):
        learner_config = config.agent.copy_and_resolve_references()
        learner_config.target_positions = positions
        learner_config.reanalyse_fraction = _REANALYSE.value
        network = muzero.make_network(learner_config, spec)
        replay, _, history = muzero.make_replay(learner_config, spec)
        optimizer = muzero.make_optimizer(learner_config)
        learn = muzero.learn_config(learner_config)

        def updates(state, key, learn=learn, network=network,
                    replay=replay, optimizer=optimizer, history=history):
            def one(state, key):
                return muzero.learner_update(network, optimizer, replay, learn,
                                             state, key, history=history, axis_name=None)
            keys = jax.random.split(key, _LEARNER_UPDATES.value)
            return jax.lax.scan(one, state, keys)[1]["loss"]

        programs[positions] = jax.jit(updates)
        jax.block_until_ready(programs[positions](learner_state, jax.random.PRNGKey(3)))
    best = dict.fromkeys(programs, float("inf"))
    for _ in range(_REPEATS.value):  # alternate, so both see the same machine load
        for positions, program in programs.items():
            start = time.perf_counter()
            jax.block_until_ready(program(learner_state, jax.random.PRNGKey(3)))
            best[positions] = min(best[positions], time.perf_counter() - start)
    a = config.agent
    for positions, seconds in best.items():
        print(f"learner updates, targets on {positions:>9} positions (batch {a.batch_size}, "
              f"K={a.unroll_steps}, n={a.td_steps}, reanalyse {_REANALYSE.value}): "
              f"{_LEARNER_UPDATES.value / seconds:>8,.1f} updates/s")


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
