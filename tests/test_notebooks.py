"""The chapters themselves: every code cell executed in order, the book's table of contents complete."""

from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))


def test_there_are_chapters():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_code_cell_executed_in_order(path):
    nb = nbformat.read(path, as_version=4)
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    unrun = [i for i, c in code if c.execution_count is None]
    assert not unrun, f"{path.name}: cells {unrun} were never executed (run `make execute`); nbval would skip them"
    counts = [c.execution_count for _, c in code]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: not run top to bottom in a fresh kernel: {counts}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_errors_only_in_tagged_cells(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tagged = "raises-exception" in cell.metadata.get("tags", [])
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert bool(errors) == tagged, f"{path.name} cell {i}: raises={bool(errors)} but tagged={tagged}"


def test_toc_lists_every_chapter():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = {c["file"] for part in toc["parts"] for c in part["chapters"]}
    chapters = {f"chapters/{p.stem}" for p in NOTEBOOKS}
    assert chapters <= files, f"chapters missing from _toc.yml: {sorted(chapters - files)}"
    for f in files:
        assert any((ROOT / f).with_suffix(s).exists() for s in (".ipynb", ".md")), f"_toc.yml names a missing file: {f}"
