"""The suite's compilation rule (tests/conftest.py): a test compiles without XLA's
optimisations unless it is marked `optimised`, and the experiments it starts as subprocesses
follow it through the environment."""

import os
import subprocess
import sys

import jax
import pytest

ALL_OPTIMISED = os.environ.get("PODRACER_TESTS_OPTIMISED") == "1"


def _subprocess_setting() -> bool:
    code = "import jax; print(jax.config.read('jax_disable_most_optimizations'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.strip() == "True"


@pytest.mark.skipif(ALL_OPTIMISED, reason="PODRACER_TESTS_OPTIMISED=1 optimises every test")
def test_an_unmarked_test_and_its_subprocesses_compile_without_optimisations():
    assert jax.config.read("jax_disable_most_optimizations") is True
    assert _subprocess_setting() is True


@pytest.mark.optimised
def test_a_marked_test_and_its_subprocesses_compile_with_them():
    assert jax.config.read("jax_disable_most_optimizations") is False
    assert _subprocess_setting() is False
