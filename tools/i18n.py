"""The Chinese edition: catalogs of translated Markdown cells, their checks, and the build.

The English notebooks and pages are the only source of code and outputs. A translation lives in
`i18n/zh_CN/<page>.yml`, one file per page of the book (`<page>` is the notebook's or Markdown
page's stem), mapping each English Markdown cell's id to

    en_sha256: the SHA-256 (hex) of the English cell's source, UTF-8, when it was translated
    md: the Chinese Markdown

A Markdown page (`intro.md`, ...) is split into cells: each heading, paragraph and table row;
a cell's id is the slug of its first words. `i18n/zh_CN/glossary.yml` fixes one rendering per
term and lists the renderings to avoid, English words among them (rank, broadcast), which the
Chinese prose may use only as a gloss in parentheses after the Chinese term; `i18n/zh_CN.yml`
holds what is not a page (the book's title, the part captions, the note on the Chinese intro,
the links between the editions, the page furniture). The built book also holds each page's
English headings, from which `tools/anchors.py` gives its sections the English anchors.

Usage:
  python tools/i18n.py status            what is missing, stale, orphaned or malformed
  python tools/i18n.py check PAGE...     every problem of these pages, in detail (exit 1 if any)
  python tools/i18n.py skeleton PAGE...  add the English of untranslated cells to a catalog
  python tools/i18n.py show PAGE         the English cells, ids and hashes, in order
  python tools/i18n.py build OUT         write the Chinese book's sources into OUT

PAGE is a page's stem (`05_rmsnorm`) or its path. `build` checks every page before it writes
anything, and replaces OUT only if OUT is new, empty or an earlier build (it has `.i18n-build`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
LANG = "zh_CN"
CATALOGS = ROOT / "i18n" / LANG
EDITION = ROOT / "i18n" / f"{LANG}.yml"
CJK = re.compile(r"[\u4e00-\u9fff]")


# --- the English source -------------------------------------------------------------------

def pages() -> dict[str, Path]:
    """Every page of the book in the table of contents' order: stem -> path."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [pages_root()] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    found = {}
    for name in files:
        path = next(p for p in (ROOT / f"{name}.ipynb", ROOT / f"{name}.md") if p.exists())
        found[path.stem] = path
    return found


def _fences(text: str) -> list[bool]:
    """For each line: is it inside (or the fence of) a fenced code block?"""
    inside, fence, out = False, "", []
    for line in text.split("\n"):
        m = re.match(r"^(`{3,}|~{3,})", line)
        if m and (not inside or line.strip() == fence):
            out.append(True)
            inside, fence = (not inside), (m.group(1) if not inside else "")
            continue
        out.append(inside)
    return out


def _slug(text: str, words: int = 6) -> str:
    text = re.sub(r"\{\w+(?::\w+)?\}`[^`]*`|\]\([^)]*\)|[*_`$\\]", " ", text.lower())
    return "-".join(re.findall(r"[a-z0-9]+", text)[:words]) or "cell"


def markdown_blocks(text: str) -> list[tuple[str, str, str]]:
    """A Markdown page as cells: (id, source, separator before it).

    A heading, a paragraph (with any fenced block or `:::` directive inside it) and a table
    row are each a cell; a table's header and rule are one. Ids are slugs of a cell's first
    words, so that editing one cell leaves the others' ids alone.
    """
    blocks: list[list[str]] = [[]]
    directive = 0
    for line, inside in zip(text.split("\n"), _fences(text)):
        if not inside:
            if re.match(r"^:{3,}\{", line):
                directive += 1
            elif re.match(r"^:{3,}\s*$", line):
                directive -= 1
        flat = not inside and directive == 0
        if flat and re.match(r"^\|[-:| ]+\|\s*$", line) and not blocks[-1]:
            blocks[-2].append(line)  # a table's rule stays with its header
        elif flat and not line.strip():
            blocks.append([])
        elif flat and (re.match(r"^#{1,6} ", line) or line.startswith("|")
                       and not re.match(r"^\|[-:| ]+\|\s*$", line)):
            blocks += [[line], []]
        else:
            blocks[-1].append(line)
    cells, seen = [], {}
    previous_row = False
    for block in blocks:
        source = "\n".join(block).strip("\n")
        if not source:
            previous_row = previous_row and not block
            continue
        row = source.startswith("|")
        sep = "\n" if row and previous_row else "\n\n"
        previous_row = row
        slug = _slug(source.lstrip("#"))
        seen[slug] = seen.get(slug, 0) + 1
        cells.append((slug if seen[slug] == 1 else f"{slug}-{seen[slug]}", source, sep))
    return cells


def pages_root() -> str:
    return yaml.safe_load((ROOT / "_toc.yml").read_text())["root"]


def english_cells(path: Path) -> list[tuple[str, str]]:
    """(id, source) of every Markdown cell of a page, in order."""
    if path.suffix == ".md":
        return [(cid, source) for cid, source, _ in markdown_blocks(path.read_text("utf-8"))]
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [(c["id"], "".join(c["source"])) for c in nb["cells"]
            if c["cell_type"] == "markdown"]


def headings(path: Path) -> list[str]:
    """The plain text of a page's section headings, in order (not those inside a directive)."""
    text = (path.read_text("utf-8") if path.suffix == ".md" else
            "\n\n".join(source for _, source in english_cells(path)))
    found, directive = [], 0
    for line, inside in zip(text.split("\n"), _fences(text)):
        if inside:
            continue
        if re.match(r"^:{3,}\{", line):
            directive += 1
        elif re.match(r"^:{3,}\s*$", line):
            directive -= 1
        elif directive == 0 and re.match(r"^#{1,6} ", line):
            plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#").strip())
            found.append(re.sub(r"[`$*']", "", plain))  # ' becomes ’, which an id drops
    return found


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- catalogs -----------------------------------------------------------------------------

def catalog_path(stem: str) -> Path:
    return CATALOGS / f"{stem}.yml"


class InputError(ValueError):
    """An argument or a file that a command cannot use; the message is one line."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key twice in one mapping (a merge's leftover)."""

    def construct_mapping(self, node, deep=False):
        lines = {}
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if (key.tag, key.value) in lines:
                    raise yaml.constructor.ConstructorError(
                        problem=f"duplicate key {key.value!r}, also on line "
                                f"{lines[key.tag, key.value]}", problem_mark=key.start_mark)
                lines[key.tag, key.value] = key.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _load_yaml(path: Path, expected: str):
    """A YAML file of the Chinese edition, as a mapping; InputError (one line naming the
    file, and the line and column where it can) if it is not valid YAML or not a mapping."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader) or {}
    except FileNotFoundError:
        raise InputError(f"{_shown(path)}: not found") from None
    except OSError as e:  # a directory, no permission
        raise InputError(f"{_shown(path)}: cannot read it: {e.strerror}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise InputError(f"{_shown(path)}: not valid YAML (line {mark.line + 1}, column "
                         f"{mark.column + 1}): {e.problem or e.context}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise InputError(f"{_shown(path)}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise InputError(f"{_shown(path)}: expected {expected}, got {type(data).__name__}")
    return data


def load_catalog(stem: str) -> dict:
    path = catalog_path(stem)
    if not path.exists():
        return {}
    return _load_yaml(path, "a mapping of cell ids")


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value):
    style = None if re.fullmatch(r"[\w-]+", value) else "|"  # ids and hashes stay plain
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_catalog(stem: str, entries: dict) -> None:
    """Write a catalog in its canonical form (block scalars, English order), atomically."""
    text = yaml.dump(entries, Dumper=_Dumper, allow_unicode=True, sort_keys=False, width=1000)
    path = catalog_path(stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".yml.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


EDITION_KEYS = ("title", "author", "copyright", "footer", "intro_note", "captions", "sphinx")


def edition() -> dict:
    """The edition's settings, each checked: a string where the build writes one, a
    mapping for 'sphinx', and in 'captions' a Chinese caption for every part of _toc.yml."""
    settings = _load_yaml(EDITION, "a mapping of the edition's strings")
    missing = [key for key in EDITION_KEYS if key not in settings]
    if missing:
        raise InputError(f"{_shown(EDITION)}: missing {', '.join(map(repr, missing))}")
    for key in EDITION_KEYS:
        kind = dict if key in ("captions", "sphinx") else str
        value = settings[key]
        if not isinstance(value, kind) or not (value.strip() if kind is str else value):
            expected = "a mapping" if kind is dict else "a string, not blank"
            raise InputError(f"{_shown(EDITION)}: {key!r} must be {expected}, got "
                             f"{value!r}")
    for part in yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))["parts"]:
        caption = settings["captions"].get(part["caption"])
        if not isinstance(caption, str) or not caption.strip():
            raise InputError(f"{_shown(EDITION)}: 'captions' has no Chinese for the part "
                             f"{part['caption']!r} of _toc.yml")
    return settings


def glossary() -> list[dict]:
    path = CATALOGS / "glossary.yml"
    terms = _load_yaml(path, "a mapping with a list 'terms'").get("terms")
    if not isinstance(terms, list):
        raise InputError(f"{_shown(path)}: expected 'terms', a list, got "
                         f"{type(terms).__name__}")
    for number, term in enumerate(terms, 1):
        avoid = term.get("avoid", []) if isinstance(term, dict) else None
        if not (isinstance(term, dict) and isinstance(term.get("en"), str)
                and isinstance(term.get("zh"), str) and isinstance(avoid, list)
                and all(isinstance(word, str) for word in avoid)):
            raise InputError(f"{_shown(path)}: term {number} must be a mapping with "
                             "strings 'en' and 'zh' and a list of strings 'avoid', got "
                             f"{term!r}")
    return terms


# --- what a translation must keep ----------------------------------------------------------

def _prose(md: str) -> str:
    """The running text: fenced code, math, inline code and link targets taken out."""
    keep = [ln for ln, inside in zip(md.split("\n"), _fences(md)) if not inside]
    text = "\n".join(keep)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"`[^`]+`", " ", text)
    text = re.sub(r"\$[^$]+\$", " ", text)
    text = re.sub(r"\]\([^)\s]*\)", "] ", text)
    return re.sub(r"^(:{3,}|\(\S+\)=).*$", " ", text, flags=re.M)


def structure(md: str) -> dict[str, list]:
    """What must be the same in a cell and its translation."""
    fenced = _fences(md)
    lines = md.split("\n")
    outside = "\n".join(ln for ln, inside in zip(lines, fenced) if not inside)
    code_blocks, block = [], []
    for ln, inside in zip(lines, fenced):
        if inside:
            block.append(ln)
            if len(block) > 1 and re.match(r"^(`{3,}|~{3,})\s*$", ln):
                code_blocks.append("\n".join(block))
                block = []
    no_math = re.sub(r"\$\$.*?\$\$", " ", outside, flags=re.S)
    no_roles = re.sub(r"\{\w+(?::\w+)?\}`[^`]*`", " ", no_math)
    no_code = re.sub(r"`[^`]+`", " ", no_roles)  # code first: it may hold a `$`
    return {
        "heading levels": [len(m) for m in re.findall(r"^(#{1,6}) ", outside, re.M)],
        "labels": re.findall(r"^\((\S+)\)=\s*$", outside, re.M),
        "references": sorted(re.findall(r"\{(?:ref|numref|eq|doc)\}`(?:[^`<]*<)?([^`>]+)>?`",
                                        outside)),
        "citations": sorted(k.strip() for keys in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`",
                                                              outside)
                            for k in keys.split(",")),
        "math blocks": re.findall(r"\$\$(.*?)\$\$", outside, re.S),
        "inline math": sorted({_flat(m) for m in re.findall(r"\$([^$]+)\$", no_code)}),
        "inline code": sorted({_flat(m) for m in re.findall(r"`([^`]+)`", no_roles)}),
        "link targets": sorted(re.findall(r"\]\(([^)\s]*)\)", no_code)),
        "table columns": [ln.count("|") - ln.count("\\|") for ln in outside.split("\n")
                          if ln.startswith("|")],
        "directives": re.findall(r"^(:{3,}\{\w+\}|:{3,}$|:\w+:.*$)", outside, re.M),
        "code blocks": code_blocks,
    }


def _flat(span: str) -> str:
    """Inline math or code with its line breaks as the spaces they render as."""
    return re.sub(r"\s+", " ", span).strip()


# A line break between two Chinese characters renders as a stray space.
_WIDE = "\u3000-\u303f\u4e00-\u9fff\uff00-\uffef"
SOFT_BREAK = re.compile(f"[{_WIDE}]\n[{_WIDE}]")
# So does a space between a link or a reference whose text ends in Chinese and the Chinese
# after it: "{ref}`下文的权重衰减一节 <text-weight-decay>` 会解释原因".
LINK_SPACE = re.compile(rf"(?:\[[^\]\n]*[{_WIDE}]\]\([^)\s]*\)"
                        rf"|\{{(?:ref|doc|numref)\}}`[^`]*?[{_WIDE}]\s*(?:<[^`>]*>)?`) +[{_WIDE}]")


# An English term may follow its Chinese rendering once, in parentheses: 广播（broadcast）.
GLOSS = re.compile(f"(?<=[{_WIDE}*])（[ -~]+?）")


def glossary_problems(md: str, terms: list[dict]) -> list[str]:
    """The glossary's `avoid` renderings in a translation's prose (code and math aside).

    An English `avoid` word (a verb such as "broadcast", a noun such as "rank") is refused
    in the Chinese prose where the glossary names a Chinese term for it, except as the gloss
    in parentheses right after the Chinese term.
    """
    text = _prose(md)
    glossed = GLOSS.sub(" ", text)
    found = []
    for term in terms:
        for bad in term.get("avoid", []):
            if bad.isascii():
                hit = re.search(rf"(?i)(?<![\w-]){re.escape(bad)}(?![\w-])", glossed)
                if hit:
                    found.append(f"'{term['en']}' is '{term['zh']}' here, not the English "
                                 f"'{hit.group()}' (it may follow the Chinese once, in "
                                 f"parentheses: {term['zh']}（{bad}）)")
            elif bad in text:
                found.append(f"'{term['en']}' is '{term['zh']}' here, not '{bad}'")
    return found


def problems(stem: str, path: Path, terms: list[dict]) -> dict[str, list[str]]:
    """Every problem of one page's catalog, by kind: missing, stale, orphan, malformed."""
    out = {"missing": [], "stale": [], "orphan": [], "malformed": []}
    cells = english_cells(path)
    try:
        catalog = load_catalog(stem)
    except InputError as e:
        out["malformed"].append(str(e))
        return out
    ids = {cid for cid, _ in cells}
    out["orphan"] = [f"{cid}: no English cell has this id" for cid in catalog if cid not in ids]
    for cid, source in cells:
        entry = catalog.get(cid)
        if entry is None and _untranslatable(source):
            continue  # nothing to translate: the English cell is used as it is
        if not isinstance(entry, dict) or not isinstance(entry.get("md"), str):
            out["missing"].append(f"{cid}: no translation")
            continue
        md = entry["md"]
        if (md == source or not CJK.search(md)) and not _untranslatable(source):
            out["missing"].append(f"{cid}: still the English text")
            continue
        if entry.get("en_sha256") != sha256(source):
            out["stale"].append(f"{cid}: the English cell changed since it was translated; "
                                f"update the translation and set en_sha256: {sha256(source)}")
        want, got = structure(source), structure(md)
        for key in want:
            if want[key] != got[key]:
                out["malformed"].append(f"{cid}: {key} differ: English {want[key]!r}, "
                                        f"Chinese {got[key]!r}")
        out["malformed"] += [f"{cid}: {p}" for p in glossary_problems(md, terms)]
        soft = SOFT_BREAK.search(_prose(md))
        if soft:
            line = soft.group(0).replace("\n", "⏎")
            out["malformed"].append(f"{cid}: a line break between Chinese characters ({line}) "
                                    "renders as a space; join the lines")
        stray = LINK_SPACE.search(md)
        if stray:
            out["malformed"].append(f"{cid}: a space after a link that ends in Chinese "
                                    f"({stray.group(0)!r}) renders as a stray space; drop it")
    return out


def _untranslatable(source: str) -> bool:
    """A cell with no prose to translate (only code, math or a directive)."""
    return not re.search(r"[A-Za-z]{2,}", _prose(source))


# --- the Chinese book -----------------------------------------------------------------------

class TranslationError(Exception):
    """A page's translation is missing, stale or malformed."""


def translated(stem: str, path: Path, strict: bool = True) -> list[tuple[str, str]]:
    """(id, Chinese Markdown) for every cell of a page.

    Raises TranslationError if any cell's translation is missing or malformed, or (when
    `strict`) stale: the Chinese book is built only from current translations.
    """
    bad = problems(stem, path, glossary())
    if not strict:
        bad["stale"] = []
    if any(bad.values()):
        raise TranslationError(f"{stem}: " + "; ".join(m for ms in bad.values() for m in ms[:3])
                               + " (`make i18n-status` lists them all)")
    catalog = load_catalog(stem)
    return [(cid, catalog[cid]["md"] if cid in catalog else source)
            for cid, source in english_cells(path)]


def chinese_notebook(path: Path, cells: list[tuple[str, str]]) -> str:
    """The English notebook with its Markdown swapped; every other byte as it was."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    md = dict(cells)
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = md[cell["id"]].splitlines(keepends=True)
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


ANCHORS = "section_anchors.json"  # in the Chinese book: each page's English headings
SEARCH_WORDS = "search_words.txt"  # in the Chinese book: words its search index keeps whole
MARKER = ".i18n-build"  # in OUT: an earlier build, which the next one may replace


def build(out: Path, strict: bool = True) -> None:
    """The Chinese book's sources: notebooks, pages, table of contents and configuration.

    Every page is checked before OUT is touched. OUT must be new, empty or an earlier build;
    the book is written into a temporary directory inside it, which then replaces the rest.
    """
    out = _out_dir(out)
    books = {stem: translated(stem, path, strict) for stem, path in pages().items()}
    settings = edition()
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("Written by tools/i18n.py build, which replaces this directory.\n")
    tmp = Path(tempfile.mkdtemp(prefix=".i18n-tmp-", dir=out))
    try:
        _write_book(tmp, books, settings, final=out)
        for old in out.iterdir():  # the earlier build, and any a killed build left
            if old in (tmp, out / MARKER):
                continue
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
        for new in tmp.iterdir():
            new.rename(out / new.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _out_dir(out: Path) -> Path:
    """OUT, resolved, if a build may replace it; InputError if not."""
    path = out.resolve()
    if path == ROOT or path in ROOT.parents:
        got = "the repository" if path == ROOT else f"which holds the repository {ROOT}"
    elif ROOT in path.parents and (ROOT / "_build") not in [path, *path.parents]:
        got = "inside the repository but not under _build/ (the build copies its sources)"
    elif any(p.exists() and not p.is_dir() for p in [path, *path.parents]):
        got = "not a directory"
    elif path.is_dir() and any(path.iterdir()) and (not (path / MARKER).is_file()
                                                    or (path / ".git").exists()):
        got = "which holds files this tool did not write"
    else:
        return path
    raise InputError(f"OUT: expected a new or empty directory or an earlier build (it has "
                     f"{MARKER}), got '{out}', {got}")


def page_title(cells: list[tuple[str, str]]) -> str:
    """A page's title: the text of its first `# ` heading."""
    return next(line[2:].strip() for _, md in cells for line in md.split("\n")
                if line.startswith("# "))


# Words that join the words of a title: 运行时与防护, 分词器的文件, 从文本到词元 id.
_JOINERS = "与的从到和"


def search_words(terms: list[dict], titles: list[str]) -> list[str]:
    """The words the Chinese book's search index keeps whole, for jieba's user dictionary.

    Sphinx indexes Chinese through jieba's segmentation (`cut_for_search`), which splits
    the book's own terms into pieces unless it knows them (归约散射 -> 归约 + 散射, 运行时 ->
    运行 + 时, and a single character is not indexed), so that a search for the whole term
    finds nothing. These are the glossary's Chinese terms (not its phrases, such as
    值得记住的思想) and the words of the pages' Chinese titles: each run of Chinese in a
    title cut at the joining words 与, 的, 从, 到, 和 (训练脚本, 运行时, 防护, 约定清单), of 2
    to 6 characters (a longer run is a phrase, which would hide the words inside it: jieba
    adds only the 2- and 3-character words of a longer one to the index).
    """
    words = {w for t in terms for w in t["zh"].split(" / ")
             if CJK.search(w) and " " not in w and "的" not in w}
    for title in titles:
        for run in re.split(rf"[^\u4e00-\u9fff]+|[{_JOINERS}]", title):
            if 2 <= len(run) <= 6:
                words.add(run)
    return sorted(words)


def _write_book(out: Path, books: dict[str, list[tuple[str, str]]], settings: dict,
                final: Path) -> None:
    """Write the book into `out`, which then becomes `final` (the paths in its config)."""
    (out / "chapters").mkdir()
    for stem, path in pages().items():
        cells = books[stem]
        target = out / path.relative_to(ROOT)
        if path.suffix == ".ipynb":
            target.write_text(chinese_notebook(path, cells), encoding="utf-8")
            continue
        seps = [sep for _, _, sep in markdown_blocks(path.read_text("utf-8"))]
        text = "".join(sep + md for sep, (_, md) in zip(seps, cells)).lstrip("\n")
        if path.stem == pages_root():
            title, rest = text.split("\n", 1)
            text = f"{title}\n\n{settings['intro_note'].strip()}\n{rest}"
        target.write_text(text + "\n", encoding="utf-8")
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    for part in toc["parts"]:
        part["caption"] = settings["captions"][part["caption"]]
    (out / "_toc.yml").write_text(yaml.safe_dump(toc, allow_unicode=True, sort_keys=False),
                                  encoding="utf-8")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    for key in ("title", "author", "copyright"):
        config[key] = settings[key]
    config["html"]["extra_footer"] = settings["footer"]
    config["sphinx"]["config"].update(settings["sphinx"])
    extensions = config["sphinx"]["local_extensions"]  # edition_link, anchors
    config["sphinx"]["local_extensions"] = {name: str(ROOT / "tools") for name in extensions}
    anchors = {str(path.relative_to(ROOT).with_suffix("")): headings(path)
               for path in pages().values()}
    (out / ANCHORS).write_text(json.dumps(anchors, ensure_ascii=False, indent=1) + "\n",
                               encoding="utf-8")
    config["sphinx"]["config"]["section_anchors"] = ANCHORS
    words = search_words(glossary(), [page_title(cells) for cells in books.values()])
    (out / SEARCH_WORDS).write_text("".join(f"{w}\n" for w in words), encoding="utf-8")
    config["sphinx"]["config"]["html_search_options"] = {"dict": str(final / SEARCH_WORDS)}
    (out / "_config.yml").write_text(yaml.safe_dump(config, allow_unicode=True,
                                                    sort_keys=False), encoding="utf-8")
    for name in ("references.bib", "_static"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, out / name)


# --- the command line -----------------------------------------------------------------------

def status(stems: list[str] | None = None, detail: bool = False) -> int:
    terms, total, counts = glossary(), 0, {"missing": 0, "stale": 0, "orphan": 0,
                                           "malformed": 0}
    for stem, path in pages().items():
        if stems and stem not in stems:
            continue
        found = problems(stem, path, terms)
        total += len(english_cells(path))
        for kind, messages in found.items():
            counts[kind] += len(messages)
            if messages and (detail or kind != "missing"):
                for m in messages:
                    print(f"{kind:9} {stem}: {m}")
            elif messages:
                print(f"{kind:9} {stem}: {len(messages)} cells")
    print(f"{LANG}: {total} cells, " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 1 if any(counts.values()) else 0


def page_stems(names: list[str], all_pages: dict[str, Path]) -> list[str]:
    """Each PAGE argument as a page's stem; a path (`chapters/05_rmsnorm.ipynb`) gives its own."""
    stems = [name if name in all_pages else Path(name).stem for name in names]
    for name, stem in zip(names, stems):
        if stem not in all_pages:
            raise InputError(f"page: expected one of {', '.join(all_pages)}, got {name!r}")
    return stems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status")
    for name in ("check", "skeleton"):
        sub.add_parser(name).add_argument("page", nargs="+")
    sub.add_parser("show").add_argument("page")
    sub.add_parser("build").add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except TranslationError as e:
        raise SystemExit(f"i18n.py {args.command}: {e}") from None
    except InputError as e:
        raise SystemExit(str(e)) from None


def _run(args: argparse.Namespace) -> int:
    if args.command == "status":
        return status()
    if args.command == "build":
        build(args.out)
        return 0
    all_pages = pages()
    stems = page_stems([args.page] if args.command == "show" else args.page, all_pages)
    if args.command == "check":
        return status(stems, detail=True)
    if args.command == "show":
        for cid, source in english_cells(all_pages[stems[0]]):
            print(f"=== {cid}  en_sha256: {sha256(source)}\n{source}\n")
        return 0
    catalogs = {stem: load_catalog(stem) for stem in stems}  # each one valid before any write
    for stem, catalog in catalogs.items():
        ordered = {}
        for cid, source in english_cells(all_pages[stem]):
            if cid in catalog or not _untranslatable(source):
                ordered[cid] = catalog.pop(cid, {"en_sha256": sha256(source), "md": source})
        dump_catalog(stem, ordered | catalog)  # orphans last, for `status` to report
    return 0


if __name__ == "__main__":
    sys.exit(main())
