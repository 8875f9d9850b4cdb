"""The agent conformance check: an agent run through every rule the runners rely on.

    from experiments.conformance import check_agent
    check_agent("vtrace")                                  # a registered agent, its defaults
    check_agent(my_make_agent, config=my_config())         # an agent not registered (yet)

    python -m experiments.conformance --agent=vtrace       # one line per rule
    python -m experiments.conformance --module=my_pkg.my_agent --agent=my_agent

`check_agent` builds the agent for an environment (`catch` by default) and checks, rule by
rule, what Anakin and Sebulba assume of a `podracer.Agent` without knowing which agent they
run (docs/architecture.md, "The agent interface"). Each rule is a small function below, named
in `RULES`; a rule that fails is reported with what went wrong and the fix, and `check_agent`
then raises `ConformanceError`, whose message names every failed rule (or, with
`raise_on_failure=False`, returns the report). A rule that builds on another which failed
(`Rule.needs`: most need trajectories, which need valid actions) is skipped, saying which, so
that one break is reported once. The rules, in the order they run:

  interface        make_agent returns a `podracer.Agent` of callables; `sweepable` names
                   number fields of the agent's config, and comes with a `set_hparams`
  learner_state    init's state is a pytree of arrays, also under jit
  actions          actor_step's actions: int32 [B] within the action spec (float [B, D] for
                   continuous actions); extras lead with [B]; the actor state keeps its layout
  acting_view      actor_step acts on Sebulba's view of a timestep: observation and step type
                   only, reward and discount None (acting and evaluating)
  rollout_length   learner_step takes [T+1, B] trajectories of the runner's T (a replay's period
                   is the runner's rollout length); where the config has `rollout_length`, the
                   agent built with another refuses them with a `ConfigError` naming
                   agent.rollout_length
  evaluation       actor_step(..., evaluation=True) is deterministic: other keys, same actions
  metrics          learner_step's metrics: a dict of numeric scalars whose names do not collide
                   with the runners' own record fields
  vmap             actor_step and learner_step under `jax.vmap` over runs, inside the device
                   replication (an Anakin sweep; init is called run by run, as Anakin does)
  updates_change_params
                   the actor parameters change within a few replicated learner steps (an agent
                   that never updates leaves every other rule unexercised)
  replication      init with one key gives the same state on every device, and after
                   learner_step on different data per device the actor parameters still agree
                   (gradients averaged over the device axis)
  metrics_averaged the metrics agree on every device (averaged over the device axis: Sebulba
                   logs one device's)
  set_hparams      where present: setting the `sweepable` values gives the state, and the
                   update, of an agent built with those values; setting the old ones back gives
                   the old state
  checkpoint       learner_step keeps the learner state's layout, and an orbax checkpoint of
                   it restores bit for bit into init's layout
  anakin_chunk     one compiled, replicated Anakin chunk (`anakin.programs`) runs, finite
  sebulba_update   Sebulba's own actor thread and learner loop (`sebulba.actor`,
                   `sebulba.learner`) make two updates end to end

The replication rules need at least two devices (on a CPU host, simulate them with
`XLA_FLAGS=--xla_force_host_platform_device_count=2`, set before JAX starts; the CLI sets it);
with one they are skipped, and the report says so. Sizes are small (T = 4, 4 environments per
device): the check is about the interface, not about learning. An agent whose config has a
`rollout_length` field (a replay agent) gets the check's T there, as experiments tie it to
the runner's (`config.agent.rollout_length = config.get_ref('rollout_length')`). A warm-up held
in a config field named in `WARMUP_FIELDS` (`min_replay_items`, `learning_starts`, ...) above
T x B, the transitions one trajectory brings each device, is lowered to T x B; the report says
which fields the check set.

Why this lives in `experiments`: the last two rules run both runners' own programs, and only
`experiments` may import both `anakin` and `sebulba` (docs/architecture.md, "Packages"). The
interface-level rules need little beyond `podracer`, but they make their trajectories with
Anakin's own rollout (`anakin.programs.make_rollout`) and share one set of built agents, states
and trajectories with the end-to-end ones, so they stay here with them rather than split over
two modules (a `podracer/testing.py` would have had to take the rollout as an argument).
Sebulba's parts are imported when its rule runs (they need envpool); the Sebulba rule steps the
check's environment as Sebulba's own `envs_jax:<name>` task (`sebulba.envs_jax_env`), so both
runners see the same environment.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # the CLI: simulated devices for the replication rules on a CPU host
    _FLAG = "--xla_force_host_platform_device_count=2"
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import dataclasses
import functools
import importlib
import queue
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import agents
import envs_jax
from anakin.programs import FIRST_NONFINITE, make_programs, make_rollout
from podracer import faults, replication
from podracer.agent import Agent
from podracer.checkpoint import state_layout
from podracer.config import ConfigError
from podracer.types import DEVICE_AXIS, DiscreteSpec, TimeStep

ROLLOUT_LENGTH = 4  # T of every trajectory the check makes
ENVS_PER_DEVICE = 4  # B
NUM_RUNS = 2  # runs vmapped by the `vmap` rule
UPDATES_PER_CHUNK = 2  # of the Anakin chunk
SEBULBA_UPDATES = 2
MAX_LEARNER_STEPS = 8  # replicated learner steps, at most, waiting for the parameters to change
# Config fields an agent may hold a warm-up in (no update until a replay holds this much): the
# check lowers one above WARMUP to WARMUP, the transitions one trajectory brings each device,
# so that its few learner steps update.
WARMUP_FIELDS = ("warmup", "warmup_steps", "warmup_transitions", "learning_starts",
                 "min_replay_size", "min_replay_items", "replay_min_size", "min_buffer_size")
WARMUP = ROLLOUT_LENGTH * ENVS_PER_DEVICE
# A sampled batch no larger than the lowered warm-up: an agent may refuse a warm-up smaller
# than one batch (DQN does), so a batch size above WARMUP is lowered with it.
BATCH_FIELDS = ("batch_size",)

# Record fields the runners write beside the agent's metrics (anakin.runner._record,
# sebulba.learner.Learner._record, the evaluations', the chunk's internal ones): a metric of
# the same name would overwrite one or be overwritten. Anakin also sums (not averages) every
# metric whose name starts with "episode" as an episode count.
RESERVED_METRICS = frozenset({
    "env_steps", "env_frames", "updates", "episode_return", "episode_length", "episodes",
    "steps_per_second", "actor_steps_per_second", "learner_updates_per_second",
    "learner_wait_fraction", "actor_put_wait_s", "actor_params_wait_s", "policy_lag",
    "policy_lag_max", "policy_lags", "wall_time", "eval_return", "eval_return_std",
    "eval_finished", "run", FIRST_NONFINITE, faults.FINITE,
})


class ConformanceError(AssertionError):
    """An agent broke one or more rules; the message names each, what went wrong and the fix.
    `failures` holds the failed rules' results, `report` the whole report."""

    def __init__(self, report: ConformanceReport):
        self.report = report
        self.failures = [r for r in report.results if r.status == "fail"]
        lines = [f"rule {r.rule!r} failed: {r.detail}\n    fix: {r.fix}" for r in self.failures]
        super().__init__(f"agent {report.agent!r} does not conform ({len(self.failures)} of "
                         f"{len(report.results)} rules failed):\n" + "\n".join(lines))

    @property
    def rules(self) -> list[str]:
        """The names of the failed rules, in the order they ran."""
        return [r.rule for r in self.failures]


@dataclasses.dataclass(frozen=True)
class RuleResult:
    rule: str
    status: str  # "pass" | "fail" | "skip"
    detail: str = ""  # why it failed or was skipped; a note where it passed
    fix: str = ""  # what to change, when it failed

    def line(self) -> str:
        text = f"{self.status.upper():4}  {self.rule}"
        if self.detail:
            text += f": {self.detail}"
        if self.status == "fail":
            text += f" Fix: {self.fix}"
        return text


@dataclasses.dataclass(frozen=True)
class ConformanceReport:
    agent: str
    env: str
    num_devices: int
    results: tuple[RuleResult, ...]
    config_changes: tuple[str, ...] = ()  # the agent config fields the check set, and why

    @property
    def passed(self) -> bool:
        return all(r.status != "fail" for r in self.results)

    def result(self, rule: str) -> RuleResult:
        return next(r for r in self.results if r.rule == rule)

    def __str__(self) -> str:
        head = (f"Agent {self.agent!r} on {self.env!r}, {self.num_devices} device(s): "
                + ("conforms" if self.passed else "does NOT conform"))
        changes = ["Set by the check: " + "; ".join(self.config_changes)] \
            if self.config_changes else []
        return "\n".join([head] + changes + [r.line() for r in self.results])


class _Violation(Exception):
    """Raised by a rule: what went wrong (and, optionally, a fix more precise than the rule's)."""

    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


class _Skip(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# What the rules share: the agent, the environment, states and trajectories, built once.


class _Subject:
    """One agent under check, and what several rules use (built when first needed)."""

    def __init__(self, name: str, make_agent: Callable, config: ml_collections.ConfigDict,
                 env_name: str, num_devices: int, seed: int,
                 lowered: Mapping[str, tuple[Any, Any]] | None = None):
        self.name = name
        self.make_agent = make_agent
        self.config = config
        self.lowered = dict(lowered or {})  # warm-up field -> (the config's value, the check's)
        self.env_name = env_name
        self.env = envs_jax.wrap_for_training(envs_jax.make(env_name), None)
        self.spec = self.env.spec()
        self.num_devices = num_devices
        self.devices = jax.devices()[:num_devices]
        self.mesh = replication.make_mesh(self.devices)
        self.key = jax.random.PRNGKey(seed)
        self._replicated_steps: Any = None
        self.updated_after: int | None = None  # the replicated step that first changed params

    @functools.cached_property
    def agent(self) -> Agent:
        return self.make_agent(self.config, self.spec)

    def build(self, config: ml_collections.ConfigDict) -> Agent:
        return self.make_agent(config, self.spec)

    def init(self, key: jax.Array, agent: Agent | None = None) -> Any:
        agent = agent or self.agent
        return jax.jit(lambda k: agent.init(k, self.spec))(key)

    @functools.cached_property
    def state(self) -> Any:
        return self.init(self.key)

    @functools.cached_property
    def params(self) -> Any:
        return jax.jit(self.agent.actor_params)(self.state)

    def reset(self, key: jax.Array, batch: int) -> TimeStep:
        return jax.jit(jax.vmap(self.env.reset))(jax.random.split(key, batch))[1]

    @functools.cached_property
    def rollout(self) -> Callable:
        """Anakin's rollout: (params, key) -> a [T+1, B] trajectory from fresh environments."""
        rollout = make_rollout(self.agent, self.env, ROLLOUT_LENGTH)

        def run(params, key):
            reset_key, act_key = jax.random.split(key)
            env_state, timestep = jax.vmap(self.env.reset)(
                jax.random.split(reset_key, ENVS_PER_DEVICE))
            actor_state = self.agent.init_actor_state(ENVS_PER_DEVICE)
            return rollout(params, actor_state, env_state, timestep, act_key)[0]

        return jax.jit(run)

    def trajectories(self, count: int, salt: int = 1) -> Any:
        """`count` trajectories from different environments, stacked: [count, T+1, B, ...]
        (another `salt`, other environments)."""
        keys = jax.random.split(jax.random.fold_in(self.key, salt), count)
        return jax.tree.map(lambda *xs: jnp.stack(xs),
                            *[self.rollout(self.params, k) for k in keys])

    @functools.cached_property
    def trajectory(self) -> Any:
        return jax.tree.map(lambda x: x[0], self.trajectories(1))

    @functools.cached_property
    def learner_step(self) -> Callable:
        agent = self.agent
        return jax.jit(lambda s, t, k: agent.learner_step(s, t, k, axis_name=None))

    def replicated_steps(self) -> tuple[Any, Any, Any]:
        """(initial state, state after replicated learner steps on different data per device,
        the last step's metrics), all stacked over the devices. Two steps, or more, up to
        `MAX_LEARNER_STEPS`, until the actor parameters change (a warm-up); `updated_after`
        is then the number of steps that changed them (None: none did)."""
        if self._replicated_steps is None:
            agent, n = self.agent, self.num_devices
            init = replication.replicate(lambda k: agent.init(k, self.spec), self.mesh)
            step = replication.replicate(
                lambda s, t, k: agent.learner_step(s, t, k, axis_name=DEVICE_AXIS), self.mesh)
            keys = np.broadcast_to(np.asarray(self.key), (n,) + self.key.shape)
            initial = init(replication.from_global(keys, self.mesh))
            initial_params = agent.actor_params(_device_slices(initial)[0])
            state, metrics, data = initial, None, None
            for i in range(MAX_LEARNER_STEPS):
                # The second step: the first's data, swapped between devices.
                data = (jax.tree.map(lambda x: x[::-1], data) if i == 1 and n > 1
                        else self.trajectories(n, salt=1 + i))
                step_keys = jax.random.split(jax.random.fold_in(self.key, 2 + i), n)
                state, metrics = step(state, replication.from_global(data, self.mesh),
                                      replication.from_global(step_keys, self.mesh))
                if self.updated_after is None and _first_difference(
                        agent.actor_params(_device_slices(state)[0]), initial_params) is not None:
                    self.updated_after = i + 1
                if i >= 1 and self.updated_after is not None:
                    break
            self._replicated_steps = (initial, state, metrics)
        return self._replicated_steps


def _path(path: Any) -> str:
    return jax.tree_util.keystr(path) or "<root>"


def _numpy(x: Any) -> np.ndarray:
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)  # typed PRNG keys compare by their bits
    return np.asarray(jax.device_get(x))


def _host(tree: Any) -> Any:
    return jax.tree.map(_numpy, tree)


def _first_difference(a: Any, b: Any, *, rtol: float = 0.0) -> str | None:
    """Where pytrees `a` and `b` differ (structure, shape, dtype, or values beyond `rtol` times
    the leaf's largest magnitude), or None."""
    flat_a, tree_a = jax.tree_util.tree_flatten_with_path(_host(a))
    flat_b, tree_b = jax.tree_util.tree_flatten_with_path(_host(b))
    if tree_a != tree_b:
        return f"the structures differ ({tree_a} vs {tree_b})"
    for (path, x), (_, y) in zip(flat_a, flat_b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{_path(path)}: {x.shape} {x.dtype} vs {y.shape} {y.dtype}"
        if np.issubdtype(x.dtype, np.inexact) and rtol > 0:
            scale = float(np.max(np.abs(y[np.isfinite(y)]), initial=0.0))
            if not np.allclose(x, y, rtol=0.0, atol=rtol * scale, equal_nan=True):
                return f"{_path(path)}: values differ"
        elif not np.array_equal(x, y, equal_nan=np.issubdtype(x.dtype, np.inexact)):
            return f"{_path(path)}: values differ"
    return None


def _layout_difference(a: Any, b: Any) -> str | None:
    """Where the structure, shapes or dtypes of pytrees `a` and `b` (arrays or
    `jax.ShapeDtypeStruct`s) differ, or None."""
    tree_a, tree_b = jax.tree.structure(a), jax.tree.structure(b)
    if tree_a != tree_b:
        return f"the structures differ ({tree_a} vs {tree_b})"
    for x, y in zip(state_layout(a), state_layout(b)):
        if x != y:
            return f"{x[0] or '<root>'}: {x[1]} {x[2]} became {y[1]} {y[2]}"
    return None


def _device_slices(stacked: Any) -> list[Any]:
    return [jax.tree.map(lambda x, i=i: _numpy(x)[i], stacked)
            for i in range(jax.tree.leaves(stacked)[0].shape[0])]


def _needs_devices(subject: _Subject) -> None:
    if subject.num_devices < 2:
        raise _Skip(f"needs at least 2 devices, {subject.num_devices} used (on a CPU host set "
                    "XLA_FLAGS=--xla_force_host_platform_device_count=2 before JAX starts)")


# ---------------------------------------------------------------------------------------------
# The rules. Each takes the subject, raises `_Violation` (or `_Skip`), and may return a note.


def rule_interface(s: _Subject) -> str | None:
    """make_agent returns a `podracer.Agent` of callables; `sweepable` names number fields of
    the agent's config and comes with a `set_hparams`."""
    agent = s.agent
    if not isinstance(agent, Agent):
        raise _Violation(f"make_agent returned a {type(agent).__name__}, not a podracer.Agent")
    for field in ("init", "actor_step", "learner_step", "init_actor_state", "actor_params"):
        if not callable(getattr(agent, field)):
            raise _Violation(f"Agent.{field} is {getattr(agent, field)!r}, not a function")
    if agent.set_hparams is not None and not callable(agent.set_hparams):
        raise _Violation(f"Agent.set_hparams is {agent.set_hparams!r}, neither None nor a "
                         "function")
    sweepable = agent.sweepable
    if not isinstance(sweepable, tuple) or not all(isinstance(n, str) for n in sweepable):
        raise _Violation(f"Agent.sweepable is {sweepable!r}, not a tuple of config field names")
    if sweepable and agent.set_hparams is None:
        raise _Violation(f"Agent.sweepable names {list(sweepable)} but set_hparams is None",
                         "give the Agent a set_hparams that replaces them in the learner "
                         "state, or leave sweepable empty")
    for name in sweepable:
        value = s.config.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Violation(
                f"sweepable names {name!r}, which is not a number field of the agent's config "
                f"({value!r}): runners read each swept value's default from there",
                "name only scalar fields of the agent's default_config() in sweepable")
    return None


def rule_actions(s: _Subject) -> str | None:
    """actor_step's actions are int32 [B] within the action spec (float [B, D] for continuous
    actions); its extras lead with [B]; the actor state keeps its layout."""
    agent, b = s.agent, ENVS_PER_DEVICE
    actor_state = agent.init_actor_state(b)
    timestep = s.reset(s.key, b)
    act = jax.jit(lambda p, a, t, k: agent.actor_step(p, a, t, k))
    action, new_actor_state, extras = act(s.params, actor_state, timestep, s.key)
    spec = s.spec.action
    if isinstance(spec, DiscreteSpec):
        if action.dtype != jnp.int32 or action.shape != (b,):
            raise _Violation(
                f"actions are {action.dtype} {tuple(action.shape)} for a batch of {b}; the "
                "runners store and step discrete actions as int32 [B]",
                "return one int32 action per environment, e.g. action.astype(jnp.int32)")
        values = np.asarray(action)
        if values.min() < 0 or values.max() >= spec.num_values:
            raise _Violation(f"actions {values.tolist()} outside [0, {spec.num_values})",
                             "choose actions among the spec's num_values")
    else:
        shape = (b,) + tuple(spec.shape)
        if not jnp.issubdtype(action.dtype, jnp.floating) or action.shape != shape:
            raise _Violation(f"continuous actions are {action.dtype} {tuple(action.shape)}, "
                             f"not float {shape}",
                             "return one float action vector [D] per environment")
    for path, leaf in jax.tree_util.tree_flatten_with_path(extras)[0]:
        if np.ndim(leaf) < 1 or np.shape(leaf)[0] != b:
            raise _Violation(
                f"extras{_path(path)} has shape {np.shape(leaf)}, not [B={b}, ...]: the runners "
                "stack extras over time and Sebulba splits them along B",
                "give every extras leaf the batch as its leading axis")
    difference = _layout_difference(actor_state, new_actor_state)
    if difference is not None:
        raise _Violation(f"actor_step changed the actor state's layout ({difference}); the "
                         "runners carry it through lax.scan",
                         "return an actor state shaped and typed like init_actor_state(B)'s")
    return None


def rule_acting_view(s: _Subject) -> str | None:
    """actor_step acts on Sebulba's view of a timestep: observation and step type only, reward
    and discount None."""
    agent, b = s.agent, ENVS_PER_DEVICE
    full = s.reset(s.key, b)
    view = TimeStep(step_type=full.step_type, reward=None, discount=None,
                    observation=full.observation)
    for evaluation in (False, True):
        def act(p, a, t, k, evaluation=evaluation):
            return agent.actor_step(p, a, t, k, evaluation=evaluation)[0]

        try:
            expected = jax.eval_shape(act, s.params, agent.init_actor_state(b), full, s.key)
            got = jax.eval_shape(act, s.params, agent.init_actor_state(b), view, s.key)
        except Exception as error:
            raise _Violation(
                f"actor_step(evaluation={evaluation}) fails when timestep.reward and "
                f"timestep.discount are None, as under Sebulba ({type(error).__name__}: "
                f"{_short(error)})") from error
        if (got.shape, got.dtype) != (expected.shape, expected.dtype):
            raise _Violation(f"actor_step returns {got} on Sebulba's view, {expected} on a "
                             "whole timestep")
    return None


def rule_evaluation(s: _Subject) -> str | None:
    """actor_step(..., evaluation=True) is deterministic: the same actions for any key.

    Checked with the actor parameters after two learner steps: at initialisation a searching
    agent's scores can tie everywhere (MuZero's zero-initialised heads), and mctx breaks exact
    ties at random, which is no sampling of the policy."""
    agent = s.agent
    observed = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), s.trajectory.timestep)
    batch = observed.step_type.shape[0]
    params = agent.actor_params(_device_slices(s.replicated_steps()[1])[0])
    act = jax.jit(lambda p, a, t, k: agent.actor_step(p, a, t, k, evaluation=True)[0])
    actions = [np.asarray(act(params, agent.init_actor_state(batch), observed, k))
               for k in jax.random.split(jax.random.fold_in(s.key, 7), 3)]
    for other in actions[1:]:
        if not np.array_equal(actions[0], other):
            changed = int(np.sum(np.any(
                np.reshape(actions[0] != other, (batch, -1)), axis=-1)))
            raise _Violation(
                f"with evaluation=True, {changed} of {batch} actions changed with the key: "
                "greedy evaluation (both runners) must be deterministic")
    return None


def rule_rollout_length(s: _Subject) -> str | None:
    """learner_step takes [T+1, B] trajectories of the runner's T."""
    agent = s.agent
    abstract = jax.eval_shape(s.rollout, s.params, s.key)
    try:
        jax.eval_shape(lambda st, t, k: agent.learner_step(st, t, k, axis_name=None),
                       s.state, abstract, s.key)
    except Exception as error:
        raise _Violation(
            f"learner_step refused a [T+1={ROLLOUT_LENGTH + 1}, B={ENVS_PER_DEVICE}] "
            f"trajectory, the runner's rollout length T={ROLLOUT_LENGTH} "
            f"({type(error).__name__}: {_short(error)})") from error
    if "rollout_length" not in s.config:
        return None
    # Untied, as a config that forgets the tie would make it (the runners refuse one before
    # compiling; a notebook calling learner_step does not): the error must name the field.
    config = ml_collections.ConfigDict(s.config.to_dict())
    config.rollout_length = 2 * ROLLOUT_LENGTH
    try:
        untied = s.build(config)
        state = jax.eval_shape(lambda k: untied.init(k, s.spec), s.key)
    except Exception:  # noqa: BLE001 - built only for this one question; other rules build
        return f"agent.rollout_length tied to the check's T={ROLLOUT_LENGTH}"
    try:
        jax.eval_shape(lambda st, t, k: untied.learner_step(st, t, k, axis_name=None),
                       state, abstract, s.key)
    except Exception as error:
        if isinstance(error, ConfigError) and error.field == "agent.rollout_length":
            return (f"agent.rollout_length tied to the check's T={ROLLOUT_LENGTH}; untied, "
                    "learner_step names the field")
        raise _Violation(_untied_problem(error), _UNTIED_FIX) from error
    return f"agent.rollout_length tied to the check's T={ROLLOUT_LENGTH}"


_UNTIED_FIX = ("check the trajectory's T in learner_step: raise podracer.config.ConfigError("
               "'agent.rollout_length', f'is {rollout_length} but the runner sends "
               "trajectories of T={t}', \"tie them: config.agent.rollout_length = "
               "config.get_ref('rollout_length')\") (as agents/muzero/learning.py's "
               "check_trajectory does)")


def _untied_problem(error: Exception) -> str:
    return (f"with agent.rollout_length = {2 * ROLLOUT_LENGTH} and the runner's T = "
            f"{ROLLOUT_LENGTH} (a config without the tie), learner_step fails with "
            f"{type(error).__name__}: {_short(error)}, which does not name "
            "config.agent.rollout_length and the tie")


def rule_metrics(s: _Subject) -> str | None:
    """learner_step's metrics: a dict of numeric scalars, named apart from the runners' own
    record fields."""
    agent = s.agent
    _, metrics = jax.eval_shape(
        lambda st, t, k: agent.learner_step(st, t, k, axis_name=None),
        s.state, jax.eval_shape(s.rollout, s.params, s.key), s.key)
    if not isinstance(metrics, Mapping) or not all(isinstance(k, str) for k in metrics):
        raise _Violation(f"learner_step's metrics are a {type(metrics).__name__}, not a dict "
                         "of named scalars", "return metrics as {name: scalar}")
    for name, value in metrics.items():
        if not hasattr(value, "shape") or value.shape != () or not (
                jnp.issubdtype(value.dtype, jnp.number) or value.dtype == jnp.bool_):
            raise _Violation(f"metric {name!r} is {value}, not a numeric scalar: the runners "
                             "average each metric into one logged number",
                             "reduce each metric to a scalar (e.g. jnp.mean) before returning")
        if name in RESERVED_METRICS or name.startswith("episode"):
            raise _Violation(
                f"metric {name!r} collides with the runners' record fields (Anakin sums "
                "metrics named episode*; both write env_steps, updates, ... beside the "
                "agent's)", "rename it, e.g. with a prefix such as 'agent_'")
    return None


def rule_vmap(s: _Subject) -> str | None:
    """actor_step and learner_step under `jax.vmap` over runs, inside the device replication,
    as an Anakin sweep runs them."""
    agent, n = s.agent, s.num_devices
    runs = [s.init(k) for k in jax.random.split(jax.random.fold_in(s.key, 3), NUM_RUNS)]
    states = jax.tree.map(lambda *xs: jnp.stack(xs), *runs)
    states = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), states)
    data = s.trajectories(n * NUM_RUNS)
    data = jax.tree.map(lambda x: x.reshape((n, NUM_RUNS) + x.shape[1:]), data)
    keys = jax.random.split(jax.random.fold_in(s.key, 4), n * NUM_RUNS).reshape(n, NUM_RUNS, 2)

    def step(state, trajectory, key):
        params = agent.actor_params(state)
        timestep = jax.tree.map(lambda x: x[0], trajectory.timestep)
        action, _, _ = agent.actor_step(params, agent.init_actor_state(ENVS_PER_DEVICE),
                                        timestep, key)
        state, metrics = agent.learner_step(state, trajectory, key, axis_name=DEVICE_AXIS)
        return action, state, metrics

    mapped = replication.replicate(jax.vmap(step), s.mesh)
    action, _, metrics = mapped(*replication.from_global((states, data, keys), s.mesh))
    if action.shape[:2] != (n, NUM_RUNS):
        raise _Violation(f"vmapped actions have shape {action.shape}, not [devices, runs, B]")
    for name, value in metrics.items():
        if value.shape != (n, NUM_RUNS):
            raise _Violation(f"metric {name!r} under vmap has shape {value.shape[2:]} per run, "
                             "not a scalar")
    return None


def rule_updates_change_params(s: _Subject) -> str | None:
    """The actor parameters change within `MAX_LEARNER_STEPS` replicated learner steps (after
    the check lowered a warm-up field to what its trajectories reach): an agent that never
    updates would pass every other rule unexercised."""
    s.replicated_steps()
    lowered = "; ".join(f"the check set agent.{field} = {new} (was {old})"
                        for field, (old, new) in s.lowered.items())
    if s.updated_after is not None:
        note = f"the actor parameters changed at learner step {s.updated_after}"
        return f"{note} ({lowered})" if lowered else (note if s.updated_after > 1 else None)
    problem = (f"the actor parameters never changed over {MAX_LEARNER_STEPS} learner steps on "
               f"[T+1={ROLLOUT_LENGTH + 1}, B={ENVS_PER_DEVICE}] trajectories ({WARMUP} "
               "transitions per device each): the runners would train nothing, and the "
               "replication rules would check nothing")
    if lowered:
        field = next(iter(s.lowered))
        raise _Violation(
            f"{problem}, though {lowered}: one trajectory's transitions per device",
            f"pass check_agent a config whose agent.{field} the check's {MAX_LEARNER_STEPS} "
            f"learner steps of {WARMUP} transitions per device reach (e.g. 0), or make "
            "learner_step update once its warm-up is reached")
    raise _Violation(problem)


def rule_replication(s: _Subject) -> str | None:
    """init with one key gives the same state on every device; after learner_step on
    different data per device the actor parameters still agree."""
    _needs_devices(s)
    initial, state, _ = s.replicated_steps()
    first, *others = _device_slices(initial)
    for i, other in enumerate(others, 1):
        difference = _first_difference(other, first)
        if difference is not None:
            raise _Violation(
                f"init with the same key gave device {i} another state than device 0 "
                f"({difference}); Anakin and Sebulba initialise every device from one key",
                "make init a pure function of its key (no other randomness)")
    params = [s.agent.actor_params(x) for x in _device_slices(state)]
    for i, other in enumerate(params[1:], 1):
        difference = _first_difference(other, params[0], rtol=1e-6)
        if difference is not None:
            raise _Violation(
                f"after learner_step on different data per device, device {i}'s actor "
                f"parameters differ from device 0's ({difference})",
                f"average gradients over the device axis: jax.lax.pmean(grads, axis_name) in "
                f"learner_step (axis_name is {DEVICE_AXIS!r} under the runners)")
    if _first_difference(params[0], s.agent.actor_params(first)) is None:
        return (f"inconclusive: {MAX_LEARNER_STEPS} learner steps left the actor parameters "
                "unchanged (see updates_change_params)")
    return None


def rule_metrics_averaged(s: _Subject) -> str | None:
    """The metrics agree on every device: averaged over the device axis."""
    _needs_devices(s)
    initial, state, metrics = s.replicated_steps()
    slices = _device_slices(metrics)
    for name in slices[0]:
        values = [float(m[name]) for m in slices]
        if not np.allclose(values, values[0], rtol=1e-5, atol=1e-7, equal_nan=True):
            raise _Violation(
                f"metric {name!r} differs across devices ({values}): Sebulba logs one "
                "device's value, so it would log that device's, not the run's",
                "average metrics over the device axis: jax.lax.pmean(metrics, axis_name) "
                "when axis_name is not None")
    if _first_difference(s.agent.actor_params(_device_slices(state)[0]),
                         s.agent.actor_params(_device_slices(initial)[0])) is None:
        return "inconclusive: the learner steps did not update (see replication)"
    return None


def rule_set_hparams(s: _Subject) -> str | None:
    """Setting the `sweepable` values gives the state and the update of an agent built with
    those values; setting the old ones back gives the old state."""
    agent = s.agent
    if agent.set_hparams is None:
        raise _Skip("the agent has no set_hparams (it can be swept over seeds only)")
    if not agent.sweepable:
        return "set_hparams given but sweepable is empty: nothing to sweep"
    old = {n: float(s.config[n]) for n in agent.sweepable}
    new = {n: (v * 0.5 if v else 0.5) for n, v in old.items()}
    as_arrays = lambda values: {n: jnp.asarray(v, jnp.float32) for n, v in values.items()}
    set_hparams = jax.jit(agent.set_hparams)  # traced values, as the runners pass them
    for name in agent.sweepable:
        changed = set_hparams(s.state, as_arrays({name: new[name]}))
        if _first_difference(changed, s.state) is None:
            raise _Violation(f"set_hparams({{{name!r}: {new[name]}}}) left the learner state "
                             "unchanged", "store each sweepable value in the learner state "
                             "(e.g. optax.inject_hyperparams) and replace it there")
    with_new = set_hparams(s.state, as_arrays(new))
    config = ml_collections.ConfigDict(s.config.to_dict())
    for name, value in new.items():
        config[name] = type(s.config[name])(value) if isinstance(s.config[name], float) else value
    built = s.build(config)
    fresh = s.init(s.key, built)
    difference = _first_difference(with_new, fresh, rtol=1e-6)
    if difference is not None:
        raise _Violation(f"set_hparams({new}) gave another learner state than an agent built "
                         f"with those values ({difference})")
    back = set_hparams(with_new, as_arrays(old))
    difference = _first_difference(back, s.state)
    if difference is not None:
        raise _Violation(f"setting the old values back did not give the old state "
                         f"({difference})", "replace the values in place; keep nothing else")
    trajectory, key = s.trajectory, jax.random.fold_in(s.key, 5)
    ours = s.learner_step(with_new, trajectory, key)
    theirs = jax.jit(lambda st, t, k: built.learner_step(st, t, k, axis_name=None))(
        fresh, trajectory, key)
    difference = _first_difference(ours, theirs, rtol=1e-5)
    if difference is not None:
        raise _Violation(
            f"learner_step after set_hparams({new}) differs from the learner_step of an agent "
            f"built with those values ({difference}): a value is read from the config, not "
            "from the learner state", "read every sweepable value from the learner state "
            "only (never as a constant from the config)")
    return None


def rule_learner_state(s: _Subject) -> str | None:
    """init's learner state is a pytree of arrays (what a checkpoint holds and a compiled
    program returns), and init runs under jit."""
    agent = s.agent
    eager = agent.init(s.key, s.spec)
    for path, leaf in jax.tree_util.tree_flatten_with_path(eager)[0]:
        if not isinstance(leaf, (jax.Array, np.ndarray)):
            raise _Violation(
                f"learner state leaf {_path(path)} is a {type(leaf).__name__}, not an array: "
                "the runners compile init and checkpoint its state, which hold arrays only")
    difference = _layout_difference(eager, s.state)
    if difference is not None:
        raise _Violation(f"init gives another layout under jit ({difference})")
    return None


def rule_checkpoint(s: _Subject) -> str | None:
    """learner_step keeps the learner state's layout, and an orbax checkpoint of the state
    restores bit for bit into init's layout."""
    agent = s.agent
    after = jax.eval_shape(
        lambda st, t, k: agent.learner_step(st, t, k, axis_name=None)[0],
        s.state, jax.eval_shape(s.rollout, s.params, s.key), s.key)
    where = _layout_difference(s.state, after)
    if where is not None:
        raise _Violation(f"learner_step changed the learner state's layout ({where}): a "
                         "checkpoint is restored into init's layout, and the runners carry "
                         "the state through compiled loops",
                         "return a learner state of init's structure, shapes and dtypes")
    from podracer.checkpoint import Checkpointer  # orbax: imported only when checkpointing

    # As the runners save and resume: the state stacked over the devices, restored into the
    # layout init gives (shapes, dtypes and shardings, computed without running init).
    _, state, _ = s.replicated_steps()
    init = replication.replicate(lambda k: agent.init(k, s.spec), s.mesh)
    keys = jax.ShapeDtypeStruct((s.num_devices,) + s.key.shape, s.key.dtype,
                                sharding=replication.stacked_sharding(s.mesh))
    target = jax.eval_shape(init, keys)
    with tempfile.TemporaryDirectory() as directory:
        checkpointer = Checkpointer(os.path.join(directory, "checkpoints"))
        try:
            checkpointer.save(1, {"learner_state": state}, {"updates": 1})
            restored = checkpointer.restore(1, {"learner_state": target}).state
        except Exception as error:
            raise _Violation(f"an orbax checkpoint of the learner state did not save and "
                             f"restore ({type(error).__name__}: {_short(error)})",
                             "hold only arrays of standard dtypes in the learner state") from error
        finally:
            checkpointer.close()
    difference = _first_difference(restored["learner_state"], state)
    if difference is not None:
        raise _Violation(f"the learner state restored from a checkpoint differs from the one "
                         f"saved ({difference})",
                         "hold only arrays in the learner state, no data in its tree's "
                         "static (auxiliary) part")
    return None


def rule_anakin_chunk(s: _Subject) -> str | None:
    """One compiled, replicated Anakin chunk of `UPDATES_PER_CHUNK` updates runs, twice, with
    finite losses and parameters."""
    init, chunk = make_programs(s.agent, s.env, envs_per_device=ENVS_PER_DEVICE,
                                rollout_length=ROLLOUT_LENGTH,
                                updates_per_chunk=UPDATES_PER_CHUNK)
    init_fn = replication.replicate(init, s.mesh)
    chunk_fn = replication.replicate(chunk, s.mesh, donate_argnums=0)
    n = s.num_devices
    env_key, params_key = jax.random.split(s.key)
    state = init_fn(*replication.from_global(
        (np.asarray(jax.random.split(env_key, n)),
         np.broadcast_to(np.asarray(params_key), (n,) + params_key.shape)), s.mesh))
    for _ in range(2):
        state, metrics = chunk_fn(state)
        metrics = _device_slices(metrics)[0]
        first_bad = int(metrics.pop(FIRST_NONFINITE))
        if first_bad < UPDATES_PER_CHUNK:
            raise _Violation(f"update {first_bad + 1} of an Anakin chunk gave a loss or "
                             "parameters that are not finite",
                             "find the NaN/inf source in learner_step (podracer.faults)")
    return None


def rule_sebulba_update(s: _Subject) -> str | None:
    """Sebulba's own actor thread and learner loop make `SEBULBA_UPDATES` updates end to end."""
    try:
        from sebulba.actor import Actor, ActorCounters, make_actor_functions
        from sebulba.envs_jax_env import EnvsJaxEnv
        from sebulba.learner import (
            Learner,
            LearnerSchedule,
            Wiring,
            init_learner,
            make_local_actor_params,
            make_update,
        )
        from sebulba.params import ParamsStore
    except ImportError as error:
        raise _Skip(f"Sebulba cannot be imported here ({error})") from error
    agent, n = s.agent, s.num_devices
    learner_devices = list(s.mesh.devices.flat)
    actor_device = s.devices[-1]
    envs = ENVS_PER_DEVICE * n
    params_key, learner_key, actor_key, env_key = jax.random.split(s.key, 4)
    state, keys = init_learner(agent, s.spec, s.mesh, params_key, learner_key)
    update_fn = replication.replicate(make_update(agent), s.mesh, donate_argnums=(0, 1))
    local_actor_params = make_local_actor_params(agent)
    store = ParamsStore([actor_device], keep=3)
    store.publish(0, local_actor_params(state))
    act, pack = make_actor_functions(agent, len(learner_devices))
    rollouts: queue.Queue = queue.Queue(maxsize=2)
    counters = ActorCounters()
    # Sebulba's own `envs_jax:<name>` host environment: the check's environment, on the host.
    env = EnvsJaxEnv(s.env_name, envs, seed=int(jax.random.randint(env_key, (), 0, 2**31 - 1)))
    actor = Actor(agent=agent, env=env, act=act, pack=pack,
                  store=store, device_index=0, learner_devices=learner_devices, out=rollouts,
                  key=actor_key, rollout_length=ROLLOUT_LENGTH, policy_lag=1, timeout_s=300.0,
                  counters=counters)
    stop, failure = threading.Event(), []

    def run_actor():
        try:
            actor.run(stop)
        except BaseException as error:  # noqa: BLE001 - re-raised below, in the caller
            failure.append(error)
            stop.set()

    records: list[dict] = []
    learner = Learner(update_fn=update_fn, local_actor_params=local_actor_params, mesh=s.mesh,
                      schedule=LearnerSchedule(num_updates=SEBULBA_UPDATES,
                                               steps_per_update=ROLLOUT_LENGTH * envs,
                                               timeout_s=300.0, seed=0, log_every=1),
                      wiring=Wiring(queues=[rollouts], store=store, counters=counters),
                      log=records.append)
    thread = threading.Thread(target=run_actor, daemon=True, name="conformance-actor")
    thread.start()
    try:
        outcome = learner.run(stop, state, keys)
    finally:
        stop.set()
        thread.join(60)
        env.close()
    if failure:
        raise _Violation(f"Sebulba's actor failed ({type(failure[0]).__name__}: "
                         f"{_short(failure[0])})") from failure[0]
    if not outcome.completed or len(records) != SEBULBA_UPDATES:
        raise _Violation(f"Sebulba's learner stopped after {len(records)} of "
                         f"{SEBULBA_UPDATES} updates")
    return None


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    check: Callable[[_Subject], str | None]
    fix: str  # the usual fix, when the failure does not suggest a more precise one
    needs: tuple[str, ...] = ()  # rules it builds on: when one of them failed, it is skipped


RULES: tuple[Rule, ...] = (
    Rule("interface", rule_interface,
         "build the agent as podracer.agent.Agent(init=..., actor_step=..., learner_step=..., "
         "init_actor_state=..., actor_params=...) (docs/architecture.md)"),
    Rule("learner_state", rule_learner_state,
         "keep Python objects (networks, configs) in make_agent's closure, and numbers in the "
         "state as arrays (jnp.asarray)", ("interface",)),
    Rule("actions", rule_actions,
         "return (action int32 [B], actor_state, extras with [B] leading) from actor_step",
         ("learner_state",)),
    Rule("acting_view", rule_acting_view,
         "read only timestep.observation and timestep.step_type in actor_step; rewards and "
         "discounts reach the learner in the trajectory", ("learner_state",)),
    Rule("rollout_length", rule_rollout_length,
         "size what holds trajectories (a replay's period) by the runner's rollout_length: tie "
         "config.agent.rollout_length = config.get_ref('rollout_length') in experiment configs",
         ("actions",)),
    Rule("evaluation", rule_evaluation,
         "with evaluation=True act greedily (argmax), without sampling from the key",
         ("actions", "rollout_length")),
    Rule("metrics", rule_metrics, "return metrics as {name: scalar}", ("rollout_length",)),
    Rule("vmap", rule_vmap,
         "keep actor_step and learner_step pure functions of their arguments (no Python "
         "control flow on traced values, no host callbacks), so that jax.vmap maps them",
         ("rollout_length", "metrics")),
    Rule("updates_change_params", rule_updates_change_params,
         "apply the optimiser's update to the parameters learner_step returns; if the agent "
         "waits for a warm-up (no updates until a replay fills), hold it in a config field "
         f"named one of {', '.join(WARMUP_FIELDS)}, so that the check can lower it",
         ("rollout_length",)),
    Rule("replication", rule_replication,
         "average gradients over the device axis (jax.lax.pmean(grads, axis_name) when "
         "axis_name is not None)", ("rollout_length",)),
    Rule("metrics_averaged", rule_metrics_averaged,
         "average metrics over the device axis (jax.lax.pmean(metrics, axis_name) when "
         "axis_name is not None)", ("rollout_length", "metrics")),
    Rule("set_hparams", rule_set_hparams,
         "keep each sweepable value in the learner state, replace it there in set_hparams, and "
         "read it only from there", ("interface", "rollout_length")),
    Rule("checkpoint", rule_checkpoint,
         "return from learner_step a learner state of init's structure, shapes and dtypes, "
         "all arrays",
         ("rollout_length",)),
    Rule("anakin_chunk", rule_anakin_chunk,
         "make the agent's functions traceable inside lax.scan and shard_map (fixed shapes, "
         "no host calls)", ("actions", "rollout_length")),
    Rule("sebulba_update", rule_sebulba_update,
         "see the failure: Sebulba runs actor_step on the actor device and learner_step, "
         "replicated, on the learner devices", ("actions", "acting_view", "rollout_length")),
)
RULE_NAMES = tuple(rule.name for rule in RULES)


# ---------------------------------------------------------------------------------------------
# The check.


def check_agent(agent: str | Callable[[ml_collections.ConfigDict, Any], Agent], *,
                config: ml_collections.ConfigDict | None = None, env: str = "catch",
                num_devices: int | None = None, rules: Sequence[str] | None = None,
                seed: int = 0, raise_on_failure: bool = True) -> ConformanceReport:
    """Runs `agent` through the conformance rules (the module docstring lists them).

    `agent` is a registered agent's name (`config` defaults to its `default_config`) or a
    `make_agent(config, env_spec) -> podracer.Agent` callable (then `config` is required). `env`
    is an `envs_jax` environment name. `num_devices` defaults to two (or the one device there
    is: the replication rules are then skipped); `rules` picks rules by name (default: all).
    Returns the report; raises `ConformanceError` naming every failed rule, and its fix, unless
    `raise_on_failure=False`.
    """
    if isinstance(agent, str):
        name, make_agent = agent, agents.make
        if agent not in agents.registered():
            raise KeyError(f"Unknown agent {agent!r}. Registered agents: {agents.registered()}.")
        config = agents.default_config(agent) if config is None else config
        if config.get("name") != agent:
            raise ValueError(f"config.name is {config.get('name')!r}, not {agent!r}")
    elif callable(agent):
        if config is None:
            raise TypeError("check_agent(make_agent, config=...): a make_agent callable needs "
                            "the agent's config")
        name, make_agent = str(config.get("name", getattr(agent, "__name__", "agent"))), agent
    else:
        raise TypeError(f"check_agent takes an agent's name or its make_agent, got {agent!r}")
    unknown = sorted(set(rules or ()) - set(RULE_NAMES))
    if unknown:
        raise ValueError(f"Unknown rules {unknown}; the rules are {list(RULE_NAMES)}")
    config = ml_collections.ConfigDict(config.to_dict())
    changes = []
    if "rollout_length" in config:
        config.rollout_length = ROLLOUT_LENGTH  # as experiments tie it to the runner's T
        changes.append(f"agent.rollout_length = {ROLLOUT_LENGTH}, the check's T")
    lowered = {}
    for field in WARMUP_FIELDS:
        value = config.get(field)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > WARMUP:
            lowered[field] = (value, type(value)(WARMUP))
            config[field] = type(value)(WARMUP)
            changes.append(f"agent.{field} = {WARMUP} (was {value}), a warm-up the check's "
                           f"trajectories reach ({WARMUP} transitions per device each)")
    if lowered:
        for field in BATCH_FIELDS:
            value = config.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value > WARMUP:
                config[field] = WARMUP
                changes.append(f"agent.{field} = {WARMUP} (was {value}), no larger than the "
                               "lowered warm-up")
    available = jax.local_device_count()
    num_devices = min(2, available) if num_devices is None else num_devices
    if not 1 <= num_devices <= available:
        raise ValueError(f"num_devices={num_devices}, but {available} device(s) are present")
    subject = _Subject(name, make_agent, config, env, num_devices, seed, lowered)
    results, failed = [], set()
    for rule in RULES:
        if rules is not None and rule.name not in rules:
            continue
        broken = [name for name in rule.needs if name in failed]
        if broken:
            result = RuleResult(rule.name, "skip", f"not run: it builds on {broken[0]!r}, "
                                "which failed")
        else:
            result = _run(rule, subject)
        if result.status == "fail" or broken:
            failed.add(rule.name)  # so that its dependants are skipped too
        results.append(result)
    report = ConformanceReport(agent=name, env=env, num_devices=num_devices,
                               results=tuple(results), config_changes=tuple(changes))
    if raise_on_failure and not report.passed:
        raise ConformanceError(report)
    return report


def _run(rule: Rule, subject: _Subject) -> RuleResult:
    try:
        note = rule.check(subject)
    except _Skip as skip:
        return RuleResult(rule.name, "skip", str(skip))
    except _Violation as violation:
        return RuleResult(rule.name, "fail", violation.problem, violation.fix or rule.fix)
    except Exception as error:  # noqa: BLE001 - any other failure inside a rule breaks it
        return RuleResult(rule.name, "fail", f"{type(error).__name__}: {_short(error)}",
                          rule.fix)
    return RuleResult(rule.name, "pass", note or "")


def _short(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m experiments.conformance",
        description="Runs an agent through the rules Anakin and Sebulba rely on.")
    parser.add_argument("--agent", required=True,
                        help="a registered agent's name (built-in, or registered by a --module)")
    parser.add_argument("--module", action="append", default=[], metavar="PKG.MOD",
                        help="a module to import first, e.g. the one whose agents.register(...) "
                        "registers your agent (repeatable)")
    parser.add_argument("--env", default="catch", help="an envs_jax environment name")
    parser.add_argument("--num_devices", type=int, default=None)
    parser.add_argument("--rules", default="", help=f"comma-separated, of {', '.join(RULE_NAMES)}")
    args = parser.parse_args(argv)
    for module in args.module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            parser.error(f"--module={module}: cannot import it ({error}); name a module on the "
                         "Python path (run from your project's root, or set PYTHONPATH)")
    if args.agent not in agents.registered():
        parser.error(f"--agent={args.agent}: no agent of that name is registered (registered: "
                     f"{', '.join(agents.registered())}); to check your own agent, name the "
                     "module that registers it with --module=pkg.mod")
    rules = [r for r in args.rules.split(",") if r]
    unknown = [r for r in rules if r not in RULE_NAMES]
    if unknown:
        parser.error(f"--rules: no rule named {', '.join(unknown)} (the rules: "
                     f"{', '.join(RULE_NAMES)})")
    try:
        envs_jax.make(args.env)
    except KeyError as error:
        parser.error(f"--env={args.env}: {error.args[0]}")
    report = check_agent(args.agent, env=args.env, num_devices=args.num_devices,
                         rules=rules or None, raise_on_failure=False)
    print(report)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())

