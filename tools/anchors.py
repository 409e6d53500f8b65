"""A Sphinx extension both books load: section anchors made from the English headings, and no
line that starts with Chinese punctuation after inline math.

Docutils makes a section's anchor from its title; a Chinese title has no Latin letters, so every
section would get a counter (`#id8`) that shifts when a section is added and never matches the
English page, and a title used twice on a page gets one in English too. Here each section's
anchor is the slug docutils makes from its English heading, with `-2`, `-3`, ... for a heading
used again on the page, in both editions; explicit labels (`(sec-x)=`) stay as they are, beside
it, so that a `{ref}` to one still finds its section. The
English book takes the headings from its own sections; `tools/i18n.py build` writes the Chinese
book's `section_anchors` (a JSON file beside its `_config.yml`: page -> the English headings'
plain text, in order).

A browser may break a line between inline math, code, a link or a citation and the Chinese
punctuation after it, which then starts the next line; a word joiner (U+2060, invisible)
between them forbids that break, and math (which MathJax draws as one box) or one-word code
goes with the punctuation into a `<span class="nowrap">` (`_static/tlm.css`). Likewise an
opening mark before math or one-word code (“块大小 $B$（$B$ 整除 $T$）”), which a browser may
leave at the end of a line, the math starting the next: it goes into the same span.
"""

from __future__ import annotations

import json
from pathlib import Path

from docutils import nodes
from sphinx.util import logging

logger = logging.getLogger(__name__)
PUNCTUATION = "，。；：、）！？」』】》…—"
OPENING = "（“‘「『【《"  # must not end a line
WORD_JOINER = "\u2060"  # no line break on either side
# what may stand before the punctuation: math, code, a link or a citation, emphasis
INLINE = (nodes.math, nodes.literal, nodes.reference, nodes.inline, nodes.emphasis,
          nodes.strong)


def anchor(heading: str) -> str:
    """The id docutils gives a section titled `heading` (its plain text), as in the English book."""
    return nodes.make_id(nodes.fully_normalize_name(heading))


def _anchors(app, doctree) -> None:
    sections = list(doctree.findall(nodes.section))
    if app.config.section_anchors:  # the Chinese book: the English headings
        path = Path(app.srcdir) / app.config.section_anchors
        headings = json.loads(path.read_text(encoding="utf-8")).get(app.env.docname)
        if headings is None:
            return
    else:
        headings = [s[0].astext() if s.children and isinstance(s[0], nodes.title) else ""
                    for s in sections]
    if len(sections) != len(headings):
        logger.warning(f"{len(sections)} sections but {len(headings)} English headings: "
                       "section anchors left as docutils made them", location=app.env.docname)
        return
    document, used = doctree, set()
    for section, heading in zip(sections, headings):
        new = base = anchor(heading) or "section"
        count = 1
        while new in used:
            count += 1
            new = f"{base}-{count}"
        used.add(new)
        old = section["ids"][0] if section["ids"] else None
        if old == new or document.ids.get(new, section) is not section:
            continue  # already the English anchor, or another node's id
        # the id docutils made from the title goes; a label's id (`(text-weight-decay)=`,
        # which a {ref} links to) stays, after the English anchor, as in the English book
        labels = {document.nameids[name] for name, explicit in document.nametypes.items()
                  if explicit and document.nameids.get(name)}
        made = next((i for i in section["ids"] if i not in labels), None)
        if made is not None:
            section["ids"].remove(made)
            document.ids.pop(made, None)
            for name, target in list(document.nameids.items()):
                if target == made:
                    document.nameids[name] = new
        section["ids"].insert(0, new)  # the first id is the one the page contents link to
        document.ids[new] = section


def _no_break_before_punctuation(app, doctree) -> None:
    for node in list(doctree.findall(lambda n: isinstance(n, INLINE))):
        parent = node.parent
        at = parent.index(node)
        before = parent[at - 1] if at > 0 else None
        after = parent[at + 1] if at + 1 < len(parent) else None
        one_box = isinstance(node, nodes.math) or isinstance(node, nodes.literal) \
            and not any(c.isspace() for c in node.astext())
        closing = isinstance(after, nodes.Text) and after.astext()[:1] in PUNCTUATION
        opening = one_box and isinstance(before, nodes.Text) and before.astext()[-1:] in OPENING
        if not (closing or opening):
            continue
        if not one_box:
            parent[at + 1] = nodes.Text(WORD_JOINER + after.astext())
            continue
        # MathJax draws math as one box, and a browser may break a name in a table's code
        # (_static/tlm.css) before it honours a word joiner: the math or the one-word code and
        # the punctuation go into one span that does not wrap at their boundary
        # (all the punctuation that follows: a browser may break between two marks at the
        # span's end, `）` inside and `；` outside; and the opening marks before it)
        text = after.astext() if closing else ""
        marks = len(text) - len(text.lstrip(PUNCTUATION))
        lead = before.astext() if opening else ""
        opens = len(lead) - len(lead.rstrip(OPENING))
        wrap = nodes.inline("", "", classes=["nowrap"])
        parent[at] = wrap
        if opens:
            wrap += nodes.Text(lead[-opens:])
        wrap += node
        if marks:
            wrap += nodes.Text(text[:marks])
        if closing:
            if len(text) > marks:
                parent[at + 1] = nodes.Text(text[marks:])
            else:
                del parent[at + 1]
        if opening:
            if len(lead) > opens:
                parent[at - 1] = nodes.Text(lead[:-opens])
            else:
                del parent[at - 1]


def setup(app):
    app.add_config_value("section_anchors", "", "env")
    # before Sphinx collects the page's table of contents from the sections' ids (priority 500)
    app.connect("doctree-read", _anchors, priority=400)
    app.connect("doctree-read", _no_break_before_punctuation, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
