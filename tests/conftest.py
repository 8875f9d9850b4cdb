"""Test setup: 8 simulated CPU devices, configured before JAX initialises; programs compiled
without XLA's optimisations unless a test is marked `optimised`; helpers for the tests that run
experiments as real processes; and `assert_trees_equal`, which compares run states exactly or,
across different compiled programs, to a stated tolerance (import them: `from conftest import
...`)."""

import os

# Must happen before `jax` is imported anywhere: XLA reads the flag once, at backend start.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# XLA's persistent compilation cache, one fresh directory per test run: made by the process
# that imports this first (pytest-xdist's controller), inherited through the environment by
# its workers and by the experiments that tests start as subprocesses, removed when it exits.
# Many tests compile programs another test (or the run before a resume) compiled already;
# loading the executable instead of compiling it again returns the same compiled program.
# Set JAX_COMPILATION_CACHE_DIR yourself to choose the directory (it is then kept), or to ""
# to compile everything afresh.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _CACHE = tempfile.mkdtemp(prefix="podracer-tests-xla-cache-")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import contextlib
import glob
import json
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podracer import machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Comparing states: exactly within one compiled program, to a tolerance across programs.


def _host_leaves(tree) -> tuple[Any, dict[str, np.ndarray]]:
    """The tree's structure and its leaves on the host, by path (typed keys as their bits)."""
    def host(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(jax.device_get(x))

    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return treedef, {jax.tree_util.keystr(path) or "<root>": host(x) for path, x in flat}


def _is_float(array: np.ndarray) -> bool:
    return bool(jnp.issubdtype(array.dtype, jnp.inexact))


def relative_differences(actual, expected) -> dict[str, float]:
    """Per floating-point leaf, its largest difference divided by the expected leaf's largest
    magnitude: what `assert_trees_equal(..., float_rtol=...)` bounds."""
    _, actual_leaves = _host_leaves(actual)
    _, expected_leaves = _host_leaves(expected)
    out = {}
    for name, e in expected_leaves.items():
        if _is_float(e):
            diff = float(np.max(np.abs(actual_leaves[name].astype(np.float64) - e), initial=0))
            scale = float(np.max(np.abs(e.astype(np.float64)), initial=0))
            out[name] = diff / scale if scale else (0.0 if diff == 0 else float("inf"))
    return out


def assert_trees_equal(actual, expected, *, float_rtol: float = 0.0) -> None:
    """Compares two pytrees leaf by leaf: the same structure, and per leaf the same dtype and
    shape.

    Integer, boolean and PRNG-key leaves must be equal exactly, always. Floating-point leaves
    must be equal exactly too when `float_rtol` is 0: use that when both sides come from the
    same compiled program (XLA is deterministic for one program, backend and machine).
    Between different programs that do the same maths (a run inside a vmapped sweep and the
    same run alone, say) XLA may order a float reduction differently: pass a `float_rtol`
    derived for the comparison, and each floating-point leaf's largest difference may then be
    at most `float_rtol` times the expected leaf's largest finite magnitude (a leaf of zeros
    must stay zeros), with NaNs and infinities in the same places.
    """
    treedef_a, actual_leaves = _host_leaves(actual)
    treedef_e, expected_leaves = _host_leaves(expected)
    assert treedef_a == treedef_e, f"different structures:\n{treedef_a}\n{treedef_e}"
    for name, e in expected_leaves.items():
        a = actual_leaves[name]
        assert a.dtype == e.dtype, f"{name}: dtype {a.dtype}, expected {e.dtype}"
        assert a.shape == e.shape, f"{name}: shape {a.shape}, expected {e.shape}"
        if not _is_float(e) or float_rtol == 0:
            np.testing.assert_array_equal(a, e, err_msg=name)
            continue
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
        finite = np.isfinite(e64)
        np.testing.assert_array_equal(a64[~finite], e64[~finite], err_msg=f"{name} (NaN, inf)")
        diff = np.abs(a64[finite] - e64[finite])  # inf or NaN where `a` is not finite: fails
        scale = float(np.max(np.abs(e64[finite]), initial=0))
        largest = float(np.max(diff, initial=0))
        assert not np.isnan(diff).any() and largest <= float_rtol * scale, (
            f"{name}: largest difference {largest:.3g} is more than {float_rtol:g} x the leaf's "
            f"largest magnitude {scale:.3g}")


# ---------------------------------------------------------------------------------------------
# Compiling for what a test checks.
#
# Most tests compile far more than they run: a few steps of a learner or a search, to check a
# value, a shape or a verdict. They compile without XLA's optimisations (the same maths,
# slower programs), which takes about 30% less time for such tests. A test whose programs run
# long, as most learning tests' do, or which times or counts compiled programs, is marked
# `@pytest.mark.optimised` (a whole module with `pytestmark = pytest.mark.optimised`) and
# compiles as a researcher's run does. Module fixtures follow their module's mark, and the
# experiments a test starts as subprocesses follow the test's (through the environment).
# PODRACER_TESTS_OPTIMISED=1 compiles every test with the optimisations.
#
# Without the optimisations, XLA:CPU's fusion emitters (its MLIR code generation, the default)
# still take much of a small program's compile; its older emitters compile the same HLO about
# a quarter faster. So an unmarked test's programs also compile with
# `xla_cpu_use_fusion_emitters=false`: in this process as a per-compile option (XLA_FLAGS is
# read once, when the backend starts), in its subprocesses through XLA_FLAGS. Marked tests
# compile exactly as a researcher's run does, with neither change.

OPTIMISED = "optimised"
_ALL_OPTIMISED = os.environ.get("PODRACER_TESTS_OPTIMISED") == "1"
_JAX_VARIABLE = "JAX_DISABLE_MOST_OPTIMIZATIONS"
FAST_COMPILE_OPTION = ("xla_cpu_use_fusion_emitters", False)
FAST_COMPILE_XLA_FLAG = "--xla_cpu_use_fusion_emitters=false"


def _install_fast_compile_option() -> None:
    """Makes every compile without optimisations in this process use FAST_COMPILE_OPTION.

    JAX has no public per-process setting for an XLA option once the backend has started, so
    this wraps the function that builds each compile's options (`jax._src.compiler`, as pinned;
    a JAX whose function no longer takes `env_options_overrides` fails every compile loudly).
    The option is part of the compile options, so the persistent cache keys on it."""
    from jax._src import compiler

    build = compiler.get_compile_options

    def get_compile_options(*args, **kwargs):
        if jax.config.read("jax_disable_most_optimizations"):
            overrides = dict(kwargs.get("env_options_overrides") or {})
            overrides.setdefault(*FAST_COMPILE_OPTION)
            kwargs["env_options_overrides"] = overrides
        return build(*args, **kwargs)

    compiler.get_compile_options = get_compile_options


_install_fast_compile_option()


@contextlib.contextmanager
def _optimisations(node):
    on = _ALL_OPTIMISED or node.get_closest_marker(OPTIMISED) is not None
    previous, previous_variable = (jax.config.read("jax_disable_most_optimizations"),
                                   os.environ.get(_JAX_VARIABLE))
    previous_flags = os.environ.get("XLA_FLAGS", "")
    jax.config.update("jax_disable_most_optimizations", not on)
    os.environ[_JAX_VARIABLE] = "0" if on else "1"
    kept = [f for f in previous_flags.split() if f != FAST_COMPILE_XLA_FLAG]
    os.environ["XLA_FLAGS"] = " ".join(kept if on else [*kept, FAST_COMPILE_XLA_FLAG])
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", previous)
        if previous_variable is None:
            os.environ.pop(_JAX_VARIABLE, None)
        else:
            os.environ[_JAX_VARIABLE] = previous_variable
        os.environ["XLA_FLAGS"] = previous_flags


@pytest.fixture(scope="module", autouse=True)
def _module_compilation(request):
    with _optimisations(request.node):
        yield


@pytest.fixture(autouse=True)
def _test_compilation(request):
    with _optimisations(request.node):
        yield


# ---------------------------------------------------------------------------------------------
# Experiments as real processes.


def xla_flags(num_devices: int) -> str:
    """This process's XLA_FLAGS with the simulated device count set to `num_devices`, for a
    subprocess: other flags (e.g. `--xla_cpu_max_isa=AVX2`, to emulate another CPU's code
    generation) reach the experiments that tests start too."""
    kept = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
            if not flag.startswith("--xla_force_host_platform_device_count=")]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={num_devices}"])


def start_experiment(command: list[str], *, cache: str, num_devices: int) -> subprocess.Popen:
    """`python <command>` from the repository root on `num_devices` simulated CPU devices,
    sharing the JAX compilation cache `cache` (so that only the first process compiles)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags(num_devices)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_COMPILATION_CACHE_DIR"] = cache
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return subprocess.Popen([sys.executable, *command], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def checkpoint_steps(workdir: str) -> list[int]:
    """The complete checkpoint steps in `<workdir>/checkpoints`, oldest first."""
    directory = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def wait_until(proc: subprocess.Popen, condition, what: str, timeout: float = 240) -> None:
    """Polls `condition()` until it holds; fails if `proc` ends first or after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.communicate()}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


def snapshot(directory: str) -> dict[str, tuple[int, int, str] | str]:
    """(size, mtime in ns, sha256) of every file under `directory`, by relative path, and
    "dir" for every directory below it (its path ending in "/"): equal snapshots mean nothing
    was written, moved, appended to or removed, empty directories included."""
    import hashlib

    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), directory) + "/"] = "dir"
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            stat = os.stat(path)
            out[os.path.relpath(path, directory)] = (stat.st_size, stat.st_mtime_ns, digest)
    return out


def assert_a_refused_run_leaves_no_trace(train, tmp_path, error: type[Exception],
                                         match: str) -> str:
    """`train(workdir)` raises `error` (matching `match`) on a workdir it must make, which is
    then gone, and on an existing one holding a file, which it leaves exactly as it was;
    returns that existing workdir."""
    fresh = str(tmp_path / "fresh")
    with pytest.raises(error, match=match):
        train(fresh)
    assert not os.path.exists(fresh)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    before = snapshot(str(kept))
    with pytest.raises(error, match=match):
        train(str(kept))
    assert snapshot(str(kept)) == before
    return str(kept)


def fail_if_anakin_builds_programs(monkeypatch) -> None:
    """Makes Anakin building its replicated programs, the first step towards compiling
    them, fail the test: for checks that must come before. The runner's cache of programs is
    emptied, so that a program an earlier test built is built again through the guard."""
    from anakin import runner
    from podracer import replication

    monkeypatch.setattr(runner, "_PROGRAMS", {})
    monkeypatch.setattr(replication, "replicate",
                        lambda *a, **k: pytest.fail("compiled before validating"))


def two_hot_logits(weights: dict, batch: int):
    """[batch, 21] logits on the support [-10, 10] with `weights` {bin index: mass}."""
    probs = np.zeros(21)
    for index, mass in weights.items():
        probs[index] = mass
    return jnp.broadcast_to(jnp.log(jnp.asarray(probs, jnp.float32) + 1e-30), (batch, 21))


# Hand-worked two-hot masses on [-10, 10]: h(3) = 1.003 puts 0.997 on bin +1 and 0.003 on +2
# (indices 11, 12); h(0.2) = 0.0956451 puts 0.904355 on bin 0 and 0.0956451 on +1.
THREE = {11: 0.997, 12: 0.003}
POINT_TWO = {10: 0.904355, 11: 0.0956451}


class KnownModel:
    """A stand-in MuZero model with outputs worked by hand, for 3 actions: h(o) = o; g(s, a)
    = (reward 3, s + a) and f(s) = (prior logits [s0, 2 s0, -s0], value 0.2), as two-hot
    logits on the support [-10, 10]; the terminal head's logit is s0."""

    num_actions = 3

    def __init__(self, terminal_head):
        self.terminal_head = terminal_head

    def apply(self, params, x, *args, method):
        del params
        batch = x.shape[0]
        if method == "represent":
            return x
        if method == "dynamics":
            return two_hot_logits(THREE, batch), x + args[0][:, None]
        if method == "predict":
            prior = jnp.stack([x[:, 0], 2 * x[:, 0], -x[:, 0]], axis=-1)
            return prior, two_hot_logits(POINT_TWO, batch)
        assert method == "terminal_logit", method
        return x[:, 0]


def spy_on_keywords(monkeypatch, module, name: str) -> list[dict]:
    """Replaces `module.<name>` (for the test) by a wrapper that records the keyword arguments
    of each call, then calls the original; returns the list it appends them to."""
    seen, original = [], getattr(module, name)

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


def strip_agent_field(workdir: str, field: str) -> None:
    """Makes `workdir` look made by code that predates the agent config field `field`."""
    paths = glob.glob(os.path.join(workdir, "checkpoints", "*", "meta", "metadata"))
    assert paths
    for path in paths:
        with open(path) as f:
            metadata = json.load(f)
        del metadata["config"]["agent"][field]
        with open(path, "w") as f:
            json.dump(metadata, f)
    with open(os.path.join(workdir, "config.json")) as f:
        config = json.load(f)
    del config["agent"][field]
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(config, f)


def flat_arrays(tree, prefix: str = "") -> dict:
    """The numpy leaves of nested dicts, lists and tuples (as `load_arrays` returns them), by
    their path of keys and indices joined with "/"."""
    import numpy as np

    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {prefix.rstrip("/"): np.asarray(tree)}
    out = {}
    for key, value in items:
        out.update(flat_arrays(value, f"{prefix}{key}/"))
    return out


def garble_arrays(step_dir: str) -> None:
    """Damages a checkpoint step's array files in place (every byte flipped), as a bad disk
    would: the step still lists, but its arrays no longer read back as saved."""

    files = [f for f in glob.glob(os.path.join(step_dir, "state", "**", "*"), recursive=True)
             if os.path.isfile(f) and os.sep + "d" + os.sep in f]
    assert files
    for path in files:
        with open(path, "r+b") as f:
            data = f.read()
            f.seek(0)
            f.write(bytes(b ^ 0xA5 for b in data))


def step_sizes_under_a_constant_gradient(optimizer, updates: int) -> list[float]:
    """The size of each of `updates` steps that `optimizer` takes on a scalar whose gradient is
    always 1. Adam's bias-corrected step is then exactly 1 before any schedule (with
    `adam_eps` 0), so each size is the step size the schedule sets at that update."""
    import optax

    params = jnp.zeros(())
    state = optimizer.init(params)
    sizes = []
    for _ in range(updates):
        step, state = optimizer.update(jnp.ones(()), state, params)
        params = optax.apply_updates(params, step)
        sizes.append(float(-step))
    return sizes


# ---------------------------------------------------------------------------------------------
# pytest-xdist: how many workers `-n auto` (pyproject's addopts) starts.



def kernel_shapes(config, spec) -> list[tuple[int, ...]]:
    """The sorted shapes of the Dense kernels in the parameters `agents.make(config, spec)`
    initialises for `spec` (from shapes alone: nothing is computed)."""
    import agents

    params = jax.eval_shape(lambda k: agents.make(config, spec).init(k, spec),
                            jax.random.PRNGKey(0)).params
    return sorted(tuple(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(params)
                  if "kernel" in str(path))


def set_fields(config, overrides: dict) -> None:
    """Sets dotted fields of a `ConfigDict`: `{"agent.learning_rate": 3e-4}`."""
    for field, value in overrides.items():
        node = config
        *parents, leaf = field.split(".")
        for parent in parents:
            node = node[parent]
        node[leaf] = value


SMALL_CATCH_UPDATES_PER_CHUNK = 5
SMALL_CATCH_STEPS_PER_CHUNK = 16 * 10 * SMALL_CATCH_UPDATES_PER_CHUNK


def small_catch_config(**overrides):
    """V-trace on Catch in the shape of the Anakin tests' small runs (2 devices, 16 envs, T=10,
    5 updates per chunk, 4 chunks, a checkpoint every 2), so that compiled programs are reused;
    `overrides` set dotted fields, e.g. `**{"agent.learning_rate": 3e-4}`."""
    from experiments.configs import vtrace_catch

    config = vtrace_catch.get_config()
    config.num_devices = 2
    config.num_envs = 16
    config.rollout_length = 10
    config.updates_per_chunk = SMALL_CATCH_UPDATES_PER_CHUNK
    config.total_env_steps = 4 * SMALL_CATCH_STEPS_PER_CHUNK
    config.checkpoint_every_updates = 2 * SMALL_CATCH_UPDATES_PER_CHUNK
    config.eval_every_updates = 0
    set_fields(config, overrides)
    return config


TINY_SEBULBA_ENVS, TINY_SEBULBA_T = 8, 8  # one actor thread's environments and T


def tiny_sebulba_muzero_config(**overrides):
    """`muzero_cartpole.py` shrunk for Sebulba tests: `TINY_SEBULBA_ENVS` environments on one
    actor thread, T = `TINY_SEBULBA_T`, a 60 s peer timeout, PUCT with 2 simulations, a
    16-wide model with K = 1, n = 2 and a 3-point support, and a replay of 128 positions that
    learns from the first update; `overrides` set dotted fields."""
    from experiments.configs import muzero_cartpole

    config = muzero_cartpole.get_config()
    config.envs_per_actor_thread = TINY_SEBULBA_ENVS
    config.rollout_length = TINY_SEBULBA_T
    config.timeout_s = 60.0
    agent = config.agent
    agent.search = "muzero"  # compiles faster than Gumbel search
    agent.num_simulations = 2
    agent.unroll_steps = 1
    agent.td_steps = 2
    agent.support_size = 3
    agent.hidden_sizes = (16,)
    agent.latent_size = 16
    agent.batch_size = 8
    agent.replay_capacity = 128
    agent.min_replay_items = 8  # learns from the first update on
    agent.updates_per_step = 1
    set_fields(config, overrides)
    return config

@pytest.fixture(scope="session", autouse=True)
def _backends_started_before_any_test():
    """JAX's backends start before the first test, so that every test process keeps XLA:CPU's
    own pool whichever test comes first (a config's `cpu_worker_threads` sizes the pool only of
    a process whose backends have not started; `podracer.machine`). Experiments that tests start
    as subprocesses size theirs as their configs ask."""
    jax.devices()


def pytest_xdist_auto_num_workers(config) -> int:
    """One worker per core, at most 4 and at most one per 6 GiB of memory (a worker with 8
    simulated devices peaks near 5 GiB). Much of a test's time is XLA compiling on one core,
    so two workers on a 2-core machine keep both cores busy (measured: 137% -> 183% CPU, the
    suite 35.5 -> 22.6 min on a slow 2-core machine)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        memory_gib = 24.0
    return max(1, min(cores or 1, 4, int(memory_gib // 6)))


def pytest_report_header(config) -> list[str]:
    """The CPU and core count at the top of every run's log: a failure that shows on one
    vendor's CPU and not another's can then be told apart from the log alone."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [f"cpu: {machine.cpu_model()}, {cores} cores"]


def pytest_terminal_summary(terminalreporter) -> None:
    """The same line at the end, where `-q` runs (CI's) show it too, beside the counts."""
    terminalreporter.write_line(pytest_report_header(terminalreporter.config)[0])
