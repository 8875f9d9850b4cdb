"""`experiments.probe_rewards`: the transitions it reads from replay windows, and its reward fit."""

import functools

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from conftest import KnownModel

from agents import muzero
from agents.muzero.networks import make_network
from envs_jax.base import Environment
from experiments import probe_rewards
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec, TimeStep

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


def test_into_terminal_flags_the_steps_into_a_true_terminal_only():
    # Two windows of 5: a terminal (LAST, discount 0) at t=2; a truncation (LAST, discount 1)
    # at t=2, which bootstraps and is no death.
    items = {
        "observation": np.arange(10, dtype=np.float32).reshape(2, 5, 1),
        "action": np.zeros((2, 5), np.int32),
        "reward": np.zeros((2, 5), np.float32),
        "discount": np.array([[1, 1, 0, 1, 1], [1, 1, 1, 1, 1]], np.float32),
        "step_type": np.array([[FIRST, MID, LAST, FIRST, MID]] * 2, np.int8),
    }
    observation, _, _ = probe_rewards.transitions(items)
    terminal = probe_rewards.into_terminal(items)
    # Steps o_0->o_1, o_1->o_2, o_3->o_4 of each window; only o_1->o_2 of the first dies.
    np.testing.assert_array_equal(observation[:, 0], [0, 1, 3, 5, 6, 8])
    np.testing.assert_array_equal(terminal, [False, True, False, False, False, False])
    values = np.array([[0.6, 0.3, 0.6, 0.5, 0.5, 0.4],  # v(h(o))
                       [0.5, 0.1, 0.5, 0.4, 0.4, 0.2]])  # v(g(h(o), a))
    line = probe_rewards.terminal_recall(values, terminal)
    assert line == ("v(g(h(o), a)) 0.100 on the 1 steps into a terminal (target 0; v(h(o)) "
                    "0.300), 0.400 on the other 5 (v(h(o)) 0.520)")
    np.testing.assert_array_equal(probe_rewards.terminal_observations(items),
                                  [[False, False, True, False, False], [False] * 5])
    assert "no steps into a terminal among 6" in probe_rewards.terminal_recall(
        np.zeros((2, 6)), np.zeros(6, bool))


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


@chex.dataclass(frozen=True)
class _LedgeState:
    position: jax.Array  # [] int32


class _Ledge(Environment):
    """Five cells in a row; action 0 steps left, 1 right. Stepping left off cell 0 or right
    off cell 4 falls (a true terminal); a reset puts the walker on a random cell."""

    def _timestep(self, position, step_type, discount):
        return TimeStep(step_type=jnp.asarray(step_type, jnp.int32),
                        reward=jnp.zeros((), jnp.float32),
                        discount=jnp.asarray(discount, jnp.float32),
                        observation=jax.nn.one_hot(position, 5))

    def reset(self, key):
        position = jax.random.randint(key, (), 0, 5)
        return _LedgeState(position=position), self._timestep(position, FIRST, 1.0)

    def step(self, state, action):
        position = state.position + 2 * action - 1
        fell = (position < 0) | (position > 4)
        position = jnp.clip(position, 0, 4)
        return (_LedgeState(position=position),
                self._timestep(position, jnp.where(fell, LAST, MID), jnp.where(fell, 0.0, 1.0)))

    def observation_spec(self):
        return ArraySpec((5,), np.float32)

    def action_spec(self):
        return DiscreteSpec(2)


def test_decisive_states_are_those_where_some_action_ends_the_episode():
    observation, fatal = probe_rewards.decisive_states(_Ledge(), jax.random.PRNGKey(0),
                                                       num_envs=8, steps=50)
    position = observation.argmax(axis=1)
    # Only the two edge cells are decisive: left falls from cell 0, right from cell 4.
    assert set(position.tolist()) == {0, 4}
    np.testing.assert_array_equal(fatal[position == 0], [[True, False]] * (position == 0).sum())
    np.testing.assert_array_equal(fatal[position == 4], [[False, True]] * (position == 4).sum())
    # A model valuing every action alike does not tell them apart; one valuing the fatal
    # action below the other always survives.
    flat = np.zeros(fatal.shape)
    assert "Q(surviving) - Q(fatal) +0.0000" in probe_rewards.terminal_summary(flat, fatal)
    knows = np.where(fatal, -1.0, 0.5)
    line = probe_rewards.terminal_summary(knows, fatal)
    assert "survives in 1.000" in line and "(a uniform choice: 0.500)" in line
    assert "Q(surviving) - Q(fatal) +1.5000" in line


def test_one_step_q_is_the_reward_plus_the_discounted_value_of_each_actions_next_state():
    # The stand-in model: reward 3 and value 0.2 after every action; its terminal head's
    # logit at s' = s + a is s0 + a, so gamma (1 - P(end)) = 0.97 sigmoid(-(s0 + a)). From
    # s0 = 0: 3 + 0.97 x 0.2 x [0.5, 0.2689414, 0.1192029] = [3.097, 3.0521747, 3.0231254].
    q = probe_rewards.one_step_q(KnownModel(terminal_head=True), None,
                                 np.zeros((1, 2), np.float32), 10, 0.97)
    np.testing.assert_allclose(q, [[3.097, 3.0521747, 3.0231254]], atol=1.5e-3)


def test_one_step_q_of_a_fresh_network_is_zero_for_every_action():
    # MuZero's heads start with zero logits: uniform over a support symmetric about 0, whose
    # mean is 0 (to float32 rounding), so r_hat = v = 0 and Q = 0 for every action.
    config = muzero.default_config()
    spec = EnvSpec(observation=ArraySpec((5,), np.float32), action=DiscreteSpec(2))
    network = make_network(config, spec)
    observation = np.eye(5, dtype=np.float32)
    params = network.init(jax.random.PRNGKey(0), observation[:1], np.zeros(1, np.int32))
    q = probe_rewards.one_step_q(network, params, observation, config.support_size, 0.97)
    np.testing.assert_allclose(q, np.zeros((5, 2)), atol=1e-3)


def _freeway_timestep(row: int, reward: float = 0.0) -> TimeStep:
    """A MinAtar Freeway timestep (gymnax's [10, 10, 7] board) with the chicken, channel 0,
    at `row` of column 4."""
    observation = np.zeros((10, 10, 7), np.bool_)
    observation[row, 4, 0] = True
    return TimeStep(step_type=jnp.int32(MID), reward=jnp.float32(reward),
                    discount=jnp.float32(1.0), observation=jnp.asarray(observation))


def test_a_freeway_collision_is_a_return_to_the_bottom_without_a_reward():
    hit = probe_rewards.freeway_collision
    assert bool(hit(_freeway_timestep(5), _freeway_timestep(9)))  # hit by a car at row 5
    assert not bool(hit(_freeway_timestep(1), _freeway_timestep(9, reward=1.0)))  # a crossing
    assert not bool(hit(_freeway_timestep(5), _freeway_timestep(4)))  # one row up
    assert not bool(hit(_freeway_timestep(9), _freeway_timestep(9)))  # waiting at the bottom


def _stacked(older: TimeStep, newer: TimeStep) -> TimeStep:
    """`newer` with `older`'s board before its own on the last axis (envs_jax.FrameStack's
    order, newest last)."""
    return newer.replace(observation=jnp.concatenate([older.observation, newer.observation], -1))


def test_a_freeway_collision_reads_the_newest_board_of_a_stack():
    hit = functools.partial(probe_rewards.freeway_collision, frame_stack=2)
    # From row 5 (the board before: row 6) to the bottom without a reward: hit.
    assert bool(hit(_stacked(_freeway_timestep(6), _freeway_timestep(5)),
                    _stacked(_freeway_timestep(5), _freeway_timestep(9))))
    # From row 5 up to row 4; the boards before them were at the bottom: not hit, though the
    # oldest boards alone would read "from row 9 to row 5".
    assert not bool(hit(_stacked(_freeway_timestep(9), _freeway_timestep(5)),
                        _stacked(_freeway_timestep(5), _freeway_timestep(4))))
    assert not bool(hit(_stacked(_freeway_timestep(4), _freeway_timestep(9)),
                        _stacked(_freeway_timestep(9), _freeway_timestep(9))))


def test_decisive_states_follow_the_outcome_given():
    # "Fatal": stepping onto the middle cell (2), which cells 1 (right) and 3 (left) can do.
    def onto_the_middle(timestep, next_timestep):
        return (next_timestep.observation.argmax() == 2) & (timestep.observation.argmax() != 2)

    observation, fatal = probe_rewards.decisive_states(
        _Ledge(), jax.random.PRNGKey(0), num_envs=8, steps=50, outcome=onto_the_middle)
    position = observation.argmax(axis=1)
    assert set(position.tolist()) == {1, 3}
    np.testing.assert_array_equal(fatal[position == 1], [[False, True]] * (position == 1).sum())
    np.testing.assert_array_equal(fatal[position == 3], [[True, False]] * (position == 3).sum())


def test_decisive_states_can_return_where_each_action_leads():
    observation, fatal, following = probe_rewards.decisive_states(
        _Ledge(), jax.random.PRNGKey(0), num_envs=8, steps=50, with_next=True)
    position = observation.argmax(axis=1)
    assert following.observation.shape == (len(position), 2, 5)
    # From cell 0: left falls (a terminal, discount 0, the walker stays), right goes to 1.
    at_0 = position == 0
    np.testing.assert_array_equal(following.observation[at_0].argmax(-1), [[0, 1]] * at_0.sum())
    np.testing.assert_array_equal(following.discount[at_0], [[0.0, 1.0]] * at_0.sum())
    np.testing.assert_array_equal(fatal[at_0], following.discount[at_0] == 0)


def test_root_statistics_read_the_visited_actions_only():
    # Search 0: Q .50 / .49 / .70 with visits 10 / 6 / 0 -> spread over the visited .01, the
    # top action holds 10 of 16 visits, 4 more than the second. Search 1: one action visited
    # -> no spread (NaN); a tie -> lead 0.
    q = np.array([[0.50, 0.49, 0.70], [0.2, 0.9, 0.1], [0.3, 0.1, 0.2]])
    visits = np.array([[10, 6, 0], [0, 16, 0], [8, 0, 8]])
    stats = probe_rewards.root_statistics(q, visits)
    np.testing.assert_allclose(stats["spread"], [0.01, np.nan, 0.1], atol=1e-12)
    np.testing.assert_allclose(stats["top_share"], [10 / 16, 1.0, 0.5])
    np.testing.assert_array_equal(stats["lead"], [4, 16, 0])


def test_greedy_play_of_a_fresh_network_sees_no_q_spread_and_counts_one_game():
    # A fresh MuZero network predicts r_hat = v = 0 (test above), so every root Q is 0; Catch's
    # game lasts 9 steps and rewards once at its end, so 20 steps count that reward once.
    import envs_jax
    from agents.muzero.agent import search_config

    env = envs_jax.make("catch")
    spec = EnvSpec(observation=env.observation_spec(), action=env.action_spec())
    config = muzero.default_config()
    config.num_simulations = 8
    network = make_network(config, spec)
    obs = jnp.zeros((1,) + spec.observation.shape, spec.observation.dtype)
    params = network.init(jax.random.PRNGKey(0), obs, jnp.zeros((1,), jnp.int32))
    out = jax.tree.map(np.asarray, probe_rewards.greedy_play(
        network, params, env, search_config(config), jax.random.PRNGKey(1), games=4,
        steps=20))
    assert out["q"].shape == (20, 4, 3) and out["visits"].shape == (20, 4, 3)
    np.testing.assert_array_equal(out["visits"].sum(-1), 8)
    np.testing.assert_allclose(out["q"], 0.0, atol=1e-3)
    assert out["tree_range"].shape == (20, 4)
    np.testing.assert_allclose(out["tree_range"], 0.0, atol=1e-3)
    # Each game's one catch-or-miss reward (+1 or -1), and nothing from the game after it.
    np.testing.assert_array_equal(np.abs(out["reward"]).sum(0), 1.0)
    assert set(np.unique(out["reward"])) <= {-1.0, 0.0, 1.0}
    np.testing.assert_array_equal(out["action"], out["visits"].argmax(-1))


def test_fixed_play_scores_each_catch_game_by_where_its_ball_falls():
    # Catch's paddle starts in the middle column (2 of 5); pressing "stay" (1) throughout
    # catches the ball (+1) exactly when it falls in that column, else misses (-1); one game
    # of 9 steps fits in 12, and nothing after its end counts.
    import envs_jax

    env = envs_jax.make("catch")
    key = jax.random.PRNGKey(3)
    out = jax.tree.map(np.asarray, probe_rewards.fixed_play(env, 1, key, games=64, steps=12))
    # The games' starts are `play`'s: the first half of the key's split.
    states, _ = jax.vmap(env.reset)(jax.random.split(jax.random.split(key)[0], 64))
    expected = np.where(np.asarray(states.ball_x) == 2, 1.0, -1.0)
    assert 0 < np.sum(expected == 1.0) < 64  # both outcomes occur
    np.testing.assert_array_equal(out["reward"].sum(0), expected)
    np.testing.assert_array_equal(out["action"], 1)


def test_prior_play_follows_the_policy_head_and_matches_that_fixed_action():
    # A policy head with zero weights and a bias that favours action 0 (left) makes the prior's
    # argmax 0 in every state, so its games are those of pressing 0 throughout.
    import envs_jax

    env = envs_jax.make("catch")
    spec = EnvSpec(observation=env.observation_spec(), action=env.action_spec())
    config = muzero.default_config()
    network = make_network(config, spec)
    obs = jnp.zeros((1,) + spec.observation.shape, spec.observation.dtype)
    params = network.init(jax.random.PRNGKey(0), obs, jnp.zeros((1,), jnp.int32))
    head = params["params"]["policy_head"]["Dense_1"]
    head["kernel"] = jnp.zeros_like(head["kernel"])
    head["bias"] = jnp.asarray([1.0, 0.0, 0.0])
    key = jax.random.PRNGKey(5)
    prior = jax.tree.map(np.asarray, probe_rewards.prior_play(network, params, env, key,
                                                              games=64, steps=12))
    fixed = jax.tree.map(np.asarray, probe_rewards.fixed_play(env, 0, key, games=64,
                                                              steps=12))
    np.testing.assert_array_equal(prior["action"], 0)
    np.testing.assert_array_equal(prior["reward"], fixed["reward"])
    # Moving left from the middle column for 9 steps ends at column 0: caught only there.
    states, _ = jax.vmap(env.reset)(jax.random.split(jax.random.split(key)[0], 64))
    np.testing.assert_array_equal(prior["reward"].sum(0),
                                  np.where(np.asarray(states.ball_x) == 0, 1.0, -1.0))


def test_play_counts_only_each_games_first_episode_when_the_env_resets_itself():
    # Under AutoReset, Catch starts a new game on the step after each LAST: 30 steps hold three
    # games of 9 steps (and a reset step between). Only the first game's reward counts, as in
    # the runners' evaluation; without the mask the sums would reach +-3.
    import envs_jax
    from envs_jax.wrappers import AutoReset

    env = AutoReset(envs_jax.make("catch"))
    key = jax.random.PRNGKey(7)
    out = jax.tree.map(np.asarray, probe_rewards.fixed_play(env, 1, key, games=64, steps=30))
    states, _ = jax.vmap(env.reset)(jax.random.split(jax.random.split(key)[0], 64))
    first = np.where(np.asarray(states.env_state.ball_x) == 2, 1.0, -1.0)
    assert 0 < np.sum(first == 1.0) < 64
    np.testing.assert_array_equal(out["reward"].sum(0), first)
    assert np.count_nonzero(out["reward"]) == 64  # one reward per game, none after it
