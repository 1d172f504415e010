"""Export each notebook, executed, to ``docs/<name>.html`` (``make notebook-html``).

The notebooks are stored without outputs (``tests/test_notebooks.py``); their outputs are
published as HTML so a reader sees the plots without running anything. Each export
records the SHA-256 of its notebook's source (cell types and sources only, so outputs and
execution counts do not matter) in ``<meta name="fleetcare-notebook-source-sha256">``;
``tests/test_notebooks.py`` checks it against the notebook, so a changed notebook with a
stale export fails the suite, naming the command that refreshes it.

    python notebooks/export_html.py            # every notebooks/*.ipynb
    python notebooks/export_html.py --check    # exit 1 if an export is stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
DOCS = ROOT / "docs"
META = "fleetcare-notebook-source-sha256"
_META_RE = re.compile(rf'<meta name="{META}" content="([0-9a-f]{{64}})">')


def source_hash(path: Path) -> str:
    """SHA-256 over the notebook's cells (type and source), independent of outputs."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = [[c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list)
              else c["source"]] for c in nb["cells"]]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode()).hexdigest()


def export_path(path: Path) -> Path:
    return DOCS / f"{path.stem}.html"


def recorded_hash(html_path: Path) -> str | None:
    """The source hash an export records, or None (no export, or none recorded)."""
    if not html_path.exists():
        return None
    m = _META_RE.search(html_path.read_text(encoding="utf-8"))
    return m.group(1) if m else None


def export(path: Path, *, timeout: int = 600) -> Path:
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:  # the notebook writes only where it runs
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": tmp}}).execute()
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    tag = f'<meta name="{META}" content="{source_hash(path)}">'
    body = body.replace("<head>", f"<head>\n{tag}", 1)
    if tag not in body:
        raise RuntimeError(f"nbconvert's HTML for {path.name} has no <head>: cannot record "
                           "the source hash")
    out = export_path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body, encoding="utf-8")
    return out


def stale(paths: list[Path]) -> list[str]:
    """One line per notebook whose export is missing or older than its source."""
    return [f"{export_path(p).relative_to(ROOT)} is stale: {p.relative_to(ROOT)} changed "
            "since it was exported; run `make notebook-html` and commit the result"
            for p in paths if recorded_hash(export_path(p)) != source_hash(p)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only check that exports are fresh")
    args = ap.parse_args(argv)
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if args.check:
        lines = stale(paths)
        for line in lines:
            print(line, file=sys.stderr)
        return 1 if lines else 0
    for p in paths:
        print(f"exported {export(p).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
