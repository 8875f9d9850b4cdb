"""The pinned dependency set installs on the newer Pythons the project supports (3.12, 3.13).

Colab runs Python 3.12, CI and the development machines 3.11 (the whole suite has also been
run on 3.12.1 and 3.13.0: docs/benchmarks.md, "Test suite"). For each newer version, pip
resolves the pins of pyproject.toml (the main dependencies and the `test` extra) as it would
on that Python (`--python-version`), from binary wheels only: a pin without a wheel for it would
mean a source build on the user's runtime, which is what breaks. Nothing is installed
(`--dry-run`), with the venv's pip, the test extra's pin. This needs a package index: without
one the test fails and says so.

One exception: bsuite publishes only a source archive. It is pure Python (checked: the
installed copy was built as a `py3-none-any` wheel with no compiled files), so it builds
anywhere; its own dependencies are resolved as wheels in its place.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ("3.12", "3.13")  # Colab's Python, and the newest one supported
SUPPORTED = ("3.11",) + TARGETS
# Packages that publish no wheel, each pure Python: their dependencies stand in for them.
SDIST_ONLY = ("bsuite",)
# What pip prints when it cannot reach an index (urllib3's and pip's own wording).
NETWORK_ERRORS = ("NewConnectionError", "Failed to establish a new connection",
                  "Temporary failure in name resolution", "Name or service not known",
                  "Network is unreachable", "ConnectTimeout", "Read timed out",
                  "Could not fetch URL", "ProxyError")


def _project() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _pins() -> list[str]:
    project = _project()
    return list(project["dependencies"]) + list(project["optional-dependencies"]["test"])


def _stand_ins(requirement: Requirement, python_version: str) -> list[str]:
    """The run-time dependencies of an sdist-only package, read from its installed copy."""
    name = requirement.name
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"{name} is not installed here: install the test extra "
                    f"(pip install -e '.[test]') to run this test.")
    assert requirement.specifier.contains(dist.version), (
        f"installed {name} {dist.version} is not the pinned {requirement}")
    wheel = dist.read_text("WHEEL") or ""
    compiled = [str(f) for f in dist.files or () if str(f).endswith((".so", ".pyd", ".dylib"))]
    assert "Tag: py3-none-any" in wheel and not compiled, (
        f"{name} is no longer pure Python ({compiled or wheel!r}): it needs a wheel per Python")
    environment = {"extra": "", "python_version": python_version,
                   "python_full_version": f"{python_version}.0"}
    deps = [Requirement(r) for r in dist.requires or ()]
    return [str(d) for d in deps if d.marker is None or d.marker.evaluate(environment)]


def _requirements(python_version: str) -> list[str]:
    requirements = []
    for pin in _pins():
        requirement = Requirement(pin)
        if requirement.name in SDIST_ONLY:
            requirements += _stand_ins(requirement, python_version)
        else:
            requirements.append(pin)
    return requirements


def test_requires_python_admits_exactly_the_verified_versions():
    admitted = SpecifierSet(_project()["requires-python"])
    assert [v for v in SUPPORTED if admitted.contains(f"{v}.0")] == list(SUPPORTED)
    # A newer Python is admitted only once this file checks it.
    assert not admitted.contains("3.14.0") and not admitted.contains("3.10.0")


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory):
    """One pip dry-run per target Python, all started at once (each mostly waits on the
    index): {version: (pip's exit status, its output, the report's path)}."""
    started = {}
    for python_version in TARGETS:
        tmp_path = tmp_path_factory.mktemp(f"py{python_version}")
        report = tmp_path / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                   "--only-binary=:all:", "--python-version", python_version,
                   "--target", str(tmp_path / "target"), "--report", str(report),
                   "--disable-pip-version-check", "--no-input", "--retries", "2",
                   "--timeout", "60", *_requirements(python_version)]
        started[python_version] = (subprocess.Popen(command, stdout=subprocess.PIPE,
                                                    stderr=subprocess.STDOUT, text=True),
                                   report)
    finished = {}
    for python_version, (proc, report) in started.items():
        try:
            output, _ = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        finished[python_version] = (proc.returncode, output, report)
    return finished


@pytest.mark.parametrize("python_version", TARGETS)
def test_pinned_dependencies_have_wheels_for(python_version, resolutions):
    returncode, output, report = resolutions[python_version]
    # pip warns once per package about configured indexes it skips; keep the rest.
    output = "\n".join(line for line in output.splitlines() if "is ignored" not in line)
    if returncode != 0:
        if any(marker in output for marker in NETWORK_ERRORS):
            pytest.fail(f"pip could not reach a package index, which this test needs (it "
                        f"resolves the pins for Python {python_version}):\n{output[-3000:]}")
        pytest.fail(f"The pinned dependencies do not resolve with binary wheels for Python "
                    f"{python_version}; a pin in pyproject.toml needs changing:\n"
                    f"{output[-3000:]}")

    installs = {canonicalize_name(item["metadata"]["name"]): item for item in
                json.loads(report.read_text())["install"]}
    # The wheels are the target Python's (not the running one's), and the pins were honoured.
    tag = "cp" + python_version.replace(".", "")
    jaxlib = installs["jaxlib"]["download_info"]["url"].rsplit("/", 1)[-1]
    assert f"-{tag}-" in jaxlib, jaxlib
    for pin in _pins():
        requirement = Requirement(pin)
        if requirement.name in SDIST_ONLY:
            continue
        version = installs[canonicalize_name(requirement.name)]["metadata"]["version"]
        assert requirement.specifier.contains(version), (pin, version)
    for name, item in installs.items():
        assert item["download_info"]["url"].endswith(".whl"), (name, item["download_info"])
