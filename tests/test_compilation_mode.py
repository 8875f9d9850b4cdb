"""The suite's compilation rule (tests/conftest.py): a test compiles without XLA's
optimisations, and with XLA:CPU's older fusion emitters, unless it is marked `optimised`; the
experiments it starts as subprocesses follow it through the environment."""

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


def _fusion_emitters_off() -> tuple[bool, bool]:
    """Whether this process's next compile asks XLA:CPU for its older fusion emitters (the
    options JAX builds for a compile, as jit's lowering asks for them), and whether a
    subprocess started now would (its XLA_FLAGS)."""
    from jax._src import compiler

    options = compiler.get_compile_options(num_replicas=1, num_partitions=1,
                                           env_options_overrides={})
    here = ("xla_cpu_use_fusion_emitters", False) in list(options.env_option_overrides)
    flags = os.environ.get("XLA_FLAGS", "").split()
    return here, "--xla_cpu_use_fusion_emitters=false" in flags


@pytest.mark.skipif(ALL_OPTIMISED, reason="PODRACER_TESTS_OPTIMISED=1 optimises every test")
def test_an_unmarked_test_and_its_subprocesses_compile_without_optimisations():
    assert jax.config.read("jax_disable_most_optimizations") is True
    assert _subprocess_setting() is True
    assert _fusion_emitters_off() == (True, True)


@pytest.mark.optimised
def test_a_marked_test_and_its_subprocesses_compile_with_them():
    assert jax.config.read("jax_disable_most_optimizations") is False
    assert _subprocess_setting() is False
    assert _fusion_emitters_off() == (False, False)
