import os
from pathlib import Path

import pytest
import torch

# Without CUDA, Triton's kernels (tlm.flash_triton) run in its interpreter, which
# triton.jit chooses when it wraps them, at `import tlm`: before anything imports it, this
# file's own imports included (tests/test_flash_attention.py checks that it was).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tiny_runs import make_data_dir, make_run_dir  # noqa: E402 (imports tlm)


# The files that take longest (pytest's durations, measured), handed out first: xdist gives
# each of the two workers whole files in the order collected. The Makefile turns off its
# reordering by number of tests, which put test_standalone.py (4 tests, 98 s) 42nd of 53
# files and took 68 s more. The rest follow in their order.
LONGEST_FIRST = (
    "chapters/17_text_training.ipynb",  # a 150-step training and a 50-step run
    "tests/test_distributed.py",  # 150 s: processes that train together
    "tests/test_train.py",  # 113 s
    "tests/test_standalone.py",  # 98 s: three chapters in a bare venv
    "chapters/26_cli.ipynb",  # 97 s
    "chapters/20_performance.ipynb",  # 85 s
    "chapters/18_writing.ipynb",  # 82 s
    "chapters/25_distributed.ipynb",  # 78 s
    "chapters/14_tokenizer.ipynb",  # 53 s
    "chapters/19_scaling.ipynb",  # 50 s: one run of the study again, and the fits
    "chapters/15_training.ipynb",  # 44 s
    "chapters/16_generation.ipynb",  # 42 s
)


def pytest_collection_modifyitems(config, items):
    root = Path(config.rootpath)
    missing = [name for name in LONGEST_FIRST if not (root / name).is_file()]
    if missing:  # a renamed file would silently lose its place
        raise pytest.UsageError(f"tests/conftest.py: LONGEST_FIRST names no file "
                                f"{', '.join(missing)}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class RecordCalls(torch.overrides.TorchFunctionMode):
    """While active, records every torch function called (including torch.nn.functional)."""

    def __init__(self):
        super().__init__()
        self.called = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.called.append(func)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def record_calls():
    return RecordCalls


# The byte-level data directory and 30-step run of tests/tiny_runs.py, for the tests of
# `tlm train`, `tlm generate` and `tlm data` (test_train, test_run, test_runtime, test_cli).
@pytest.fixture
def data_dir(tmp_path) -> Path:
    return make_data_dir(tmp_path / "data")


@pytest.fixture
def run_dir(data_dir, tmp_path) -> Path:
    return make_run_dir(data_dir, tmp_path / "run")
