"""Look at the built book as a reader does: every page in headless Chromium at 1280 x 800, and
at a phone's width, 390 pixels.

Reports code and output blocks and tables that scroll sideways, error outputs longer than three
lines, solution outputs visible while their toggles are closed and lines of text that start
with Chinese closing punctuation, and how many monospace columns fit in a code block; at 390
pixels, where 88 columns cannot fit, only lines that start with Chinese punctuation. Then, read
from the HTML files, every link of the edition to one of its pages or to a place on one (a
`#fragment`) that does not resolve; and, for the Chinese edition, whether its search page finds
the page of a Chinese word or phrase (the index holds Chinese words only when Sphinx can
segment them, with `jieba` and the dictionary that `tools/i18n.py` writes; a query typed without
spaces, "KV缓存", finds them only through `_static/zh_search.js`). Exit status 1 if anything is
found. Run `make book` (or `make book-zh`, for `--edition zh`) first.

Needs what `make test` does not: `pip install playwright`, a Chromium (Debian's `chromium`
package, passed with --chromium; playwright's own download works too) and, for the Chinese
edition, a CJK font (Debian's `fonts-noto-cjk`; without one Chinese is drawn as boxes of
another width, and where lines break means nothing):
  apt-get install chromium fonts-noto-cjk && pip install playwright

Usage: python tools/check_pages.py [--edition en|zh] [--chromium /usr/bin/chromium] [--width 1280]
"""

from __future__ import annotations

import argparse
import re
import sys
from html import unescape
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
PAGE_JS = r"""
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  await document.fonts.ready;
  const shown = e => e.offsetParent !== null && e.innerText.trim().length > 0;
  const scrolling = [...document.querySelectorAll('.bd-article pre')]
    .filter(p => shown(p) && p.scrollWidth > p.clientWidth + 1)
    .map(p => p.innerText.split('\n').reduce((a, b) => (b.length > a.length ? b : a), ''));
  const tables = [...document.querySelectorAll('.bd-article .pst-scrollable-table-container')]
    .filter(t => shown(t) && t.scrollWidth > t.clientWidth + 1)
    .map(t => `${t.scrollWidth} px in ${t.clientWidth}: ` + t.innerText.slice(0, 40));
  // A closing punctuation mark that starts a line: its box is below the character before it.
  const starts = [];
  const walker = document.createTreeWalker(document.querySelector('.bd-article') || document.body,
                                           NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  const box = (node, i) => { range.setStart(node, i); range.setEnd(node, i + 1);
                             return range.getClientRects()[0]; };
  let previous = null;  // the box of the last character drawn
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.parentElement.closest('pre, mjx-container, script, style')) continue;
    const before = node.previousSibling;  // math, code or a link drawn just before this text
    if (before && before.nodeType === 1 && before.getClientRects().length) {
      previous = [...before.getClientRects()].pop();
    }
    for (let i = 0; i < node.data.length; i++) {
      if (/\s/.test(node.data[i])) continue;
      const r = box(node, i);
      if (!r || r.width === 0) continue;
      if ('，。；：、）！？」』】》'.includes(node.data[i]) && previous
          && r.top >= previous.bottom - 1) {
        starts.push(node.data.slice(i, i + 20));
      }
      previous = r;
    }
  }
  const tracebacks = [...document.querySelectorAll('.bd-article .output.traceback')]
    .filter(shown).map(e => e.innerText.trim().split('\n').length).filter(n => n > 3);
  const exercises = document.querySelector('section#exercises');
  const answers = exercises ? [...exercises.querySelectorAll('.cell_output')].filter(shown)
    .map(e => e.innerText.slice(0, 60)) : [];
  let columns = null;
  const code = document.querySelector('.bd-article div.cell_input pre');
  if (code) {
    const probe = document.createElement('span');
    probe.textContent = 'x'.repeat(100);
    code.appendChild(probe);
    const width = probe.getBoundingClientRect().width / 100;
    probe.remove();
    const style = getComputedStyle(code);
    columns = Math.floor((code.clientWidth - parseFloat(style.paddingLeft)
                          - parseFloat(style.paddingRight)) / width);
  }
  return {scrolling, tables, starts, tracebacks, answers, columns};
}
"""
PHONE = 390  # pixels: a phone held upright
# A query of the Chinese book, and a page that must be among its search results: words of the
# glossary, words of the titles (运行时, 训练脚本, 微批量: jieba cuts them in two without the
# dictionary tools/i18n.py writes) and queries typed without spaces (KV缓存, 恢复训练: one word
# to Sphinx's own splitQuery, which the index does not hold).
SEARCHES = {"缓存": "chapters/16_generation.html", "滑动窗口": "chapters/16_generation.html",
            "归约散射": "chapters/25_distributed.html", "运行时": "chapters/29_runtime.html",
            "训练脚本": "chapters/28_runs.html", "微批量": "chapters/25_distributed.html",
            "KV缓存": "chapters/16_generation.html", "恢复训练": "chapters/28_runs.html"}
SEARCH_JS = r"""
async () => {
  // the summary line is written once the last result is shown
  const summary = () => document.querySelector('#search-results p.search-summary');
  const done = () => summary() && summary().innerText.trim() !== '';
  for (let i = 0; i < 200 && !done(); i++) await new Promise(r => setTimeout(r, 100));
  return [...document.querySelectorAll('#search-results ul.search li a')]
    .map(a => a.getAttribute('href'));
}
"""
ID = re.compile(r"""\sid=["']([^"']+)["']""")
HREF = re.compile(r"""<a\s[^>]*?href=["']([^"']*)["']""")


def broken_links(html: Path, pages: list[Path]) -> list[str]:
    """Links from `pages` to a page of the book under `html`, or a #fragment of one, that do
    not resolve: 'page: href'. Links elsewhere (the web, the other edition) are left out."""
    ids: dict[Path, set[str]] = {}
    broken = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for href in {unescape(h) for h in HREF.findall(text)}:
            url = urlsplit(href)
            if url.scheme or url.netloc or href.startswith(("mailto:", "javascript:")):
                continue
            target = (page.parent / unquote(url.path) if url.path else page).resolve()
            if not target.is_relative_to(html.resolve()) or target.suffix != ".html":
                continue  # the other edition, a source file, an image
            if not target.exists():
                broken.append(f"{page.relative_to(html)}: {href}")
                continue
            if url.fragment:
                if target not in ids:
                    ids[target] = set(ID.findall(target.read_text(encoding="utf-8")))
                if unquote(url.fragment) not in ids[target]:
                    broken.append(f"{page.relative_to(html)}: {href}")
    return broken


def search_found(word: str, expected: str, hrefs: list[str]) -> tuple[bool, str]:
    """Whether a search's result links (hrefs of search.html, with `?highlight=` and `#`)
    include the expected page, and the line that says so."""
    pages = [h.split("#")[0].split("?")[0] for h in hrefs]
    ok = expected in pages
    return ok, f"search for {word}: {len(pages)} pages" + (
        "" if ok else f"; {expected} is not among them")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edition", choices=["en", "zh"], default="en",
                        help="the English book (_build/html) or the Chinese (_build/zh/html)")
    parser.add_argument("--chromium", default=None, help="path of a Chromium executable")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    args = parser.parse_args()
    html = ROOT / "_build" / ("html" if args.edition == "en" else "zh/html")
    skip = {"index.html", "genindex.html", "search.html"}  # a redirect and generated lists
    pages = sorted(html.glob("chapters/*.html")) + sorted(
        p for p in html.glob("*.html") if p.name not in skip)
    if not pages:
        print(f"no pages in {html.relative_to(ROOT)}: run `make book` or `make book-zh` first")
        return 1
    from playwright.sync_api import sync_playwright  # not in .venv: see the docstring

    problems = 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium)
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        phone = browser.new_page(viewport={"width": PHONE, "height": 844})
        for path in pages:
            page.goto(path.as_uri())
            found = page.evaluate(PAGE_JS)
            phone.goto(path.as_uri())
            narrow = phone.evaluate(PAGE_JS)["starts"]
            bad = sum(len(found[k]) for k in ("scrolling", "tables", "starts", "tracebacks",
                                              "answers")) + len(narrow)
            problems += bad
            columns = found["columns"] if found["columns"] is not None else "-"
            print(f"{path.relative_to(html)}: {columns} columns fit; {bad} problems")
            for line in found["scrolling"]:
                print(f"  scrolls sideways: {line[:70]!r}")
            for text in found["tables"]:
                print(f"  a table scrolls sideways: {text!r}")
            for text in found["starts"]:
                print(f"  a line starts with punctuation: {text!r}")
            for text in narrow:
                print(f"  at {PHONE} pixels, a line starts with punctuation: {text!r}")
            for n in found["tracebacks"]:
                print(f"  an error output of {n} lines")
            for text in found["answers"]:
                print(f"  an answer shown under a closed solution: {text!r}")
        if args.edition == "zh":
            for word, expected in SEARCHES.items():
                page.goto((html / "search.html").as_uri() + "?q=" + quote(word))
                ok, line = search_found(word, expected, page.evaluate(SEARCH_JS))
                problems += not ok
                print(line)
        browser.close()
    broken = broken_links(html, pages + [html / "index.html"])
    for link in broken:
        print(f"  a link that does not resolve: {link}")
    problems += len(broken)
    print(f"links within the edition: {len(broken)} that do not resolve")
    print(f"{len(pages)} pages at {args.width} x {args.height} and at {PHONE} pixels: "
          f"{problems} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
