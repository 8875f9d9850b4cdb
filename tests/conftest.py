"""Test setup: 8 simulated CPU devices, configured before JAX initialises; and helpers for the
tests that run experiments as real processes (import them: `from conftest import ...`)."""

import os

# Must happen before `jax` is imported anywhere: XLA reads the flag once, at backend start.
_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_experiment(command: list[str], *, cache: str, num_devices: int) -> subprocess.Popen:
    """`python <command>` from the repository root on `num_devices` simulated CPU devices,
    sharing the JAX compilation cache `cache` (so that only the first process compiles)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
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


def snapshot(directory: str) -> dict[str, tuple[int, int, str]]:
    """(size, mtime in ns, sha256) of every file under `directory`, by relative path: equal
    snapshots mean nothing was written, moved, appended to or removed."""
    import hashlib

    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            stat = os.stat(path)
            out[os.path.relpath(path, directory)] = (stat.st_size, stat.st_mtime_ns, digest)
    return out
