"""Re-run chapters in place (fresh kernel, top to bottom) so their stored outputs are current.

Usage: python tools/execute.py [chapters/NN_name.ipynb ...]   (default: every chapter)
"""

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=900,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # cells tagged raises-exception may raise; any other error stops here
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or sorted((ROOT / "chapters").glob("*.ipynb"))
    for path in paths:
        start = time.perf_counter()
        execute(path)
        print(f"{path}: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
