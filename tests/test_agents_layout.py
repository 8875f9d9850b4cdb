"""How the agents are split: the library modules (learning, search, targets, losses, ...) take
explicit arguments or a frozen typed config and never see the agent's `ConfigDict`, which only
the assembling modules (`agent.py`, the `make_network` builders, the registry) read; and the
agents import `podracer`, never a runner or the experiments, and `podracer` imports none of
them."""

import ast
import dataclasses
import pathlib

import pytest

from agents import efficientzero, muzero, ppo

AGENTS = pathlib.Path(__file__).resolve().parents[1] / "agents"
# Modules that read the agent's ConfigDict: the config, validation and assembly.
ASSEMBLY = {"__init__.py", "agent.py", "networks.py"}


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


LIBRARY = sorted(p for p in AGENTS.rglob("*.py") if p.name not in ASSEMBLY)


def test_there_are_library_modules_to_check():
    names = {str(p.relative_to(AGENTS)) for p in LIBRARY}
    assert {"vtrace/learning.py", "ppo/learning.py", "muzero/learning.py",
            "muzero/search.py", "efficientzero/learning.py", "efficientzero/search.py",
            "actor_critic.py", "hparams.py"} <= names


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(AGENTS)))
def test_library_modules_never_see_a_config_dict(path):
    assert not any(name.split(".")[0] == "ml_collections" for name in _imports(path))
    assert "ConfigDict" not in path.read_text()


@pytest.mark.parametrize("path", sorted(AGENTS.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(AGENTS)))
def test_agents_import_no_runner_nor_experiment(path):
    roots = {name.split(".")[0] for name in _imports(path)}
    assert not roots & {"anakin", "sebulba", "experiments"}, roots


@pytest.mark.parametrize("path", sorted((AGENTS.parent / "podracer").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(AGENTS.parent)))
def test_podracer_imports_no_agent_runner_nor_experiment(path):
    # Dependencies point one way: experiments -> anakin | sebulba -> agents -> podracer.
    roots = {name.split(".")[0] for name in _imports(path)}
    assert not roots & {"agents", "anakin", "sebulba", "experiments"}, roots


def test_typed_configs_are_built_from_the_config_and_frozen():
    config = efficientzero.default_config()
    # Values other than the defaults (5, "tree_min_max", "parent_mean", 16), so that a typed
    # config read from the defaults instead of `config` shows.
    config.rollout_length, config.td_steps, config.num_simulations = 7, 3, 9
    config.q_transform, config.unvisited_q = "parent_and_siblings", "min"
    learn = efficientzero.learn_config(config)
    assert learn.rollout_length == 7 and learn.muzero.td_steps == 3
    search = learn.muzero.reanalyse_search
    assert (search.q_transform, search.unvisited_q, search.num_simulations) == (
        "parent_and_siblings", "min", 9)
    for frozen in (learn, learn.muzero, muzero.search_config(config)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            frozen.batch_size = 1  # any field
    spec_free = ppo.LearnConfig(num_epochs=1, num_minibatches=1, off_policy="plain",
                                advantage_normalization="batch", unroll_updates=False,
                                continuous=False, observation_rank=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec_free.num_epochs = 2
