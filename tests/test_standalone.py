"""A chapter opened alone, as on a GPU notebook runtime: a bare venv (torch, numpy, ipykernel,
nbclient; no tlm, einops, jaxtyping or matplotlib), run from a directory outside the repository.
The chapter's first cell installs tlm from TLM_PIP_SPEC, pointed at a copy of this checkout, and
matplotlib; every checked output must then match the stored one, and the chapter writes nothing
where it runs."""

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
BARE = ("torch", "numpy", "ipykernel", "nbclient")
# one chapter without extras, one with the Hugging Face extra, one that saves checkpoints
CHAPTERS = ("02_linear", "12_llama", "15_training")
EXECUTE = """\
import sys
import nbformat
from nbclient import NotebookClient

nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3",
               resources={"metadata": {"path": "."}}).execute()
nbformat.write(nb, sys.argv[2])
"""


def _pins() -> list[str]:
    """The exact pins of requirements.txt, e.g. 'torch==2.13.0', at the versions this
    environment has (`make test-compat` runs torch 2.11 in place of the pinned one)."""
    lines = (line.split("#")[0].strip()
             for line in (ROOT / "requirements.txt").read_text().splitlines())
    pins = []
    for line in lines:
        if "==" in line:
            name = line.split("==")[0].strip()
            try:
                pins.append(f"{name}=={metadata.version(name)}")
            except metadata.PackageNotFoundError:
                pins.append(line)
    return pins


def _closure(names) -> set[str]:
    """The distributions `names` need, themselves included (markers evaluated, no extras)."""
    seen, todo = set(), [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def _link_installed(names, into: Path) -> None:
    """Link the files of `names` and their dependencies from this environment into `into`.

    Installing torch again would take minutes; linking the installed files gives the bare
    venv the same packages (and nothing else: no tlm, einops, jaxtyping, matplotlib,
    transformers).
    """
    into.mkdir()
    for name in _closure(names):
        dist = metadata.distribution(name)
        tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = Path(dist.locate_file(top))
            if source.exists() and not (into / top).exists():
                (into / top).symlink_to(source)


def _run(args, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{args[:4]} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """(python, env): a bare venv and the environment a learner's runtime would have."""
    where = tmp_path_factory.mktemp("standalone")
    assert ROOT not in where.parents
    _run([sys.executable, "-m", "venv", where / "venv"])
    python = where / "venv" / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    _link_installed(BARE, where / "bare-packages")
    Path(purelib.stdout.strip(), "bare-packages.pth").write_text(f"{where / 'bare-packages'}\n")
    constraints = where / "constraints.txt"  # tlm's dependencies at the book's versions
    constraints.write_text("\n".join(_pins()) + "\n")
    # a copy of the package alone, so that pip builds nothing inside the checkout
    source = where / "tlm-src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "tlm", source / "tlm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (where / "jupyter").mkdir()  # no kernel specs but the venv's own python
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
               PIP_CONSTRAINT=str(constraints), PIP_DISABLE_PIP_VERSION_CHECK="1",
               JUPYTER_PATH=str(where / "jupyter"), JUPYTER_DATA_DIR=str(where / "jupyter"),
               TLM_PIP_SPEC=f"tlm @ {source.as_uri()}", TLM_DEVICE="cpu")
    found = _run([python, "-c", "import importlib.util as u; print([m for m in "
                  "('torch', 'numpy', 'matplotlib', 'ipykernel', 'nbclient', 'tlm', 'einops', "
                  "'jaxtyping', 'transformers') if u.find_spec(m)])"], env=env, cwd=where)
    assert found.stdout.strip() == str(list(BARE))
    return python, env


def _sanitizers() -> list[tuple[re.Pattern, str]]:
    """The regex/replace pairs of nbval_sanitize.cfg, which nbval applies too."""
    lines = (ROOT / "nbval_sanitize.cfg").read_text().splitlines()
    regexes = [l.split(":", 1)[1].strip() for l in lines if l.startswith("regex:")]
    replaces = [l.split(":", 1)[1].strip() for l in lines if l.startswith("replace:")]
    return [(re.compile(r), rep) for r, rep in zip(regexes, replaces, strict=True)]


SANITIZERS = _sanitizers()


def _checked_outputs(nb) -> list[tuple[int, str]]:
    """(cell index, text) of every output nbval compares, install cell left out."""
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    found = []
    for i, cell in code[1:]:
        if "NBVAL_IGNORE_OUTPUT" in cell.source:
            continue
        for out in cell.outputs:
            if out.output_type == "stream":
                text = out.text
            elif out.output_type == "error":
                text = f"{out.ename}: {out.evalue}"
            elif "text/plain" in out.get("data", {}) and "image/png" not in out.data:
                text = out.data["text/plain"]
            else:
                continue
            for pattern, replacement in SANITIZERS:
                text = pattern.sub(replacement, text)
            if found and found[-1][0] == i and out.output_type == "stream":
                found[-1] = (i, found[-1][1] + text)  # a stream may arrive in pieces
            else:
                found.append((i, text))
    return found


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_runs_alone_in_a_bare_venv(bare, chapter, tmp_path):
    python, env = bare
    stored = ROOT / "chapters" / f"{chapter}.ipynb"
    work = tmp_path / "runtime"
    work.mkdir()
    shutil.copy(stored, work / stored.name)
    (tmp_path / "execute.py").write_text(EXECUTE)
    _run([python, tmp_path / "execute.py", stored.name, tmp_path / "executed.ipynb"],
         env=env, cwd=work, timeout=900)
    for module in ("tlm", "matplotlib"):  # installed into the venv by the first cell
        installed = _run([python, "-c", f"import {module}; print({module}.__file__)"],
                         env=env, cwd=work)
        assert Path(installed.stdout.strip()).is_relative_to(python.parent.parent), module
    # the package data came along: the experiments' results and the Shakespeare model
    data = _run([python, "-c", "import tlm.train as t; m = t.SHAKESPEARE_MODEL; print("
                 "m.is_file(), m.with_name('run.json').is_file(), "
                 "(m.parents[1] / 'shakespeare_experiments.json').is_file())"],
                env=env, cwd=work)
    assert data.stdout.split() == ["True", "True", "True"]
    assert sorted(p.name for p in work.iterdir()) == [stored.name], "the chapter wrote files"
    ran = _checked_outputs(nbformat.read(tmp_path / "executed.ipynb", as_version=4))
    assert ran == _checked_outputs(nbformat.read(stored, as_version=4))
