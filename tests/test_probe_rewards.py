"""`experiments.probe_rewards`: the transitions it reads from replay windows, and its reward fit."""

import ml_collections
import numpy as np

from agents import muzero
from agents.muzero.networks import make_network
from experiments import probe_rewards
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec

FIRST, MID, LAST = 0, 1, 2


def test_transitions_pair_each_action_with_the_next_reward_inside_an_episode():
    # One window of 6 timesteps: an episode ending at t=2 (LAST), the next starting at t=3.
    items = {
        "observation": np.arange(6, dtype=np.float32).reshape(1, 6, 1),
        "action": np.array([[10, 11, 12, 13, 14, 15]]),
        "reward": np.array([[0.0, 1.0, 2.0, 0.0, 4.0, 5.0]], np.float32),
        "step_type": np.array([[FIRST, MID, LAST, FIRST, MID, MID]], np.int8),
    }
    observation, action, reward = probe_rewards.transitions(items)
    # o_0 -a_0-> r_1, o_1 -a_1-> r_2; o_2 is LAST (no action); o_3 -a_3-> r_4, o_4 -a_4-> r_5.
    np.testing.assert_array_equal(observation[:, 0], [0, 1, 3, 4])
    np.testing.assert_array_equal(action, [10, 11, 13, 14])
    np.testing.assert_array_equal(reward, [1.0, 2.0, 4.0, 5.0])


def test_the_fit_learns_a_reward_that_depends_on_the_action():
    # r_{t+1} = 1 when a_t is the index of the lit cell of o_t (of 3), else 0.
    rng = np.random.default_rng(0)
    lit = rng.integers(0, 3, 2048)
    observation = np.eye(3, dtype=np.float32)[lit]
    action = rng.integers(0, 3, 2048)
    reward = (action == lit).astype(np.float32)
    config = ml_collections.ConfigDict(muzero.default_config())
    config.latent_size, config.hidden_sizes = 32, (32,)
    spec = EnvSpec(observation=ArraySpec((3,), np.float32), action=DiscreteSpec(3))
    network = make_network(config, spec)
    params = probe_rewards.fit_reward(network, config.support_size,
                                      (observation, action, reward), updates=300, batch=128,
                                      learning_rate=3e-3)
    r_hat = probe_rewards.reward_fn(network, config.support_size)(params, observation, action)
    assert r_hat[reward > 0].mean() > 0.8 and r_hat[reward == 0].mean() < 0.1
    assert "recall@0.5 1.000" in probe_rewards.summary(r_hat, reward)
