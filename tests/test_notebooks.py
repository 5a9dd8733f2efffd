"""The walkthrough notebooks run top to bottom on the tiny preset.

A notebook's own checks are ``assert`` cells (``validate.ipynb`` asserts its verdicts): a
failed one stops the execution with a CellExecutionError, which fails the test."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # the long suite: python -m pytest -m slow (.ci/run runs it)

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_every_notebook_is_collected():
    assert {"quickstart.ipynb", "validate.ipynb"} <= {p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("DPAUDIT_NOTEBOOK_PRESET", "tiny")
    # one torch thread in the kernel, as the other tests use: the tiny models gain nothing from
    # more, and on a shared machine spinning threads make training several times slower
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
