"""What a reader sees on the rendered pages: the stored outputs the tests checked, short error
messages, answers folded away with their solutions, nothing wider than the page."""

import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
PAGES = sorted(ROOT.glob("*.md"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")
WIDTH = 88  # columns of code and of printed output


def _cells(path):
    return nbformat.read(path, as_version=4).cells


def _text(output) -> str:
    """What an output prints: a stream's text, or a result's plain-text form."""
    if output.get("output_type") == "stream":
        return output.get("text", "")
    return str(output.get("data", {}).get("text/plain", ""))


def test_the_book_renders_the_stored_outputs():
    """Re-executing at build time would show a fresh run that no test ever saw."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["execute"]["execute_notebooks"] == "off"


XMODE = "%xmode Minimal"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_tracebacks_are_turned_down_in_a_hidden_cell_before_any_error(path):
    cells = _cells(path)
    index = next((i for i, c in enumerate(cells) if c.cell_type == "code"
                  and XMODE in c.source.splitlines()), None)
    assert index is not None, f"{path.name}: no hidden `{XMODE}` cell"
    assert "remove-cell" in cells[index].metadata.get("tags", []), path.name
    errors = [i for i, c in enumerate(cells) if c.cell_type == "code"
              and "raises-exception" in c.metadata.get("tags", [])]
    assert all(index < i for i in errors), f"{path.name}: error cells {errors} come first"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_error_demonstrations_show_type_and_message_only(path):
    for i, cell in enumerate(_cells(path)):
        for out in cell.get("outputs", []):
            if out.get("output_type") != "error":
                continue
            lines = ANSI.sub("", "\n".join(out.traceback)).strip().splitlines()
            assert lines[0].startswith(f"{out.ename}: "), f"{path.name} cell {i}: {lines[0]}"
            assert len(lines) <= 3, f"{path.name} cell {i}: a traceback of {len(lines)} lines"


LOCAL = re.compile(r"\.venv|site-packages|/work/|/home/|/tmp/|/root/|File \"")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_show_no_local_paths(path):
    for i, cell in enumerate(_cells(path)):
        for out in cell.get("outputs", []):
            text = _text(out) + ANSI.sub("", "\n".join(out.get("traceback", [])))
            found = LOCAL.search(text)
            assert not found, f"{path.name} cell {i}: {found.group()!r} in {text[:200]!r}"


def _exercise_cells(path):
    """Code cells of the section that starts with '## Exercises' (up to the next section)."""
    inside = False
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type == "markdown":
            if re.search(r"^## ", cell.source, re.M):
                inside = bool(re.search(r"^## Exercises", cell.source, re.M))
        elif inside:
            yield i, cell


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_solutions_fold_away_with_their_outputs(path):
    """A solution cell shows neither code nor answer until the reader opens it."""
    for i, cell in _exercise_cells(path):
        tags = set(cell.metadata.get("tags", []))
        assert tags & {"hide-cell", "remove-cell"}, f"{path.name} cell {i}: tags {tags}"


def test_the_solution_check_sees_an_open_answer(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## Exercises\n\n1. Add."),
                nbformat.v4.new_code_cell("print(1 + 1)", metadata={"tags": ["hide-input"]}),
                nbformat.v4.new_markdown_cell("## Summary")]
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    assert [i for i, _ in _exercise_cells(path)] == [1]
    with pytest.raises(AssertionError, match="hide-input"):
        test_solutions_fold_away_with_their_outputs(path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_printed_lines_fit_the_page(path):
    wide = [(i, len(line)) for i, cell in enumerate(_cells(path)) if cell.cell_type == "code"
            for out in cell.outputs for line in _text(out).splitlines() if len(line) > WIDTH]
    assert not wide, f"{path.name}: (cell, width) of printed lines over {WIDTH} columns: {wide}"


@pytest.mark.parametrize("path", NOTEBOOKS + PAGES, ids=lambda p: p.name)
def test_headings_name_ideas(path):
    """A heading names what a section explains; "Figure: ..." clutters the page contents."""
    text = (path.read_text() if path.suffix == ".md" else
            "\n".join(c.source for c in _cells(path) if c.cell_type == "markdown"))
    bad = [line for line in text.splitlines() if re.match(r"#+ +(Figure|Fig\.)", line)]
    assert not bad, f"{path.name}: {bad}"


# The page layout (measured in headless Chromium, 1280 x 800, sphinx-book-theme 1.x): the
# primary sidebar takes 20% of the window, the page-contents sidebar the width set in
# _static/tlm.css, the article pads a code block by 68 pixels and the block pads its text by
# 32; DejaVu Sans Mono is 0.602 em wide. With the theme's defaults (17rem, 14px) this gives the
# 77 columns seen in the browser, with the book's CSS 91.
WINDOW, PRIMARY, ARTICLE_PAD, PRE_PAD, MONO_EM = 1280, 0.20, 68, 32, 0.602


def columns_at(window: int, secondary_rem: float, font_px: float) -> int:
    text_width = window * (1 - PRIMARY) - 16 * secondary_rem - ARTICLE_PAD - PRE_PAD
    return int(text_width / (MONO_EM * font_px))


def test_the_column_model_reproduces_the_measurements():
    assert columns_at(WINDOW, 17, 14) == 77  # the theme's defaults, measured: 77
    assert columns_at(WINDOW, 13, 13) == 91  # the book's CSS, measured: 91


def test_88_columns_fit_the_page_in_a_1280_pixel_window():
    css = (ROOT / "_static" / "tlm.css").read_text()
    secondary = float(re.search(r"--pst-sidebar-secondary:\s*([\d.]+)rem", css).group(1))
    font = float(re.search(r"\.bd-article pre\s*{[^}]*font-size:\s*([\d.]+)px", css).group(1))
    assert columns_at(WINDOW, secondary, font) >= WIDTH
    # error messages may be longer than a line: they wrap instead of scrolling
    assert re.search(r"div\.output\.traceback pre\s*{[^}]*white-space:\s*pre-wrap", css)


def test_the_conventions_ledger_names_tests_that_exist():
    """Each row of the ledger is pinned by tests; the names it gives must be real tests."""
    ledger = (ROOT / "conventions.md").read_text()
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", ledger)
    loose = re.findall(r"(?<![:\w])`(test_\w+)`", ledger)  # a second test of the same file
    assert len(named) >= 20
    sources = {p.name: p.read_text() for p in (ROOT / "tests").glob("test_*.py")}
    for file, test in named:
        assert f"def {test}(" in sources.get(file, ""), f"{file}::{test} does not exist"
    for test in loose:
        assert any(f"def {test}(" in text for text in sources.values()), test


def _check_pages():
    """tools/check_pages.py, which needs playwright only to run (not in .venv)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_pages", ROOT / "tools" / "check_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_chinese_search_check_asks_for_title_words_and_unspaced_queries():
    """The page check of the Chinese book searches for the words a reader found nothing for
    (运行时, the first word of a title; KV缓存 and 恢复训练, typed without a space), each on
    the page it must find, and fails where that page is not among the results."""
    check = _check_pages()
    assert check.SEARCHES["运行时"] == "chapters/29_runtime.html"
    assert check.SEARCHES["KV缓存"] == "chapters/16_generation.html"
    assert check.SEARCHES["恢复训练"] == "chapters/28_runs.html"
    for page in check.SEARCHES.values():
        assert (ROOT / page).with_suffix(".ipynb").exists(), page
    hits = ["chapters/16_generation.html?highlight=kv#the-cache", "chapters/20_performance.html"]
    assert check.search_found("KV缓存", "chapters/16_generation.html", hits) == (
        True, "search for KV缓存: 2 pages")
    assert check.search_found("恢复训练", "chapters/28_runs.html", hits) == (
        False, "search for 恢复训练: 2 pages; chapters/28_runs.html is not among them")
    assert not check.search_found("运行时", "chapters/29_runtime.html", [])[0]
