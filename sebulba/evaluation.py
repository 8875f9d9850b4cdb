"""Greedy evaluation of the actors' parameters on host environments of its own.

Every `eval_every_updates`, process 0's learner, right after publishing, plays the greedy
policy (`actor_step(..., evaluation=True)`) on actor device 0 in its own batch (of the run's kind: `sebulba.host_env`) of
`eval_episodes` environments (created once, seeded apart from training's with
`podracer.session.EVAL_STREAM`),
one game each of at most `eval_max_steps` steps; the learner waits meanwhile, and the actors
fill their queues.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from podracer.agent import Agent
from sebulba import envpool_env
from sebulba.actor import acting_view, make_act
from sebulba.host_env import HostEnv


def make_evaluator(agent: Agent, env: HostEnv, device: jax.Device, *, max_steps: int,
                   to_agent_layout: Callable = envpool_env.to_agent_layout
                   ) -> Callable[[Any, jax.Array], dict[str, float]]:
    """`evaluate(params, key)` -> greedy returns of one episode on each of `env`'s environments.

    The environments are reset, then play with `actor_step(..., evaluation=True)` on `device`
    until every one has ended a game (`extras["game_over"]`: the LAST step of a whole game;
    for Atari under episodic life, a life loss does not end it) or `max_steps` steps have
    passed. An episode's return is its game score up to its end (`extras["episode_return"]`:
    unclipped, as the logged `episode_return`; nothing after the end, when envpool has already
    started the next one, counts); an unfinished episode counts with its score so far. Returns
    `eval_return` (mean), `eval_return_std`, `eval_finished` (the fraction of episodes that
    ended) and `eval_length` (mean steps). `key` seeds the policy's sampling, if any; the
    environments continue their own random streams from one evaluation to the next.
    """
    act = jax.jit(make_act(agent, evaluation=True, to_agent_layout=to_agent_layout))

    def evaluate(params: Any, key: jax.Array) -> dict[str, float]:
        n = env.num_envs
        key = jax.device_put(key, device)
        actor_state = jax.device_put(agent.init_actor_state(n), device)
        timestep = env.reset()
        returns = np.zeros(n, np.float64)
        lengths = np.zeros(n, np.int64)
        done = np.zeros(n, bool)
        for _ in range(max_steps):
            timestep_dev = jax.device_put(acting_view(timestep), device)
            action, actor_state, _, key = act(params, actor_state, timestep_dev, key)
            timestep = env.step(np.asarray(action))
            live = ~done
            returns[live] = timestep.extras["episode_return"][live]
            lengths[live] = timestep.extras["episode_length"][live]
            done |= timestep.extras["game_over"]
            if done.all():
                break
        return {"eval_return": float(np.mean(returns)), "eval_return_std": float(np.std(returns)),
                "eval_finished": float(np.mean(done)), "eval_length": float(np.mean(lengths))}

    return evaluate
