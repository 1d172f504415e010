"""The notebooks run top to bottom (nbclient, in a kernel of this interpreter) and are
stored without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert [p.name for p in NOTEBOOKS] == ["fleet_reliability.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path: Path, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    # the kernel's temporary files land here (it inherits the environment), so that what
    # the notebook leaves behind can be seen: it must remove what it wrote
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    # "python3" is ipykernel's own kernel: it starts with this interpreter (sys.executable)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, naming the cell, on the first error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert errors == []
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "SIMULATED" in text
    assert [p.name for p in temp.glob("fleetcare-notebook-*")] == []


def _exporter():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "notebooks" / "export_html.py"
    spec = importlib.util.spec_from_file_location("export_html", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_published_html_is_fresh() -> None:
    """docs/<notebook>.html (``make notebook-html``) records its notebook's source hash."""
    stale = _exporter().stale(NOTEBOOKS)
    assert not stale, "; ".join(stale)


def test_the_source_hash_ignores_outputs_and_sees_edits(tmp_path: Path) -> None:
    ex = _exporter()
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    a = tmp_path / "a.ipynb"
    nbformat.write(nb, a)
    before = ex.source_hash(a)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="x\n")]
    nb.cells[1].execution_count = 3
    nbformat.write(nb, a)
    assert ex.source_hash(a) == before
    nb.cells[1].source += "\n# an edit"
    nbformat.write(nb, a)
    assert ex.source_hash(a) != before
