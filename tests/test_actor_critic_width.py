"""The actor-critic MLP's width when `agent.hidden_sizes` is left to the observations."""

import jax
import numpy as np
import pytest

import agents
from podracer.config import ConfigError
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec

MINATAR = EnvSpec(observation=ArraySpec((10, 10, 4), np.float32), action=DiscreteSpec(5))
CARTPOLE = EnvSpec(observation=ArraySpec((4,), np.float32), action=DiscreteSpec(2))
CATCH = EnvSpec(observation=ArraySpec((10, 5), np.float32), action=DiscreteSpec(3))


def _kernel_shapes(config, spec):
    params = jax.eval_shape(lambda k: agents.make(config, spec).init(k, spec),
                            jax.random.PRNGKey(0)).params
    return sorted(tuple(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(params)
                  if "kernel" in str(path))


@pytest.mark.parametrize("spec, first, second", [
    (MINATAR, (400, 256), (256, 256)),  # a board read flattened: 2 x 256
    (CARTPOLE, (4, 64), (64, 64)),      # a vector: 2 x 64
    (CATCH, (50, 64), (64, 64)),        # a 2-D array, not an image: 2 x 64
])
def test_vtrace_default_width_follows_the_observations(spec, first, second):
    config = agents.default_config("vtrace")
    assert config.hidden_sizes is None
    shapes = _kernel_shapes(config, spec)
    assert first in shapes and second in shapes, shapes


def test_vtrace_hidden_sizes_set_by_hand_apply_to_boards_too():
    config = agents.default_config("vtrace")
    config.hidden_sizes = (32,)
    shapes = _kernel_shapes(config, MINATAR)
    assert (400, 32) in shapes and (400, 256) not in shapes, shapes


@pytest.mark.parametrize("bad", [(), (64, 0), (64.5,)])
def test_vtrace_bad_hidden_sizes_name_the_field(bad):
    config = agents.default_config("vtrace")
    config.hidden_sizes = bad
    with pytest.raises(ConfigError, match="agent.hidden_sizes"):
        agents.make(config, CARTPOLE)
