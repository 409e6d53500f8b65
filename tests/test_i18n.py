"""The Chinese edition cannot fall behind: every English Markdown cell has a current translation
that keeps its structure and the glossary, and the generated notebooks differ from the English
ones in their Markdown only."""

import json
import posixpath
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import edition_link  # noqa: E402
import i18n  # noqa: E402

PAGES = i18n.pages()
TERMS = i18n.glossary()


@pytest.mark.parametrize("stem", list(PAGES))
def test_every_cell_has_a_current_translation(stem):
    found = i18n.problems(stem, PAGES[stem], TERMS)
    for kind in ("malformed", "missing", "stale", "orphan"):
        assert not found[kind], f"{stem}: {kind} (`make i18n-status`):\n" + "\n".join(found[kind])


def test_there_is_a_catalog_for_each_page_and_for_nothing_else():
    names = {p.stem for p in i18n.CATALOGS.glob("*.yml")} - {"glossary"}
    assert names == set(PAGES)


def _edited(tmp_path, stem):
    """A copy of a page whose first Markdown cell has one more character."""
    path = PAGES[stem]
    if path.suffix == ".md":
        copy = tmp_path / path.name
        copy.write_text(path.read_text(encoding="utf-8").replace("\n", "s\n", 1), "utf-8")
        return copy
    nb = json.loads(path.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    cell["source"][0] = cell["source"][0].replace(" ", "  ", 1)
    copy = tmp_path / path.name
    copy.write_text(json.dumps(nb), encoding="utf-8")
    return copy


@pytest.mark.parametrize("stem", ["05_rmsnorm", "intro"])
def test_a_one_character_edit_to_the_english_makes_the_translation_stale(tmp_path, stem):
    found = i18n.problems(stem, _edited(tmp_path, stem), TERMS)
    assert len(found["stale"]) == 1 and not found["missing"], found
    with pytest.raises(i18n.TranslationError, match="changed since it was translated"):
        i18n.translated(stem, _edited(tmp_path, stem))


@pytest.fixture
def one_cell(monkeypatch):
    """The problems of a one-cell page with this English source and this translation."""
    def problems(source, md):
        catalog = {"c0": {"en_sha256": i18n.sha256(source), "md": md}}
        monkeypatch.setattr(i18n, "english_cells", lambda path: [("c0", source)])
        monkeypatch.setattr(i18n, "load_catalog", lambda stem: catalog)
        return i18n.problems("page", Path("page.ipynb"), TERMS)
    return problems


ENGLISH = """## The loss {cite}`vaswani2017attention`

(sec-loss)=
The loss $\\ell$ of a `Linear` layer (math may wrap: $a =
b$; code may hold a dollar: `61$`), see [Softmax](08_softmax) and {ref}`sec-x`:

$$
\\ell = -\\log p
$$

| a | b |
|---|---|
"""
CHINESE = """## 损失 {cite}`vaswani2017attention`

(sec-loss)=
`Linear` 层的损失 $\\ell$（公式可以换行：$a = b$；代码里可以有美元符号：`61$`），见
[Softmax](08_softmax) 与 {ref}`sec-x`：

$$
\\ell = -\\log p
$$

| 甲 | 乙 |
|---|---|
"""


def test_a_faithful_translation_passes(one_cell):
    assert not any(one_cell(ENGLISH, CHINESE).values())


@pytest.mark.parametrize("old, new, kind", [
    ("## 损失", "### 损失", "heading levels"),
    ("(sec-loss)=", "(sec-lost)=", "labels"),
    ("{ref}`sec-x`", "{ref}`sec-y`", "references"),
    ("{cite}`vaswani2017attention`", "", "citations"),
    ("-\\log p\n", "-\\log q\n", "math blocks"),
    ("$\\ell$", "$l$", "inline math"),
    ("`Linear`", "`线性`", "inline code"),
    ("(08_softmax)", "(09_attention)", "link targets"),
    ("| 甲 | 乙 |", "| 甲乙 |", "table columns"),
    ("层的损失", "层的 token 损失", "'token' is '词元'"),
    ("层的损失", "层的令牌损失", "'token' is '词元'"),
    ("层的损失", "层的\n损失", "line break between Chinese characters"),
    ("层的损失", "层的奈特损失", "'nat (unit of information)' is '纳特'"),
    ("层的损失", "层在 rank 0 上的损失", "'rank (of a process)' is '进程编号'"),
    ("层的损失", "层的损失 all-reduce 一次", "'all-reduce' is '全归约'"),
    ("层的损失", "层的全规约", "'reduction' is '归约' here, not '规约'"),
    ("层的损失", "层的键/值缓存", "'KV cache' is 'KV 缓存' here, not '键/值缓存'"),
    ("层的损失", "层的教师强制", "'teacher forcing' is '强制教学' here, not '教师强制'"),
    ("层的损失", "层的 Broadcast 损失", "the collective)' is '广播'"),
    ("层的损失", "层的头的大小", "'head size' is '头维度' here, not '头的大小'"),
    ("层的损失", "输出头的损失", "'LM head' is 'LM 头' here, not '输出头'"),
    ("层的损失", "层对提示词的损失", "'prompt' is '提示' here, not '提示词'"),
    ("层的损失", "层的累加量", "'accumulator (a kernel's running sums)' is '累加器'"),
    ("层的损失", "没有在学习的运行", "'a run that does not learn' is '损失不下降的运行'"),
    ("层的损失", "第一个贪心词元", "'greedy decoding' is '贪心解码' here, not '贪心词元'"),
    ("[Softmax](08_softmax) 与", "[Softmax 一章](08_softmax) 与",
     "a space after a link that ends in Chinese"),
    ("{ref}`sec-x`：", "{ref}`下一节 <sec-x>` 说明", "a space after a link that ends in Chinese"),
])
def test_a_translation_that_loses_structure_or_the_glossary_is_refused(one_cell, old, new,
                                                                        kind):
    assert old in CHINESE
    found = one_cell(ENGLISH, CHINESE.replace(old, new))
    assert any(kind in m for m in found["malformed"]), found


def test_an_english_term_may_stand_as_a_gloss_or_in_code_and_math_only():
    glossed = ("先把 0 号进程的权重广播（broadcast）一次，*进程编号*（rank）即 `rank`：`dist.broadcast(t)`，"
               "$j = \\text{rank} \\cdot A$。")
    assert i18n.glossary_problems(glossed, TERMS) == []
    mixed = "先把 rank 0 的权重 broadcast 一次，再 gather 一次（all-reduce 之后）。"
    found = i18n.glossary_problems(mixed, TERMS)
    assert [m.split("'")[1] for m in found] == ["rank (of a process)",
                                                "broadcast (shapes; the collective)", "all-reduce",
                                                "gather"], found


def test_the_glossary_terms_the_chinese_edition_chose_once():
    zh = {t["en"]: t for t in TERMS}
    for en, chosen in [("nat (unit of information)", "纳特"), ("play (of Shakespeare)", "剧作"),
                       ("plain (the simplest version)", "朴素"), ("head size", "头维度"),
                       ("rank (of a process)", "进程编号"),
                       ("broadcast (shapes; the collective)", "广播"),
                       ("all-reduce", "全归约"), ("reduce-scatter", "归约散射"),
                       ("reduction", "归约"), ("teacher forcing", "强制教学"),
                       ("all-gather", "全收集"), ("written whole (atomically)", "原子写入"),
                       ("rank (tiktoken's, of a merge)", "合并优先级"), ("LM head", "LM 头"),
                       ("prompt", "提示"), ("accumulator (a kernel's running sums)", "累加器"),
                       ("a run that does not learn", "损失不下降的运行")]:
        assert zh[en]["zh"] == chosen and zh[en].get("avoid"), en


def test_a_translation_left_in_english_is_missing(one_cell):
    assert one_cell(ENGLISH, ENGLISH)["missing"] == ["c0: still the English text"]


def test_markdown_pages_split_into_cells_whose_ids_survive_edits_elsewhere():
    text = (ROOT / "conventions.md").read_text(encoding="utf-8")
    blocks = i18n.markdown_blocks(text)
    rows = [cid for cid, source, _ in blocks if source.startswith("| weight layout")]
    assert rows == ["weight-layout-linear-weight-is-d"]
    edited = text.replace("Sources on this model", "Sources on this small model")
    ids = [cid for cid, _, _ in i18n.markdown_blocks(edited)]
    assert ids[2:] == [cid for cid, _, _ in blocks][2:]
    joined = "".join(sep + source for _, source, sep in blocks).strip()
    assert [ln for ln in joined.split("\n") if ln] == [ln for ln in text.split("\n") if ln]


def test_the_glossary_gives_one_rendering_per_term():
    zh = [t["zh"] for t in TERMS]
    assert len(zh) == len(set(zh))
    for term in TERMS:
        assert term["zh"] not in term.get("avoid", []), term


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("zh")
    i18n.build(out, strict=False)  # a stale cell fails the first test, not all of these
    return out


def test_generated_notebooks_differ_from_the_english_in_markdown_only(built):
    for stem, path in PAGES.items():
        if path.suffix != ".ipynb":
            continue
        en = json.loads(path.read_text(encoding="utf-8"))
        zh = json.loads((built / path.relative_to(ROOT)).read_text(encoding="utf-8"))
        catalog = i18n.load_catalog(stem)
        assert zh["metadata"] == en["metadata"] and len(zh["cells"]) == len(en["cells"]), stem
        for a, b in zip(en["cells"], zh["cells"]):
            if a["cell_type"] != "markdown":
                assert a == b, f"{stem}: cell {a.get('id')} differs"
                continue
            assert {k: v for k, v in a.items() if k != "source"} == \
                   {k: v for k, v in b.items() if k != "source"}, stem
            assert "".join(b["source"]) == catalog[a["id"]]["md"], stem


def test_the_chinese_book_has_every_page_its_captions_and_the_note(built):
    toc = yaml.safe_load((built / "_toc.yml").read_text(encoding="utf-8"))
    english = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = lambda t: [c["file"] for part in t["parts"] for c in part["chapters"]]  # noqa: E731
    assert files(toc) == files(english) and toc["root"] == english["root"]
    assert all(i18n.CJK.search(part["caption"]) for part in toc["parts"])
    intro = (built / "intro.md").read_text(encoding="utf-8")
    assert i18n.edition()["intro_note"].strip() in intro
    assert not i18n.SOFT_BREAK.search(i18n.edition()["intro_note"])
    assert intro.startswith(i18n.load_catalog("intro")[next(iter(i18n.load_catalog("intro")))]
                            ["md"])
    config = yaml.safe_load((built / "_config.yml").read_text(encoding="utf-8"))
    assert config["sphinx"]["config"]["language"] == "zh_CN"
    # the glossary's terms, which jieba would split, kept whole in the search index
    words = Path(config["sphinx"]["config"]["html_search_options"]["dict"])
    assert words == built / i18n.SEARCH_WORDS
    assert {"归约散射", "滑动窗口", "词元", "运行时", "微批量", "训练脚本"} \
        <= set(words.read_text("utf-8").split())


@pytest.mark.parametrize("config, this, other", [
    (ROOT / "_config.yml", "_build/html", "_build/zh/html"),
    (ROOT / "i18n" / "zh_CN.yml", "_build/zh/html", "_build/html"),
])
@pytest.mark.parametrize("page", ["intro", "chapters/05_rmsnorm"])
def test_each_page_links_to_the_same_page_of_the_other_edition(config, this, other, page):
    settings = yaml.safe_load(config.read_text(encoding="utf-8"))
    settings = settings["sphinx"].get("config", settings["sphinx"])
    app = SimpleNamespace(config=SimpleNamespace(edition_link=settings["edition_link"],
                                                 edition_link_root=settings["edition_link_root"]))
    context = {}
    edition_link._banner(app, page, "page.html", context, None)
    href = context["theme_announcement"].split('href="')[1].split('"')[0]
    here = posixpath.dirname(f"{this}/{page}.html")
    assert posixpath.normpath(posixpath.join(here, href)) == f"{other}/{page}.html"


def _zh_title(built, page):
    """The first `# ` heading of a page of the Chinese book."""
    path = built / f"{page}.ipynb"
    if path.exists():
        text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text("utf-8"))
                         ["cells"] if c["cell_type"] == "markdown")
    else:
        text = (built / f"{page}.md").read_text(encoding="utf-8")
    return next(line[2:].strip() for line in text.splitlines() if line.startswith("# "))


def test_each_chapter_ends_with_the_next_chapters_chinese_title(built):
    """下一章 before a chapter, 下一篇 before a page of the Reference part (an appendix, the
    conventions ledger, the bibliography), which is not a chapter."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    reference = {c["file"] for c in toc["parts"][-1]["chapters"]}
    assert toc["parts"][-1]["caption"] == "Reference" and "chapters/26_cli" in reference
    for stem, path in PAGES.items():
        if path.suffix != ".ipynb":
            continue
        last = lambda p: [c for c in json.loads(p.read_text("utf-8"))["cells"]  # noqa: E731
                          if c["cell_type"] == "markdown"][-1]
        english = "".join(last(path)["source"]).rstrip().splitlines()[-1]
        target = english.rsplit("](", 1)[1].rstrip(")")
        page = posixpath.normpath(posixpath.join("chapters", target))
        chinese = "".join(last(built / "chapters" / path.name)["source"]).rstrip()
        next_page = "下一篇" if page in reference else "下一章"
        expected = f"- {next_page}：[{_zh_title(built, page)}]({target})"
        assert chinese.splitlines()[-1] == expected, stem


# A link to a chapter or an appendix by name: [旋转位置编码一章](07_rope), [命令行附录](26_cli).
CHAPTER_LINK = re.compile(r"\[([^\]\n]*?) ?(一章|附录)\]\(([^)\s#]*)[^)\s]*\)")


def test_a_link_names_a_chapter_by_its_chinese_title():
    """A reader finds the chapter in the sidebar: the link text is the start of the target
    page's Chinese title or of the part after its colon, up to a word's end ([生成一章] for
    生成与 KV 缓存, [字节级 BPE 一章] for 从文本到词元 id：字节级 BPE, never [架构一章] for
    从讲义模型到 Llama 3 与 Qwen3), the whole link text is the link ("[资源核算一章](...)",
    not "[资源核算](...)一章"), and a Latin name stands apart from 一章 ([Softmax 一章]).
    上一章, 下一章, 下一个附录 and a bare 附录 name no title."""
    titles = {stem: i18n.page_title([(cid, entry["md"]) for cid, entry
                                     in i18n.load_catalog(stem).items()]).replace("`", "")
              for stem in PAGES}
    found = []
    for stem in PAGES:
        for cid, entry in i18n.load_catalog(stem).items():
            md = entry["md"]
            found += [f"{stem} {cid}: {m.group(0)}"
                      for m in re.finditer(r"\]\([^)\s]*\)(一章|附录)", md)]
            for m in CHAPTER_LINK.finditer(md):
                name, word, target = m.groups()
                if not name or re.fullmatch(r"[上下本]|下一个", name):
                    continue
                title = titles[posixpath.basename(target) or stem]
                ends_a_word = any(part == name or part.startswith(name)
                                  and part[len(name)] in " ：-与、"
                                  for part in [title, *title.split("：")[1:]])
                apart = not re.search(r"[A-Za-z0-9]$", name) or f"{name} {word}" in m.group(0)
                if not (ends_a_word and apart):
                    found.append(f"{stem} {cid}: {m.group(0)} (title: {title})")
    assert not found, "\n".join(found)


# --- the command line, on a copy of the sources -----------------------------------------------

@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A copy of the sources the tool reads, with a `.git`, as the tool's root and the cwd."""
    repo = tmp_path / "book"
    files = ("_toc.yml", "_config.yml", "references.bib")
    for path in [*PAGES.values(), *(ROOT / name for name in files)]:
        (repo / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, repo / path.relative_to(ROOT))
    for name in ("i18n", "_static", ".git"):
        (repo / name).mkdir()
    shutil.copytree(i18n.CATALOGS, repo / "i18n" / i18n.LANG)
    shutil.copy(i18n.EDITION, repo / "i18n")
    shutil.copytree(ROOT / "_static", repo / "_static", dirs_exist_ok=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    monkeypatch.setattr(i18n, "ROOT", repo)
    monkeypatch.setattr(i18n, "CATALOGS", repo / "i18n" / i18n.LANG)
    monkeypatch.setattr(i18n, "EDITION", repo / "i18n" / f"{i18n.LANG}.yml")
    monkeypatch.chdir(repo)
    return repo


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _refused(argv, match):
    """The command's one-line error, which must match."""
    with pytest.raises(SystemExit, match=match) as e:
        i18n.main(argv)
    assert isinstance(e.value.code, str) and "\n" not in e.value.code, e.value.code
    return e.value.code


@pytest.mark.parametrize("out", [".", "..", "notes", "other-clone", "book/_toc.yml",
                                 "./_static/zh", "./chapters/zh", "notes/notes.txt/sub"])
def test_build_refuses_to_replace_what_it_did_not_write(checkout, out):
    (checkout.parent / "notes").mkdir()
    (checkout.parent / "notes" / "notes.txt").write_text("mine\n")
    shutil.copytree(checkout / ".git", checkout.parent / "other-clone" / ".git")
    before = _files(checkout.parent)
    _refused(["build", out if out.startswith(".") else f"../{out}"],
             r"^OUT: expected a new or empty directory or an earlier build \(it has "
             r"\.i18n-build\), got '")
    assert _files(checkout.parent) == before


def test_a_build_replaces_only_an_earlier_build_and_only_once_every_page_passes(checkout):
    out = checkout / "_build" / "zh" / "src"  # where `make book-zh` builds
    assert i18n.main(["build", "_build/zh/src"]) == 0
    (out / "_build" / "html").mkdir(parents=True)  # what jupyter-book writes beside it
    assert i18n.main(["build", "_build/zh/src"]) == 0
    built = _files(out)
    catalog = i18n.CATALOGS / "05_rmsnorm.yml"
    text = catalog.read_text(encoding="utf-8")
    stale = text.replace(text.split("en_sha256: ")[1][:64], "0" * 64, 1)
    catalog.write_text(stale, encoding="utf-8")
    _refused(["build", "_build/zh/src"], "05_rmsnorm: .*changed since it was translated")
    assert _files(out) == built
    assert (out / "chapters" / "05_rmsnorm.ipynb").exists() and (out / i18n.MARKER).exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [i18n.MARKER]


@pytest.mark.parametrize("command", ["check", "show", "skeleton"])
def test_a_page_is_a_known_page_or_its_path(command, capsys):
    before = _files(i18n.CATALOGS)
    _refused([command, "no-such-page"], r"^page: expected one of intro, .*, got 'no-such-page'$")
    assert _files(i18n.CATALOGS) == before
    if command == "check":
        assert i18n.main(["check", "chapters/05_rmsnorm.ipynb"]) == 0
        cells = len(i18n.english_cells(PAGES["05_rmsnorm"]))
        assert capsys.readouterr().out.endswith(f"{i18n.LANG}: {cells} cells, 0 missing, "
                                                "0 stale, 0 orphan, 0 malformed\n")


def test_skeleton_names_a_catalog_that_is_not_yaml_and_leaves_it_alone(checkout):
    catalog = i18n.CATALOGS / "05_rmsnorm.yml"
    catalog.write_text(catalog.read_text(encoding="utf-8") + "foo: [unclosed\n", "utf-8")
    before = catalog.read_bytes()
    lines = before.count(b"\n")
    _refused(["skeleton", "05_rmsnorm"], r"^i18n/zh_CN/05_rmsnorm\.yml: not valid YAML "
             rf"\(line {lines + 1}, column 1\): expected ',' or '\]'")
    assert catalog.read_bytes() == before


def test_a_cell_id_twice_in_a_catalog_is_malformed_and_skeleton_keeps_it(checkout, capsys):
    catalog = i18n.CATALOGS / "05_rmsnorm.yml"
    text = catalog.read_text(encoding="utf-8")
    first = text[:re.search(r"\n(?=\S)", text).end()]  # the first entry, again
    catalog.write_text(text + first, encoding="utf-8")
    line = text.count("\n") + 1
    assert i18n.main(["status"]) == 1
    assert (f"malformed 05_rmsnorm: i18n/zh_CN/05_rmsnorm.yml: not valid YAML (line {line}, "
            f"column 1): duplicate key '{first.split(':')[0]}', also on line 1\n"
            in capsys.readouterr().out)
    before = catalog.read_bytes()
    _refused(["skeleton", "05_rmsnorm"], "duplicate key")
    assert catalog.read_bytes() == before


# --- the rendered pages: section anchors and line breaks (tools/anchors.py) ---------------------

import anchors  # noqa: E402
from docutils import nodes  # noqa: E402
from docutils.frontend import get_default_settings  # noqa: E402
from docutils.utils import new_document  # noqa: E402


def _page(*titles):
    """A document with one section per title, its ids as docutils made them (`id1`, ...)."""
    doc = new_document("page", get_default_settings())
    for i, title in enumerate(titles, 1):
        section = nodes.section(ids=[f"id{i}"], names=[title])
        section += nodes.title(title, title)
        doc += section
        doc.ids[f"id{i}"] = section
        doc.nameids[title] = f"id{i}"
    return doc


def _app(tmp_path, headings=None):
    if headings is not None:
        (tmp_path / "anchors.json").write_text(json.dumps({"page": headings}), "utf-8")
    return SimpleNamespace(srcdir=str(tmp_path), env=SimpleNamespace(docname="page"),
                           config=SimpleNamespace(
                               section_anchors="anchors.json" if headings is not None else ""))


def test_chinese_sections_take_the_english_anchors_and_keep_their_labels(tmp_path):
    english = tmp_path / "page.md"
    english.write_text("# Training on many devices\n\n## Code: the handout's version\n\n"
                       ":::{admonition} Solution\n## Not a section\n:::\n\n"
                       "## Code: the handout's version\n", encoding="utf-8")
    doc = _page("多设备训练", "代码：讲义的版本", "代码：讲义的版本")
    doc[1]["ids"].append("sec-label")  # an explicit label, `(sec-label)=`
    anchors._anchors(_app(tmp_path, i18n.headings(english)), doc)
    assert [s["ids"] for s in doc.findall(nodes.section)] == [
        ["training-on-many-devices"], ["code-the-handouts-version", "sec-label"],
        ["code-the-handouts-version-2"]]
    assert doc.nameids["多设备训练"] == "training-on-many-devices" and "id1" not in doc.ids


def test_a_label_before_a_chinese_heading_keeps_its_id_for_a_ref(tmp_path):
    english = tmp_path / "page.md"
    english.write_text("# Weight decay: which weights it shrinks\n", encoding="utf-8")
    doc = _page("权重衰减：它缩小哪些权重")
    section = doc[0]
    section["ids"].insert(0, "text-weight-decay")  # `(text-weight-decay)=`: docutils puts it
    section["names"].append("text-weight-decay")  # first where the title makes no id
    doc.ids["text-weight-decay"] = section
    doc.nameids["text-weight-decay"] = "text-weight-decay"
    doc.nametypes["text-weight-decay"] = True  # explicit
    anchors._anchors(_app(tmp_path, i18n.headings(english)), doc)
    assert section["ids"] == ["weight-decay-which-weights-it-shrinks", "text-weight-decay"]
    assert doc.ids["text-weight-decay"] is section and "id1" not in doc.ids
    assert doc.nameids["text-weight-decay"] == "text-weight-decay"


def test_english_sections_get_the_same_anchors_from_their_titles(tmp_path):
    doc = _page("Training on many devices", "Code: the handout’s version",
                "Code: the handout’s version")  # smart quotes, as Sphinx gives them
    anchors._anchors(_app(tmp_path), doc)
    assert [s["ids"] for s in doc.findall(nodes.section)] == [
        ["training-on-many-devices"], ["code-the-handouts-version"],
        ["code-the-handouts-version-2"]]


def test_a_page_whose_sections_do_not_match_the_english_headings_is_left_alone(tmp_path,
                                                                                  caplog):
    doc = _page("多设备训练")
    anchors._anchors(_app(tmp_path, ["A", "B"]), doc)  # a warning: `make book-zh` fails (-W)
    assert "1 sections but 2 English headings" in caplog.text
    assert doc[0]["ids"] == ["id1"]


def test_no_line_starts_with_the_punctuation_after_math_or_code():
    doc = new_document("page", get_default_settings())
    paragraph = nodes.paragraph()
    paragraph += [nodes.Text("见 "), nodes.math("x", "x"), nodes.Text("，然后 "),
                  nodes.literal("f(a, b)", "f(a, b)"), nodes.Text("。"),
                  nodes.literal("g", "g"), nodes.Text("、"), nodes.math("y", "y"),
                  nodes.Text(" 不变"), nodes.literal("h", "h"), nodes.Text("）；下一句")]
    doc += paragraph
    anchors._no_break_before_punctuation(None, doc)
    shown = [(type(n).__name__, getattr(n, "get", lambda k: None)("classes"), n.astext())
             for n in paragraph.children]
    assert shown == [("Text", None, "见 "), ("inline", ["nowrap"], "x，"), ("Text", None, "然后 "),
                     ("literal", [], "f(a, b)"), ("Text", None, "\u2060。"),  # a word joiner
                     ("inline", ["nowrap"], "g、"), ("math", [], "y"), ("Text", None, " 不变"),
                     ("inline", ["nowrap"], "h）；"), ("Text", None, "下一句")]  # every mark


def test_an_opening_mark_before_math_or_code_does_not_end_a_line():
    doc = new_document("page", get_default_settings())
    paragraph = nodes.paragraph()
    paragraph += [nodes.Text("块大小 "), nodes.math("B", "B"), nodes.Text("（"),
                  nodes.math("B", "B"), nodes.Text(" 整除 "), nodes.math("T", "T"),
                  nodes.Text("）；又见（"), nodes.literal("f(a, b)", "f(a, b)"),
                  nodes.Text("）与“"), nodes.literal("g", "g"), nodes.Text("”")]
    doc += paragraph
    anchors._no_break_before_punctuation(None, doc)
    shown = [(type(n).__name__, getattr(n, "get", lambda k: None)("classes"), n.astext())
             for n in paragraph.children]
    assert shown == [("Text", None, "块大小 "), ("math", [], "B"), ("inline", ["nowrap"], "（B"),
                     ("Text", None, " 整除 "), ("inline", ["nowrap"], "T）；"),
                     ("Text", None, "又见（"), ("literal", [], "f(a, b)"),  # may wrap inside
                     ("Text", None, "\u2060）与"), ("inline", ["nowrap"], "“g"),
                     ("Text", None, "”")]


def test_the_chinese_book_has_the_english_headings_of_every_page(built):
    found = json.loads((built / i18n.ANCHORS).read_text(encoding="utf-8"))
    config = yaml.safe_load((built / "_config.yml").read_text(encoding="utf-8"))
    assert config["sphinx"]["config"]["section_anchors"] == i18n.ANCHORS
    assert set(config["sphinx"]["local_extensions"]) == {"edition_link", "anchors"}
    for path in PAGES.values():
        page = str(path.relative_to(ROOT).with_suffix(""))
        chinese = i18n.headings(built / path.relative_to(ROOT))
        assert found[page] == i18n.headings(path) and len(chinese) == len(found[page]), page


# --- README.zh-CN.md: a summary, labelled as one, that drops no caveat ----------------------------

# Each caveat of README.md (as it reads there) and the words that carry it in README.zh-CN.md.
CAVEATS = [
    ("The nccl path has not yet run on a GPU here.", "nccl 路径还没有在 GPU 上运行过"),
    ("`--resume` continues a run with the same number of processes",
     "`--resume` 要用与原运行相同数量的进程"),
    ("### On a GPU", "除英文 README 中“On a GPU”一节的 H100 数据"),
    ("Two processes on this machine's CPU (`--device cpu`) log the same losses as one process "
     "with twice the micro-batches", "记录的损失与使用两倍微批量的单个进程相同"),
    ("bit for bit on a CPU (with the same number of threads), and on a GPU only with "
     "`--deterministic`", "在 GPU 上只有加 `--deterministic` 才逐位一致"),
    ("`torch>=2.11,<2.14`, and `tlm doctor` warns outside it", "`tlm doctor` 在范围之外会给出警告"),
    ("(PyTorch issue 180642)", "（PyTorch issue 180642）"),
    ("cells marked `# NBVAL_IGNORE_OUTPUT` (timings, versions, training losses) are not "
     "compared", "标有 `# NBVAL_IGNORE_OUTPUT` 的单元格（用时、版本、训练损失）不做比较"),
    ("its speed changes by the hour and by the day, by up to a factor of three", "每小时都会变化"),
    ("for example (one run here)", "只是一次运行的输出"),
    ("No answer is quoted here: the machines that check this book do not reach the hub",
     "这里没有引用任何回答"),
    ("it needs `pip install playwright` and a Chromium, which `make test` does not, and for the "
     "Chinese edition a CJK font", "需要 `make test` 不安装的东西"),
]


def _flat_text(path):
    """A file's text with runs of white space, and a shell line's continuation, as one space."""
    return " ".join(path.read_text(encoding="utf-8").replace("\\\n", " ").split())


def test_the_chinese_readme_is_a_labelled_summary_that_keeps_every_caveat():
    english, chinese = _flat_text(ROOT / "README.md"), _flat_text(ROOT / "README.zh-CN.md")
    assert "这是英文 README 的摘要，不是全文翻译" in chinese and "](README.md)" in chinese
    for en, zh in CAVEATS:
        assert en in english, f"README.md no longer says {en!r}: update README.zh-CN.md and this"
        assert zh in chinese, f"README.zh-CN.md lacks the caveat {en!r}"


def test_the_chinese_readme_shows_only_commands_the_english_one_has():
    english = _flat_text(ROOT / "README.md")
    chinese = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", chinese, re.S)
    commands = [" ".join(line.split("#")[0].split()) for block in blocks
                for line in block.rstrip("\n").replace("\\\n", " ").split("\n")]
    assert len(commands) >= 10
    for command in commands:
        assert command in english, command


@pytest.mark.parametrize("command", [["check", "05_rmsnorm"], ["status"],
                                     ["build", "_build/zh/src"]])
def test_a_glossary_or_edition_file_that_is_not_yaml_is_one_line(checkout, command):
    """The glossary and the edition's strings are files translators edit, and a merge
    can break: named with the line and column, not a YAML traceback."""
    for path in (i18n.CATALOGS / "glossary.yml", i18n.EDITION):
        if command[0] != "build" and path == i18n.EDITION:
            continue  # only the build reads the edition's strings
        good = path.read_bytes()
        lines = good.count(b"\n")
        path.write_bytes(good + b"broken: [unclosed\n")
        shown = path.relative_to(i18n.ROOT).as_posix()
        _refused(command, rf"^{re.escape(shown)}: not valid YAML \(line {lines + 2}, "
                          r"column 1\): expected ',' or '\]'")
        path.write_bytes(good)
    assert not (i18n.ROOT / "_build").exists()


@pytest.mark.parametrize("command", [["check", "05_rmsnorm"], ["status"]])
@pytest.mark.parametrize("how, message", [("missing", "not found"),
                                          ("folder", "cannot read it: Is a directory")])
def test_a_glossary_missing_or_unreadable_is_one_line(checkout, command, how, message):
    path = i18n.CATALOGS / "glossary.yml"
    path.unlink()
    if how == "folder":
        path.mkdir()
    _refused(command, rf"^i18n/zh_CN/glossary\.yml: {message}$")


@pytest.mark.parametrize("text, message", [
    ("x: 1\n", "missing 'title', 'author', 'copyright', 'footer', 'intro_note', "
                "'captions', 'sphinx'"),
    ("", "missing 'title'"), (None, "not found")])
def test_an_edition_file_without_its_strings_is_one_line(checkout, text, message):
    if text is None:
        i18n.EDITION.unlink()
    else:
        i18n.EDITION.write_text(text, encoding="utf-8")
    _refused(["build", "_build/zh/src"], rf"^i18n/zh_CN\.yml: {re.escape(message)}")
    assert not (i18n.ROOT / "_build").exists()


@pytest.mark.parametrize("edit, message", [
    (lambda toc, zh: (toc.replace("caption: Reference", "caption: Appendices"), zh),
     "'captions' has no Chinese for the part 'Appendices' of _toc.yml"),
    (lambda toc, zh: (toc, re.sub(r"(?m)^intro_note:.*(\n  .*|\n)*", "intro_note:\n", zh)),
     "'intro_note' must be a string, not blank, got None"),
    (lambda toc, zh: (toc, re.sub(r"(?m)^title:.*$", "title: 3", zh)),
     "'title' must be a string, not blank, got 3"),
    (lambda toc, zh: (toc, re.sub(r"(?m)^author:.*$", 'author: "  "', zh)),
     "'author' must be a string, not blank, got '  '"),
    (lambda toc, zh: (toc, re.sub(r"(?m)^captions:", "captions: []\nold_captions:", zh)),
     "'captions' must be a mapping, got []"),
])
def test_an_edition_file_that_lacks_a_caption_or_a_string_is_one_line(checkout, edit,
                                                                       message):
    """A part renamed or added in _toc.yml (an English edit), an empty or mistyped
    string: named in one line, before the build writes anything."""
    toc, zh = (path.read_text(encoding="utf-8") for path in (checkout / "_toc.yml",
                                                             i18n.EDITION))
    toc, zh = edit(toc, zh)
    (checkout / "_toc.yml").write_text(toc, encoding="utf-8")
    i18n.EDITION.write_text(zh, encoding="utf-8")
    _refused(["build", "_build/zh/src"], rf"^i18n/zh_CN\.yml: {re.escape(message)}$")
    assert not (i18n.ROOT / "_build").exists()


@pytest.mark.parametrize("text, message", [
    ("- a list\n", "expected a mapping with a list 'terms', got list"),
    ("terms: 3\n", "expected 'terms', a list, got int"),
    ("terms:\n  - {en: token}\n", "term 1 must be a mapping with strings 'en' and 'zh'"),
    ("terms:\n  - {en: token, zh: 词元, avoid: token}\n", "term 1 must be a mapping"),
])
def test_a_glossary_of_the_wrong_shape_is_one_line(checkout, text, message):
    (i18n.CATALOGS / "glossary.yml").write_text(text, encoding="utf-8")
    _refused(["check", "05_rmsnorm"], rf"^i18n/zh_CN/glossary\.yml: {re.escape(message)}")


# --- the Chinese book's search and page furniture -------------------------------------------

def test_the_chinese_search_index_holds_chinese_words():
    """Sphinx indexes Chinese words only when it can segment them (jieba, in requirements.txt);
    without it the Chinese book's search finds no Chinese word."""
    from sphinx.search.zh import SearchChinese
    words = set(SearchChinese({}).split("KV 缓存与滑动窗口"))
    assert {"缓存", "滑动", "窗口", "KV"} <= words


def test_the_search_keeps_the_words_of_the_titles_whole():
    """运行时 is the first word of a title, and jieba alone cuts it into 运行 + 时 (a single
    character, which Sphinx does not index): a search for it found nothing. The dictionary
    the build writes holds the titles' words, and the glossary's terms but not its phrases."""
    import jieba

    titles = [i18n.page_title([(cid, entry["md"]) for cid, entry
                               in i18n.load_catalog(stem).items()]) for stem in PAGES]
    assert "运行时与防护：设备、确定性与编译检查" in titles
    words = i18n.search_words(TERMS, titles)
    assert {"运行时", "防护", "训练脚本", "约定清单", "工具函数", "微批量", "归约散射"} <= set(words)
    assert all(2 <= len(w) or w in {"块", "键", "值"} for w in words)
    assert "值得记住的思想" not in words and "经得起中断的运行" not in words
    cut = jieba.Tokenizer()
    assert "运行时" not in cut.cut_for_search("运行时与防护")
    for word in words:
        cut.add_word(word)  # as jieba.load_userdict does with a line that has no frequency
    for text, word in [("运行时与防护", "运行时"), ("每步多个微批量", "微批量"),
                       ("附录训练脚本中", "训练脚本")]:
        assert word in cut.cut_for_search(text), text


# Sphinx's searchtools.js (the search page's code) run by node, with the Chinese edition's
# splitQuery loaded first, as the browser does, against a small index.
SEARCH_HARNESS = r"""
const fs = require("fs"), vm = require("vm");
const [lang, zh, sphinx, index, ...queries] = process.argv.slice(2);
const element = () => ({appendChild: (x) => x, dataset: {}, style: {}});
const context = {
  document: {documentElement: {lang, dataset: {content_root: "./"}},
             getElementById: () => null, createElement: element, body: element()},
  window: {location: {search: ""}}, localStorage: {setItem() {}},
  SPHINX_HIGHLIGHT_ENABLED: false, DOCUMENTATION_OPTIONS: {}, stopwords: [],
  _: (s) => s, _ready: () => {}, Stemmer: function () { this.stemWord = (w) => w; },
};
vm.createContext(context);
for (const file of [zh, sphinx]) vm.runInContext(fs.readFileSync(file, "utf8"), context);
vm.runInContext(`Search.setIndex(${index})`, context);
const found = {};
for (const query of queries) {
  found[query] = vm.runInContext(`(() => {
    const [, terms, excluded] = Search._parseQuery(${JSON.stringify(query)});
    return {terms: [...terms],
            pages: Search.performTermsSearch(terms, excluded).map((r) => r[0]).sort()};
  })()`, context);
}
console.log(JSON.stringify(found));
"""
INDEX = {"docnames": ["generation", "runs", "runtime"], "titles": ["生成", "训练脚本", "运行时"],
         "filenames": ["generation.ipynb", "runs.ipynb", "runtime.ipynb"],
         "terms": {"kv": [0, 2], "缓存": [0, 1], "恢复": 1, "训练": [1, 2], "运行": [1, 2],
                   "运行时": 2},
         "titleterms": {"运行时": 2}, "objects": {}, "objnames": {}, "objtypes": {},
         "alltitles": {}, "indexentries": {}, "envversion": {}}


def _search(tmp_path, lang, *queries):
    import sphinx

    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run the search page's JavaScript")
    script = tmp_path / "search.js"
    script.write_text(SEARCH_HARNESS, encoding="utf-8")
    searchtools = Path(sphinx.__file__).parent / "themes" / "basic" / "static" / "searchtools.js"
    run = subprocess.run([node, str(script), lang, str(ROOT / "_static" / "zh_search.js"),
                          str(searchtools), json.dumps(INDEX, ensure_ascii=False), *queries],
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def test_a_chinese_query_typed_without_spaces_is_split_into_indexed_words(tmp_path):
    found = _search(tmp_path, "zh-CN", "KV缓存", "恢复训练", "运行时", "KV 缓存", "块", "缓存块")
    assert found["KV缓存"] == {"terms": ["kv", "缓存"], "pages": ["generation"]}
    assert found["恢复训练"] == {"terms": ["恢复", "训练"], "pages": ["runs"]}
    assert found["运行时"] == {"terms": ["运行时"], "pages": ["runtime"]}  # the longest
    assert found["KV 缓存"] == found["KV缓存"]
    assert found["块"]["terms"] == [] and found["缓存块"]["terms"] == ["缓存"]


def test_the_english_book_keeps_sphinxs_query_split(tmp_path):
    found = _search(tmp_path, "en", "KV缓存", "KV 缓存")
    assert found["KV缓存"] == {"terms": ["kv缓存"], "pages": []}  # what the Chinese book did
    assert found["KV 缓存"]["pages"] == ["generation"]


def test_the_furniture_the_themes_leave_in_english_is_replaced_where_it_is_whole():
    strings = i18n.edition()["sphinx"]["ui_strings"]
    html = ('<input placeholder="Search this book..." aria-label="Search this book...">'
            '<a class="headerlink" title="Link to this heading">#</a>'
            '<button title="列印成 PDF"></button>'
            '<p class="component-author">\n作者： tlm 编写组\n</p>'
            '<p>Toggle primary sidebar, said the text</p><a href="Color mode">x</a>')
    out = edition_link.furnished(html, strings)
    assert 'placeholder="搜索本书…" aria-label="搜索本书…"' in out
    assert 'title="链接到此标题"' in out and 'title="打印为 PDF"' in out
    assert "\n作者：tlm 编写组\n" in out
    assert "Toggle primary sidebar, said the text" in out and 'href="Color mode"' in out
    assert edition_link.furnished(html, {}) == html
