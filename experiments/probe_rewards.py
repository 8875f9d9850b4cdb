"""Does a MuZero or EfficientZero run's learnt model predict the rewards in its own replay, and
could its network have learnt them from that data?

    python -m experiments.probe_rewards --workdir=/tmp/mz_asterix [--networks=mlp,conv_mlp]

Reads the newest checkpoint of an Anakin workdir (its config, parameters and replay; the
replay of the first device), takes every stored transition (o_t, a_t) -> r_{t+1} whose o_t
is not LAST, and prints:

  trained     for each run of the sweep, the mean reward r_hat = g(h(o_t), a_t) that the
              trained model (MuZero's) predicts for the transitions that were rewarded
              (r_{t+1} > 0) and for those that were not, and the share of rewarded ones
              predicted above 0.5 (recall);
  fit         for each network of --networks, the same reward model (h, g and the reward
              head, the run's widths) trained from scratch on the first run's transitions
              alone (cross-entropy on the agent's support, Adam), then measured on the
              second run's transitions (held out; with one run, the second half of its
              windows): whether the network can generalise the reward from that much data.

A reward that the trained model misses but a fit on the same data finds points at the joint
training; one that no fit generalises points at the network (or at too few rewarded
transitions).
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import app, flags

import envs_jax
from agents.muzero import targets as tgt
from agents.muzero.networks import make_network
from agents.muzero.search import value_to_scalar
from podracer import checkpoint
from podracer.types import EnvSpec, StepType

_WORKDIR = flags.DEFINE_string("workdir", None, "An Anakin workdir of MuZero or EfficientZero.")
_NETWORKS = flags.DEFINE_list("networks", ["mlp", "conv_mlp"],
                              "`agent.network` values to fit the reward with.")
_UPDATES = flags.DEFINE_integer("fit_updates", 4000, "Adam updates of each fit.")
_BATCH = flags.DEFINE_integer("fit_batch", 256, "Transitions per fit update.")
_LR = flags.DEFINE_float("fit_learning_rate", 3e-3, "Adam's step size in the fits.")


def transitions(items: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(o_t [N, ...], a_t [N], r_{t+1} [N]) of replay windows (leaves [W, L, ...]): every
    consecutive pair inside a window whose first timestep is not LAST (a LAST takes no
    action; the timestep after it starts another episode)."""
    step_type = np.asarray(items["step_type"])
    valid = (step_type[:, :-1] != StepType.LAST) & (step_type[:, 1:] != StepType.FIRST)
    observation = np.asarray(items["observation"])[:, :-1][valid]
    return (observation, np.asarray(items["action"])[:, :-1][valid],
            np.asarray(items["reward"])[:, 1:][valid])


def reward_fn(network, support_size: int):
    """jitted (params, o [N, ...], a [N]) -> r_hat [N]: the model's reward for one step."""

    @jax.jit
    def predict(params, observation, action):
        latent = network.apply(params, observation, method="represent")
        logits, _ = network.apply(params, latent, action, method="dynamics")
        return value_to_scalar(logits, support_size)

    def batched(params, observation, action, size: int = 4096):
        return np.concatenate([np.asarray(predict(params, observation[i:i + size],
                                                  action[i:i + size]))
                               for i in range(0, len(action), size)])

    return batched


def summary(r_hat: np.ndarray, reward: np.ndarray) -> str:
    hit = reward > 0
    if not hit.any():
        return f"no rewarded transitions among {len(reward):,}"
    return (f"r_hat {r_hat[hit].mean():.3f} on the {int(hit.sum()):,} rewarded, "
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
            logits, tgt.scalar_to_probs(reward[i], support_size)))

    @jax.jit
    def step(params, opt_state, key):
        i = jax.random.randint(key, (batch,), 0, action.shape[0])
        grads = jax.grad(loss)(params, i)
        change, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, change), opt_state

    for step_key in jax.random.split(key, updates):
        params, opt_state = step(params, opt_state, step_key)
    return params


def main(argv):
    del argv
    workdir = _WORKDIR.value
    with open(os.path.join(workdir, "config.json")) as f:
        config = json.load(f)
    agent_config = ml_collections.ConfigDict(config["agent"])
    env = envs_jax.make(config["env"]["name"], **config["env"].get("kwargs", {}))
    env_spec = EnvSpec(observation=env.observation_spec(), action=env.action_spec())
    state, metadata = checkpoint.load_arrays(os.path.join(workdir, "checkpoints"))
    learner = state["learner_state"]
    items = learner["replay"]["items"]
    if "observation" not in items:
        raise SystemExit("This probe reads whole observations; the replay stores frames once.")
    params = learner["params"]["params"]
    if "model" in params:  # EfficientZero: h, g and f are its `model`
        params = params["model"]
    runs = jax.tree.leaves(items)[0].shape[1]
    support = int(agent_config.support_size)
    network = make_network(agent_config, env_spec)
    print(f"{config['env']['name']}, {agent_config.name} ({network.kind}), "
          f"{metadata['env_steps']:,} steps, {runs} run(s)")
    data = [transitions(jax.tree.map(lambda x, r=r: x[0, r], items)) for r in range(runs)]
    predict = reward_fn(network, support)
    for r in range(runs):
        run_params = {"params": jax.tree.map(lambda x, r=r: jnp.asarray(x[0, r]), params)}
        print(f"trained run {r}: {summary(predict(run_params, *data[r][:2]), data[r][2])}")
    if runs > 1:
        train, held_out = data[0], data[1]
    else:
        half = len(data[0][2]) // 2
        train = tuple(x[:half] for x in data[0])
        held_out = tuple(x[half:] for x in data[0])
    for kind in _NETWORKS.value:
        config_k = ml_collections.ConfigDict(config["agent"])
        config_k.network = kind
        network_k = make_network(config_k, env_spec)
        fitted = fit_reward(network_k, support, train, updates=_UPDATES.value,
                            batch=_BATCH.value, learning_rate=_LR.value)
        predict_k = reward_fn(network_k, support)
        print(f"fit {kind}: train {summary(predict_k(fitted, *train[:2]), train[2])}")
        print(f"fit {kind}: held out {summary(predict_k(fitted, *held_out[:2]), held_out[2])}")


if __name__ == "__main__":
    flags.mark_flag_as_required("workdir")
    app.run(main)
