"""Refresh the quotes of stored notebook outputs in README.md and benchmarks/README.md, so that
they and the chapters show the same numbers.

A quote is a fenced block under a comment that names a chapter and a marker: a piece of the
source of the one code cell whose printed output the block repeats.

    <!-- stored output: chapters/20_performance.ipynb | repeats=7 -->
    ```text
    ...
    ```

Usage: python tools/quote_outputs.py           rewrite the quotes in both files
       python tools/quote_outputs.py --check   exit 1 if a quote differs from its chapter
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
QUOTE = re.compile(r"(<!-- stored output: (\S+\.ipynb) \| (.+?) -->\n```text\n)(.*?)(```)",
                   re.S)


def cell_output(chapter: str, marker: str) -> str:
    """The printed (stream) output of the one code cell of `chapter` containing `marker`."""
    cells = [c for c in nbformat.read(ROOT / chapter, as_version=4).cells
             if c.cell_type == "code" and marker in c.source]
    if len(cells) != 1:
        raise ValueError(f"{chapter}: {len(cells)} code cells contain {marker!r}, not one")
    text = "".join(o.get("text", "") for o in cells[0].outputs if o.output_type == "stream")
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def refresh(text: str) -> str:
    """`text` with every quote replaced by the current output of its cell."""
    return QUOTE.sub(lambda m: m[1] + cell_output(m[2], m[3]) + m[5], text)


FILES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]  # the pages that quote


def main(argv: list[str]) -> int:
    stale = []
    for path in FILES:
        text = path.read_text()
        new = refresh(text)
        if new == text:
            continue
        if "--check" in argv:
            stale.append(path.relative_to(ROOT).as_posix())
        else:
            path.write_text(new)
            print(f"{path.relative_to(ROOT)}: {len(QUOTE.findall(text))} quotes refreshed")
    if stale:
        print(f"{', '.join(stale)} quote outputs that the chapters no longer print; "
              "run `python tools/quote_outputs.py`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
