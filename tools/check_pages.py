"""Look at the built book as a reader does: every page in headless Chromium at 1280 x 800.

Reports code and output blocks that scroll sideways, error outputs longer than three lines and
solution outputs visible while their toggles are closed, and how many monospace columns fit in
a code block. Exit status 1 if anything is found. Run `make book` first.

Needs what `make test` does not: `pip install playwright` and a Chromium (Debian's `chromium`
package, passed with --chromium; playwright's own download works too).

Usage: python tools/check_pages.py [--chromium /usr/bin/chromium] [--width 1280]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
PAGE_JS = r"""
() => {
  const shown = e => e.offsetParent !== null && e.innerText.trim().length > 0;
  const scrolling = [...document.querySelectorAll('.bd-article pre')]
    .filter(p => shown(p) && p.scrollWidth > p.clientWidth + 1)
    .map(p => p.innerText.split('\n').reduce((a, b) => (b.length > a.length ? b : a), ''));
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
  return {scrolling, tracebacks, answers, columns};
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default=None, help="path of a Chromium executable")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    args = parser.parse_args()
    html = ROOT / "_build" / "html"
    skip = {"index.html", "genindex.html", "search.html"}  # a redirect and generated lists
    pages = sorted(html.glob("chapters/*.html")) + sorted(
        p for p in html.glob("*.html") if p.name not in skip)
    if not pages:
        print("no pages in _build/html: run `make book` first")
        return 1
    problems = 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium)
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        for path in pages:
            page.goto(path.as_uri())
            found = page.evaluate(PAGE_JS)
            bad = len(found["scrolling"]) + len(found["tracebacks"]) + len(found["answers"])
            problems += bad
            columns = found["columns"] if found["columns"] is not None else "-"
            print(f"{path.relative_to(html)}: {columns} columns fit; {bad} problems")
            for line in found["scrolling"]:
                print(f"  scrolls sideways: {line[:70]!r}")
            for n in found["tracebacks"]:
                print(f"  an error output of {n} lines")
            for text in found["answers"]:
                print(f"  an answer shown under a closed solution: {text!r}")
        browser.close()
    print(f"{len(pages)} pages at {args.width} x {args.height}: {problems} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
