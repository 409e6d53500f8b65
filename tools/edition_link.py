"""A Sphinx extension: a banner on every page linking to the same page in the other edition.

The English book is built into `_build/html`, the Chinese one into `_build/zh/html`.
`edition_link` is the banner's HTML with `{href}` where the link goes; `edition_link_root` is the
other edition's root relative to this one's. The link is written into each page when it is
built, so it works offline and without JavaScript.
"""

from __future__ import annotations

from html import escape


def _banner(app, pagename, templatename, context, doctree):
    text, root = app.config.edition_link, app.config.edition_link_root
    if not text:
        return
    href = "../" * pagename.count("/") + root + pagename + ".html"
    context["theme_announcement"] = text.format(href=escape(href, quote=True))


def setup(app):
    app.add_config_value("edition_link", "", "html")
    app.add_config_value("edition_link_root", "", "html")
    app.connect("html-page-context", _banner)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
