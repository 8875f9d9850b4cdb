"""The conformance suite: every registered environment against the `envs_jax` API contract.

For each environment, one jitted program resets a vmapped batch and runs it through
`wrap_for_training` with a short `TimeLimit` (L steps) under random legal actions, and beside
it the same environment *without* any wrapper from the same reset key with the same actions
(its first episode). Checked:

- reset and step run under `jit` and `vmap`; every output matches the specs (shapes, dtypes,
  step types, rewards and discounts as float32, the action mask where there is one);
- the wrappers are transparent: up to the first episode's end the wrapped timesteps equal the
  bare environment's (floats to within 1e-6: XLA may round the two computations differently);
- a time-limit end is LAST with discount 1 unless the bare environment terminated on that same
  step; a true terminal (for native environments, every end before the limit) has discount 0;
- automatic reset: FIRST exactly after each LAST, with reward 0 and discount 1, and the LAST
  timestep keeps the final observation;
- determinism: the same key gives bit-identical results.

Specs: `env.spec()` asked for inside `jax.jit` equals the eager spec, for every registered
environment of every installed library (runners ask for specs inside traced code).

Anakin: each environment also runs one compiled chunk of Anakin's program (a few updates of a
tiny V-trace agent), so that a failure only a runner meets cannot hide behind the checks
above. Environments the V-trace agent accepts as they are (one discrete action, a scalar reward,
an array observation) go through `anakin.train`, as a user's config would; the others through
`anakin.runner.make_programs` with a structured observation flattened
(`envs_jax.FlattenObservation`) and, where V-trace cannot act (continuous or per-entry actions,
per-agent rewards), an agent that acts uniformly at random and learns nothing.

Native environments always run. Adapted libraries run when their extra is installed (else
their cases are skipped): by default a few representative environments each, and with
`PODRACER_FULL_CONFORMANCE=1` every environment the library registers (minutes on a 2-core
CPU; run before changing an adapter or a pinned library version).
"""

from __future__ import annotations

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import agents
import anakin
import envs_jax
from anakin.runner import make_programs
from experiments.configs import vtrace_catch
from podracer import replication
from podracer.agent import Agent
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec, StepType

LIMIT = 8  # L: the test's time limit
NUM_STEPS = 3 * LIMIT
NUM_ENVS = 2
FULL = os.environ.get("PODRACER_FULL_CONFORMANCE") == "1"

# The representative environments of each adapted library run by default.
DEFAULT_ADAPTED = {
    "gymnax": ["Breakout-MinAtar"],  # boolean image observations, a library time limit
    "pgx": ["tic_tac_toe"],  # two players and a legal-action mask
    "jumanji": ["Snake-v1"],  # a structured observation with a mask
    "brax": ["fast"],  # brax's own quick test environment (the physics ones compile for ~1 min)
}
# Environments that cannot be built on a machine without network access, and why.
NEEDS_DOWNLOAD = {
    "gymnax:MNISTBandit-bsuite": "downloads the MNIST data set when built",
    "jumanji:Sokoban-v0": "downloads its level data set when built",
}


def _cases(*, full: bool = FULL) -> list:
    cases = [pytest.param(name, id=name) for name in envs_jax.registered(adapters=False)]
    for namespace in envs_jax.namespaces():
        if full and envs_jax.registry.installed(namespace):
            names = [n for n in envs_jax.registered() if n.startswith(namespace + ":")]
        else:
            names = [f"{namespace}:{n}" for n in DEFAULT_ADAPTED[namespace]]
        cases += [pytest.param(name, id=name) for name in names]
    return cases


def _skip_if_unavailable(name: str) -> None:
    """Skips when the environment's library is not installed or it needs a download."""
    namespace, sep, _ = name.partition(":")
    if sep:
        pytest.importorskip(namespace)
    if name in NEEDS_DOWNLOAD:
        pytest.skip(NEEDS_DOWNLOAD[name])


def _sample_action(spec, mask, key):
    """A uniformly random action, legal where the environment gives a mask."""
    if isinstance(spec, DiscreteSpec):
        if mask is not None and mask.shape == (spec.num_values,):
            logits = jnp.where(mask | ~mask.any(), 0.0, -jnp.inf)
            return jax.random.categorical(key, logits).astype(spec.dtype)
        return jax.random.randint(key, (), 0, spec.num_values, spec.dtype)
    if np.issubdtype(spec.dtype, np.integer):
        maximum = jnp.broadcast_to(jnp.asarray(spec.maximum), spec.shape)
        if mask is not None and mask.shape[:-1] == spec.shape:
            logits = jnp.where(mask | ~mask.any(-1, keepdims=True), 0.0, -jnp.inf)
            return jax.random.categorical(key, logits).astype(spec.dtype)
        return jax.random.randint(key, spec.shape, 0, maximum + 1, spec.dtype)
    low = np.broadcast_to(np.asarray(spec.minimum, np.float32), spec.shape)
    high = np.broadcast_to(np.asarray(spec.maximum, np.float32), spec.shape)
    low, high = np.where(np.isfinite(low), low, -1.0), np.where(np.isfinite(high), high, 1.0)
    return jax.random.uniform(key, spec.shape, jnp.float32, low, high).astype(spec.dtype)


def _make_program(name: str):
    bare = envs_jax.make(name)
    wrapped = envs_jax.wrap_for_training(bare, max_episode_steps=LIMIT)
    action_spec = bare.action_spec()

    def run(key):
        # AutoReset's first reset uses fold_in(key, 0) (its documented key scheme): start the
        # bare environment from the same key.
        reset_key, key = jax.random.split(key)
        state, timestep = wrapped.reset(reset_key)
        bare_state, bare_timestep = bare.reset(jax.random.fold_in(reset_key, 0))

        def body(carry, key):
            state, timestep, bare_state = carry
            action = _sample_action(action_spec, timestep.extras.get("action_mask"), key)
            state, timestep = wrapped.step(state, action)
            bare_state, bare_timestep = bare.step(bare_state, action)
            return (state, timestep, bare_state), (timestep, bare_timestep)

        carry = (state, timestep, bare_state)
        _, (timesteps, bare_timesteps) = jax.lax.scan(body, carry, jax.random.split(key, NUM_STEPS))
        return timestep, bare_timestep, timesteps, bare_timesteps

    return bare, jax.jit(jax.vmap(run))


def _check_matches_spec(timestep, env, batch_shape: tuple[int, ...]) -> None:
    obs_specs = jax.tree.leaves(env.observation_spec())
    observations = jax.tree.leaves(timestep.observation)
    assert len(obs_specs) == len(observations)
    for spec, obs in zip(obs_specs, observations):
        assert isinstance(spec, ArraySpec)
        assert obs.shape == batch_shape + tuple(spec.shape), (obs.shape, spec.shape)
        assert obs.dtype == spec.dtype, (obs.dtype, spec.dtype)
    assert timestep.step_type.dtype == jnp.int32 and timestep.step_type.shape == batch_shape
    assert timestep.reward.dtype == jnp.float32
    assert timestep.reward.shape == batch_shape + tuple(env.reward_spec().shape)
    assert timestep.discount.dtype == jnp.float32
    mask = timestep.extras.get("action_mask")
    if mask is not None:
        assert mask.dtype == jnp.bool_
        if isinstance(env.action_spec(), DiscreteSpec):
            assert mask.shape == batch_shape + (env.action_spec().num_values,)


def _assert_same_values(x, y, where: str = "") -> None:
    """Equal, except that floats may differ in their last bits.

    The wrapped and the bare environment are two computations inside one program, and XLA on
    CPU need not round them alike (on an AMD EPYC, brax:humanoid's reward came out one float32
    ulp apart at step 7); integers and booleans must match exactly.
    """
    x, y = np.asarray(x), np.asarray(y)
    if np.issubdtype(x.dtype, np.floating):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6, err_msg=where)
    else:
        np.testing.assert_array_equal(x, y, err_msg=where)


@pytest.mark.parametrize("name", _cases())
def test_conforms_to_the_api(name: str) -> None:
    _skip_if_unavailable(name)
    bare, program = _make_program(name)
    keys = jax.random.split(jax.random.PRNGKey(0), NUM_ENVS)
    outputs = jax.device_get(program(keys))

    # DETERMINISM: the same keys, the same results, bit for bit.
    jax.tree.map(np.testing.assert_array_equal, outputs, jax.device_get(program(keys)))

    first, bare_first, *scanned = outputs
    # vmap put the batch axis first; index the scanned outputs as [t, b].
    timesteps, bare_timesteps = jax.tree.map(lambda x: np.swapaxes(x, 0, 1), scanned)

    # SPECS: reset outputs [B], step outputs [T, B].
    _check_matches_spec(first, bare, (NUM_ENVS,))
    _check_matches_spec(timesteps, bare, (NUM_STEPS, NUM_ENVS))
    assert np.all(first.step_type == StepType.FIRST)
    assert np.all(first.reward == 0) and np.all(first.discount == 1)

    native = ":" not in name
    # Multi-agent environments (jumanji's) keep a discount per agent: an agent that is done
    # has 0 while the episode goes on, so there the truncation check is "unchanged" instead
    # of "1", and MID discounts are 0 or 1 per agent.
    multi_agent = bare.reward_spec().shape != ()
    for b in range(NUM_ENVS):

        def at(tree, t, b=b):
            return jax.tree.map(lambda x: x[t, b], tree)

        # TRANSPARENCY and TIME LIMIT, over the first episode.
        jax.tree.map(_assert_same_values, first.observation, bare_first.observation)
        for t in range(LIMIT):
            ours, theirs = at(timesteps, t), at(bare_timesteps, t)
            where = f"{name} env {b} step {t}"
            _assert_same_values(ours.reward, theirs.reward, where)
            np.testing.assert_array_equal(ours.discount, theirs.discount, err_msg=where)
            jax.tree.map(
                lambda x, y, where=where: _assert_same_values(x, y, where),
                ours.observation,
                theirs.observation,
            )
            if theirs.step_type == StepType.LAST:
                assert ours.step_type == StepType.LAST, where
                break
            if t == LIMIT - 1:  # truncated by the limit, the bare environment went on
                assert ours.step_type == StepType.LAST, where
                expected = theirs.discount if multi_agent else 1.0
                assert np.all(ours.discount == expected), where
            else:
                assert ours.step_type == StepType.MID, where

        # AUTOMATIC RESET, EPISODE STATISTICS AND DISCOUNTS, over the whole rollout.
        previous, length = StepType.FIRST, 0
        for t in range(NUM_STEPS):
            ts = at(timesteps, t)
            where = f"{name} env {b} step {t}"
            if previous == StepType.LAST:
                assert ts.step_type == StepType.FIRST, where
                assert np.all(ts.reward == 0) and np.all(ts.discount == 1), where
                length = 0
            else:
                assert ts.step_type in (StepType.MID, StepType.LAST), where
                length += 1
                assert ts.extras["episode_length"] == length, where
                assert length <= LIMIT, where
            if ts.step_type == StepType.MID and not multi_agent:
                assert np.all(ts.discount == 1.0), where
            if ts.step_type != StepType.FIRST:
                assert np.all((ts.discount == 0.0) | (ts.discount == 1.0)), where
            # Native environments never truncate by themselves: an end before the limit is
            # a true terminal.
            if ts.step_type == StepType.LAST and native and length < LIMIT:
                assert np.all(ts.discount == 0.0), where
            previous = ts.step_type


def _spec_fields(spec) -> dict:
    """What a spec says, bounds as numpy (or None), for comparing two specs."""
    fields = {"type": type(spec), "shape": tuple(spec.shape), "dtype": np.dtype(spec.dtype),
              "name": spec.name}
    if isinstance(spec, DiscreteSpec):
        return {**fields, "num_values": spec.num_values}
    for bound in ("minimum", "maximum"):
        value = getattr(spec, bound)
        # A spec holds host values: a jax array here (a tracer, under a trace) is the bug.
        assert not isinstance(value, jax.Array), (bound, type(value))
        fields[bound] = None if value is None else np.asarray(value)
    return fields


def _assert_same_specs(traced, eager, where: str) -> None:
    traced_leaves, traced_tree = jax.tree.flatten(traced)
    eager_leaves, eager_tree = jax.tree.flatten(eager)
    assert traced_tree == eager_tree, where
    for t, e in zip(traced_leaves, eager_leaves):
        jax.tree.map(
            lambda x, y: np.testing.assert_array_equal(x, y, err_msg=where),
            _spec_fields(t),
            _spec_fields(e),
            is_leaf=lambda x: x is None,
        )


@pytest.mark.parametrize("name", _cases(full=True))
def test_spec_is_the_same_under_jit(name: str) -> None:
    # Every environment of every installed library, whatever PODRACER_FULL_CONFORMANCE says:
    # asking for a spec costs a fraction of a second, and runners ask for it under a trace.
    _skip_if_unavailable(name)
    env = envs_jax.wrap_for_training(envs_jax.make(name))
    traced = []

    def program(x):
        traced.append((env.spec(), env.reward_spec()))
        return x

    jax.jit(program)(jnp.zeros(()))
    (spec, reward_spec), = traced
    _assert_same_specs(spec.observation, env.observation_spec(), f"{name} observation")
    _assert_same_specs(spec.action, env.action_spec(), f"{name} action")
    _assert_same_specs(reward_spec, env.reward_spec(), f"{name} reward")


# ANAKIN: one chunk of one update, 2 environments x 4 steps, on 1 device.
ANAKIN_ENVS, ANAKIN_T = 2, 4


def _vtrace_config(name: str):
    config = vtrace_catch.get_config()
    config.env.name = name
    config.num_devices = 1
    config.num_envs = ANAKIN_ENVS
    config.rollout_length = ANAKIN_T
    config.updates_per_chunk = 1
    config.total_env_steps = ANAKIN_ENVS * ANAKIN_T  # one chunk
    config.eval_every_updates = 0
    config.agent.torso = "mlp"  # a conv torso would only add compile time here
    config.agent.hidden_sizes = (16,)
    return config


def _vtrace_accepts(spec: EnvSpec, reward_spec: ArraySpec) -> bool:
    """Whether the V-trace agent takes the environment (a structured observation is flattened
    by the runner's `wrap_for_training`)."""
    return (isinstance(spec.action, DiscreteSpec) and tuple(spec.action.shape) == ()
            and reward_spec.shape == ())


@chex.dataclass(frozen=True)
class _Counter:
    updates: jax.Array  # [] int32 learner updates applied so far


def _random_agent(action_spec) -> Agent:
    """Acts uniformly at random (legal actions where there is a mask); learns nothing."""

    def actor_step(params, actor_state, timestep, key, *, evaluation=False):
        del params, evaluation
        keys = jax.random.split(key, timestep.step_type.shape[0])
        mask = timestep.extras.get("action_mask")
        if mask is None:
            action = jax.vmap(lambda k: _sample_action(action_spec, None, k))(keys)
        else:
            action = jax.vmap(lambda m, k: _sample_action(action_spec, m, k))(mask, keys)
        return action, actor_state, {}

    def learner_step(learner_state, trajectory, key, *, axis_name):
        del key, axis_name
        metrics = {"mean_reward": jnp.mean(trajectory.timestep.reward[1:])}
        return learner_state.replace(updates=learner_state.updates + 1), metrics

    return Agent(
        init=lambda key, env_spec: _Counter(updates=jnp.zeros((), jnp.int32)),
        actor_step=actor_step,
        learner_step=learner_step,
        init_actor_state=lambda batch_size: (),
        actor_params=lambda learner_state: (),
    )


def _run_anakin_program(name: str, env: envs_jax.Environment) -> tuple[int, dict]:
    """One chunk of `anakin.runner.make_programs`' program for `env`, replicated on 1 device
    as `anakin.train` does; returns (learner updates, metrics)."""
    env = envs_jax.wrap_for_training(env)
    spec = env.spec()
    if _vtrace_accepts(spec, env.reward_spec()):
        agent = agents.make(_vtrace_config(name).agent, spec)
    else:
        agent = _random_agent(spec.action)
    init, chunk = make_programs(agent, env, envs_per_device=ANAKIN_ENVS,
                                rollout_length=ANAKIN_T, updates_per_chunk=1)
    mesh = replication.make_mesh(jax.devices()[:1])
    env_key, params_key = np.asarray(jax.random.split(jax.random.PRNGKey(0)))
    state = replication.replicate(init, mesh)(replication.from_global(env_key[None], mesh),
                                              replication.from_global(params_key[None], mesh))
    state, metrics = replication.replicate(chunk, mesh)(state)
    updates = int(replication.unreplicate(state.learner_state.updates))
    return updates, jax.device_get(replication.unreplicate(metrics))


@pytest.mark.parametrize("name", _cases())
def test_trains_one_anakin_chunk(name: str) -> None:
    _skip_if_unavailable(name)
    env = envs_jax.make(name)
    spec = env.spec()
    steps = ANAKIN_ENVS * ANAKIN_T
    if _vtrace_accepts(spec, env.reward_spec()):
        # As a user's config runs it: validation, the agent, the replicated programs.
        result = anakin.train(_vtrace_config(name))
        metrics = result.final_metrics
        assert metrics["env_steps"] == steps and metrics["updates"] == 1, metrics
        assert int(replication.unreplicate(result.state.learner_state.updates)) == 1
        for key in ("loss", "policy_loss", "baseline_loss"):
            assert np.isfinite(metrics[key]), (key, metrics)
        # A policy's entropy lies in (0, log |A|] nats (uniform at the top); a freshly
        # initialised one is near uniform.
        assert 0.0 < metrics["entropy"] <= np.log(spec.action.num_values) + 1e-5, metrics
    else:
        # Where V-trace cannot act at all (continuous or per-entry actions, per-agent rewards;
        # `anakin.validate` refuses those configs, naming the reason) a random agent stands in.
        if not isinstance(spec.observation, ArraySpec):
            env = envs_jax.FlattenObservation(env)
        updates, metrics = _run_anakin_program(name, env)
        assert updates == 1
        for key, value in metrics.items():
            assert np.all(np.isfinite(value)), (key, metrics)
    # Completed episodes among the chunk's new timesteps (o_1 .. o_T of each environment).
    assert 0 <= metrics["episodes"] <= steps, metrics


def test_registry_lists_natives_and_names_missing_extras() -> None:
    natives = envs_jax.registered(adapters=False)
    for name in [
        "catch",
        "deep_sea",
        "memory_chain",
        "umbrella_chain",
        "bandit",
        "CartPole-v1",
        "Acrobot-v1",
        "MountainCar-v0",
        "Pendulum-v1",
    ]:
        assert name in natives
    assert set(natives) <= set(envs_jax.registered())
    with pytest.raises(KeyError, match="namespace"):
        envs_jax.make("nolib:Foo")
    with pytest.raises(KeyError, match="CartPole-v1"):
        envs_jax.make("CartPole-v2")
