"""Every notebook in colab/ runs headless, top to bottom, with small settings.

Like papermill, a cell inserted after the one tagged "parameters" overrides its values; each
notebook lists its small settings in SMALL, so a new notebook fails here until it has them.
"""

import os

import nbformat
import pytest
from conftest import xla_flags
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLAB = os.path.join(ROOT, "colab")
NOTEBOOKS = sorted(name for name in os.listdir(COLAB) if name.endswith(".ipynb"))
SMALL = {
    "anakin_quickstart.ipynb": "TOTAL_ENV_STEPS = 12_800\nNUM_ENVS = 32\nUPDATES_PER_CHUNK = 5\n",
    "sebulba_quickstart.ipynb":
        "TOTAL_ENV_STEPS = 15_360\nENVS_PER_ACTOR_THREAD = 48\nLOG_EVERY_UPDATES = 5\n",
    "muzero_quickstart.ipynb": "TOTAL_ENV_STEPS = 3_200\nNUM_SIMULATIONS = 4\nUPDATES_PER_CHUNK = 5\n",
    "your_own_agent.ipynb": "TOTAL_ENV_STEPS = 12_800\nNUM_ENVS = 32\nUPDATES_PER_CHUNK = 5\n",
}


def _text(notebook):
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                parts.append(output["text"])
            elif "data" in output and "text/plain" in output["data"]:
                parts.append(output["data"]["text/plain"])
    return "".join(parts)


def _images(notebook):
    return [o for cell in notebook.cells for o in cell.get("outputs", [])
            if "image/png" in o.get("data", {})]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_headless(name, tmp_path, monkeypatch):
    assert name in SMALL, f"add small settings for {name} to SMALL"
    notebook = nbformat.read(os.path.join(COLAB, name), as_version=4)
    tagged = [i for i, c in enumerate(notebook.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "one cell must be tagged 'parameters'"
    workdir = str(tmp_path / "workdir")
    notebook.cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell(
        SMALL[name] + f"WORKDIR = {workdir!r}"))
    # The kernel inherits this environment: the checkout is importable, and one CPU device is
    # what a notebook sees on a CPU runtime (not the 8 simulated devices of the other tests).
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("XLA_FLAGS", xla_flags(1))
    # The notebook's own temporary directories (made before WORKDIR is overridden) go in the
    # test's, so that nothing is left behind.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    # Figures must come back as inline images whatever backend the calling environment (or an
    # earlier test) chose, as they do in Colab and Jupyter.
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": COLAB}})
    client.execute()

    text = _text(notebook)
    assert "backend: CPU" in text, text[-3000:]
    assert "environment steps per second" in text, text[-3000:]
    assert _images(notebook), "the learning curve was not drawn"
    assert os.path.exists(os.path.join(workdir, "metrics.jsonl"))
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(workdir))


def test_the_guides_agent_is_the_notebooks():
    """docs/extending.md shows the agent that colab/your_own_agent.ipynb defines and runs: the
    two copies are the same code, so the guide's is tested by the notebook's run."""
    import re

    with open(os.path.join(ROOT, "docs", "extending.md")) as f:
        guide = re.search(r"<!-- q_lambda:begin -->\n```python\n(.*?)```\n<!-- q_lambda:end -->",
                          f.read(), re.DOTALL)
    assert guide, "docs/extending.md lost its marked example"
    notebook = nbformat.read(os.path.join(COLAB, "your_own_agent.ipynb"), as_version=4)
    sources = [c.source.strip() for c in notebook.cells if c.cell_type == "code"]
    assert guide.group(1).strip() in sources
