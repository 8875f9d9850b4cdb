"""Benchmark: EfficientZero learner updates per second on CPU (or any device), with the share
of learner time that Reanalyse and Priority Refresh take, next to MuZero's update on the same
replay contents, measured in the same run (programs timed in turn, best of `--repeats`).

The replay is filled by the EfficientZero-Anakin Catch chunk (`efficientzero_catch.py`);
every figure is for one device, batch and unroll of that config.

    python -m experiments.benchmarks.efficientzero [--learner_updates=20] [--refresh_interval=100]
"""

from __future__ import annotations

import os
import platform
import time

import jax
from absl import app, flags

import agents
import anakin
import envs_jax
from agents import efficientzero as ez
from agents import muzero
from experiments import _cli
from experiments.configs import efficientzero_catch

_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per figure (best is kept).")
_UPDATES = flags.DEFINE_integer("learner_updates", 20, "Learner updates per timed call.")
_REFRESH = flags.DEFINE_integer("refresh_interval", 100, "Updates between Priority Refreshes "
                                "for the refresh share.")


def main(argv):
    del argv
    config = efficientzero_catch.get_config()
    env = envs_jax.wrap_for_training(envs_jax.make(config.env.name))
    spec = env.spec()
    device = jax.devices()[0]
    print(f"hardware: {platform.machine()}, {os.cpu_count()} CPU cores; {device.platform} "
          f"({device.device_kind}); jax {jax.__version__}")
    agent = agents.make(config.agent, spec)
    init, chunk = anakin.make_programs(agent, env, envs_per_device=config.num_envs,
                                       rollout_length=config.rollout_length,
                                       updates_per_chunk=config.updates_per_chunk, axis_name=None)
    state = jax.jit(init)(jax.random.PRNGKey(0), jax.random.PRNGKey(1))
    state, _ = jax.jit(chunk)(state)  # fills the replay past min_replay_items
    learner_state = state.learner_state
    a = config.agent.copy_and_resolve_references()
    replay, _, history = muzero.make_replay(
        a, spec, extra_fields={"collected_at": jax.ShapeDtypeStruct((), "int32")})
    t, b = config.rollout_length, config.num_envs

    def ez_program(**changes):
        c = a.copy_and_resolve_references()
        for name, value in changes.items():
            c[name] = value
        network = ez.make_ez_network(c, spec)
        optimizer = ez.make_optimizer(c)
        learn = ez.learn_config(c)

        def run(state, key):
            def one(state, key):
                return ez.learner_update(network, optimizer, replay, learn, state, key,
                                         history=history, steps_per_add=t * b, axis_name=None)
            return jax.lax.scan(one, state, jax.random.split(key, _UPDATES.value))[1]["loss"]

        def refresh(state):
            return ez.refresh_priorities(network, replay, learn, state,
                                         history=history).replay.priorities

        return jax.jit(run), jax.jit(refresh)

    mz_config = a.copy_and_resolve_references()
    mz_network = muzero.make_network(mz_config, spec)
    mz_optimizer = muzero.make_optimizer(mz_config)
    mz_learn = muzero.learn_config(mz_config)

    def mz_run(state, key):
        def one(state, key):
            return muzero.learner_update(mz_network, mz_optimizer, replay, mz_learn, state,
                                         key, history=history, axis_name=None)
        return jax.lax.scan(one, state, jax.random.split(key, _UPDATES.value))[1]["loss"]

    programs = {
        "efficientzero (no Reanalyse)": ez_program(reanalyse_fraction=0.0)[0],
        "efficientzero, Reanalyse 100%": ez_program(reanalyse_fraction=1.0)[0],
        "efficientzero, no value prefix, no consistency": ez_program(
            reanalyse_fraction=0.0, value_prefix=False, consistency=False)[0],
    }
    refresh = ez_program()[1]
    # MuZero's update on EfficientZero's learner state: the replay fields it reads are there,
    # and its parameters are the MuZero part of EfficientZero's (a sub-tree).
    mz_state = learner_state.replace(
        params={"params": learner_state.params["params"]["muzero"]},
        target_params={"params": learner_state.target_params["params"]["muzero"]},
        opt_state=mz_optimizer.init({"params": learner_state.params["params"]["muzero"]}))
    timed = {name: (program, learner_state) for name, program in programs.items()}
    timed["muzero (same replay, same sizes)"] = (jax.jit(mz_run), mz_state)
    for program, s in timed.values():
        jax.block_until_ready(program(s, jax.random.PRNGKey(3)))
    jax.block_until_ready(refresh(learner_state))
    best = dict.fromkeys(list(timed) + ["priority refresh"], float("inf"))
    for _ in range(_REPEATS.value):
        for name, (program, s) in timed.items():
            start = time.perf_counter()
            jax.block_until_ready(program(s, jax.random.PRNGKey(3)))
            best[name] = min(best[name], time.perf_counter() - start)
        start = time.perf_counter()
        jax.block_until_ready(refresh(learner_state))
        best["priority refresh"] = min(best["priority refresh"], time.perf_counter() - start)
    positions = int(replay.size(learner_state.replay))
    print(f"EfficientZero on Catch: batch {a.batch_size}, K={a.unroll_steps}, n={a.td_steps}, "
          f"{a.num_simulations} simulations, replay {positions} sampleable positions")
    for name in timed:
        print(f"  {name:<48} {_UPDATES.value / best[name]:>8.1f} updates/s")
    per_update = best["efficientzero (no Reanalyse)"] / _UPDATES.value
    reanalyse = best["efficientzero, Reanalyse 100%"] / _UPDATES.value - per_update
    print(f"  Reanalyse of every sample: {1e3 * reanalyse:.1f} ms per update, "
          f"{100 * reanalyse / (per_update + reanalyse):.0f}% of a reanalysing update")
    r = best["priority refresh"]
    share = r / (r + _REFRESH.value * per_update)
    print(f"  Priority Refresh of {positions} positions: {1e3 * r:.0f} ms; every "
          f"{_REFRESH.value} updates it is {100 * share:.1f}% of learner time")


if __name__ == "__main__":
    app.run(main, flags_parser=_cli.parse_flags)
