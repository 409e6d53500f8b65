"""A Sphinx extension: a banner on every page linking to the same page in the other edition,
and the Chinese names of the page furniture that the themes leave in English.

The English book is built into `_build/html`, the Chinese one into `_build/zh/html`.
`edition_link` is the banner's HTML with `{href}` where the link goes; `edition_link_root` is the
other edition's root relative to this one's. The link is written into each page when it is
built, so it works offline and without JavaScript.

`ui_strings` maps a string of the built pages to what the edition shows instead: tooltips,
labels, placeholders and image texts (`title`, `aria-label`, `data-bs-title`, `placeholder`,
`alt`) that the themes do not translate, or translate in another region's usage, and whole
text lines of the footer. They are replaced in the HTML files once the build has written
them.
"""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

ATTRIBUTES = ("title", "aria-label", "data-bs-title", "placeholder", "alt")


def _banner(app, pagename, templatename, context, doctree):
    text, root = app.config.edition_link, app.config.edition_link_root
    if not text:
        return
    href = "../" * pagename.count("/") + root + pagename + ".html"
    context["theme_announcement"] = text.format(href=escape(href, quote=True))


def furnished(html: str, strings: dict[str, str]) -> str:
    """`html` with each string of `strings` replaced where it is a whole attribute value of
    ATTRIBUTES or the whole text of an element (white space around it kept)."""
    for old, new in strings.items():
        html = re.sub(rf'(\b(?:{"|".join(ATTRIBUTES)})="){re.escape(escape(old))}"',
                      lambda m: f'{m[1]}{escape(new)}"', html)
        html = re.sub(rf"(>\s*){re.escape(escape(old, quote=False))}(\s*<)",
                      lambda m: f"{m[1]}{escape(new, quote=False)}{m[2]}", html)
    return html


def _furnish(app, exception) -> None:
    strings = app.config.ui_strings
    if exception is not None or not strings or app.builder.format != "html":
        return
    for path in Path(app.outdir).rglob("*.html"):
        text = path.read_text(encoding="utf-8")
        new = furnished(text, strings)
        if new != text:
            path.write_text(new, encoding="utf-8")


def setup(app):
    app.add_config_value("edition_link", "", "html")
    app.add_config_value("edition_link_root", "", "html")
    app.add_config_value("ui_strings", {}, "html")
    app.connect("html-page-context", _banner)
    app.connect("build-finished", _furnish)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
