"""make gpu-check on the CPU: its plan fits two calls of a lent GPU, it tests every test that
depends on the device, and its report keeps what a part stopped at its limit had done.
(The calls themselves need CUDA; a GPU session runs them, benchmarks/results/ keeps the
reports.)"""

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


gc = _load("gpu_check")


def test_the_plan_fits_two_calls_with_a_margin():
    durations = gc.read_durations()
    calls = gc.plan(durations)
    assert sorted(calls) == [1, 2]
    for call, rows in calls.items():
        assert gc.SETUP_SECONDS + sum(limit for _, limit, *_ in rows) <= gc.CALL_SECONDS
        for name, limit, files, basis, left in rows:
            assert gc.PARTS[name][0] == call and basis
            if name in ("flash", "gpu", "decode"):  # limit = expected x margin
                assert limit >= gc.MARGIN * durations["parts"][name]["seconds"] - 1
            else:  # the files kept are expected to end within the limit, with the margin
                seconds = gc._files_of(files, durations)
                assert gc.PYTEST_START + gc.MARGIN * gc.makespan(
                    list(seconds.values()), gc.WORKERS) <= limit
    chapters = {str(p.relative_to(ROOT)) for p in (ROOT / "chapters").glob("*.ipynb")}
    kept_and_left = {name: set(files) | set(left) for name, _, files, _, left
                     in calls[2]}
    assert kept_and_left["chapters"] == chapters
    assert kept_and_left["tests"] == set(gc.DEVICE_TESTS)
    # every chapter and device test has a measured duration
    assert chapters | {t.split("::")[0] for t in gc.DEVICE_TESTS} <= set(durations["files"])


def test_the_plan_is_printed_and_says_it_fits():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"),
                           "--plan"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"call 1 \(the figures\): \d+ s of 360, fits: True", lines[1])
    assert sum(line.startswith("call 2 (the book on CUDA)") for line in lines) == 1
    assert "make gpu-check CALL=2 PYTHON=python3 WHEELS=.whl OUT=$OUT" in done.stdout
    for part in gc.PARTS:
        assert re.search(rf"^  {part} +limit +\d+ s: \S", done.stdout, re.M), part


def test_makespan_and_fit_by_hand():
    # longest first, each to the least loaded worker: 5 | 4, then 5 | 7, 8 | 7, 8 | 10
    assert gc.makespan([5, 4, 3, 3, 3], 2) == 10
    assert gc.makespan([7], 8) == 7 and gc.makespan([], 3) == 0
    files = {"a": 100.0, "b": 50.0, "c": 10.0}
    limit = gc.PYTEST_START + gc.MARGIN * 100
    assert gc.fit(files, limit, workers=2) == (["a", "b", "c"], [])
    assert gc.fit(files, limit - 1, workers=2) == (["b", "c"], ["a"])


def _tests_that_read_cuda() -> set[str]:
    """Test modules (whole) and tests that call torch.cuda.is_available()."""
    found = set()
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        if path.name == "test_gpu_check.py":  # this file names the call it looks for
            continue
        tree = ast.parse(path.read_text())
        name = str(path.relative_to(ROOT))
        for node in tree.body:
            text = ast.get_source_segment(path.read_text(), node) or ""
            if "cuda.is_available()" not in text:
                continue
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found.add(f"{name}::{node.name}")
            elif not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found.add(name)  # module level: DEVICE, pytestmark
            elif isinstance(node, ast.FunctionDef):  # a helper: the tests that call it
                found |= {f"{name}::{t.name}" for t in tree.body
                          if isinstance(t, ast.FunctionDef) and t.name.startswith("test_")
                          and node.name in ast.get_source_segment(path.read_text(), t)}
    return found


def test_every_test_that_depends_on_the_device_runs_on_the_gpu():
    """A new test that reads torch.cuda.is_available() would otherwise never run on a GPU
    (CI has none); one that only needs two GPUs is left to a machine that has them."""
    selected = set(gc.DEVICE_TESTS)
    missing = {t for t in _tests_that_read_cuda()
               if t not in selected and t.split("::")[0] not in selected}
    assert not missing, missing


def test_outcomes_are_read_from_a_log_cut_short():
    log = ("[gw0] [  5%] PASSED tests/test_device.py::test_logits[eager]\n"
           "[gw1] [ 10%] FAILED tests/test_init.py::test_get_device\n"
           "[gw0] [ 15%] SKIPPED tests/test_device.py::test_two_gpus\n"
           "[gw1] [ 20%] PASSED chapters/01_init::ipynb::Cell 3 \n"
           "[gw0] [ 25%] PAS")  # killed while writing
    assert gc.outcomes(log) == {"tests/test_device.py::test_logits[eager]": "PASSED",
                                "tests/test_init.py::test_get_device": "FAILED",
                                "tests/test_device.py::test_two_gpus": "SKIPPED",
                                "chapters/01_init::ipynb::Cell 3": "PASSED"}


def test_the_report_reads_the_figures_the_benchmarks_print():
    """The lines the benchmarks print (their own formatting functions and strings), read
    back into the targets; a part killed at its limit still counts what passed."""
    fa = _load("flash_attention")
    row = {"flash fwd": 2.0, "sdpa fwd": 1.8, "sdpa/flash fwd": 0.9, "flash fwd+bwd": 8.0,
           "sdpa fwd+bwd": 7.16, "sdpa/flash fwd+bwd": 0.8951, "agrees": True}
    flash = (fa.leaderboard_line(row, "torch.compile(apply)") + "\nautotuner's choices "
             "at 16 x 16,384 x 64, bf16, causal, in the eager run (Inductor tunes the "
             "compiled one apart) (B_q, B_k, warps, stages): forward "
             "(64, 64, 4, 3), backward (32, 128, 8, 3)\n")
    gpu = ("tlm eager                            52.1 ms    314,471  40.1%   9.9 GiB\n"
           "tlm compiled                         40.0 ms    409,600  52.3%   8.0 GiB\n")
    decode = "tlm compiled       620.0      0.210\nHF generate        130.0      1.000\n"
    parts = {name: dict(name=name, status=0, seconds=10, limit=20, text=text)
             for name, text in (("flash", flash), ("gpu", gpu), ("decode", decode))}
    parts["tests"] = dict(name="tests", status="timed out", seconds=60, limit=60,
                          text="[gw0] [  5%] PASSED tests/test_init.py::test_a\n"
                               "[gw1] [ 10%] FAILED tests/test_init.py::test_b\n")
    text = gc.report(2, parts, {"chapters": ["chapters/17_text_training.ipynb"]},
                     "NVIDIA H200, torch 2.11.0", "2026-11-28 10:00")
    assert "| tests | FAILED (timed out) | 60 s | 60 s | 1 / 1 / 0 |" in text
    assert "## tests: failed\n\n- tests/test_init.py::test_b" in text
    assert ("Left out of chapters (they do not fit its limit): "
            "chapters/17_text_training.ipynb") in text
    assert "forward 2.00 ms against sdpa's 1.80 ms (medians), 0.900x sdpa's speed (target " \
           ">= 1.0x): False" in text
    assert ("forward + backward, as the leaderboard's harness times it: 8.00 ms against 7.16 "
            "ms, 0.895x (target >= 0.9x): False") in text  # not rounded up to 0.90
    assert "- autotuner's choices at 16 x 16,384 x 64" in text
    assert "compiled training step at the GPT-2-small shape: 52.3% MFU" in text
    assert "| tlm compiled | 40.0 ms | 409,600 | 52.3% |" in text
    assert "compiled decoding: 620 tokens/s, HF generate 130: 4.77x" in text


def test_no_git_is_no_failure(monkeypatch, tmp_path):
    monkeypatch.setattr(gc, "ROOT", tmp_path)  # a copy of the tree, not a repository
    assert gc.git_commit() is None
    monkeypatch.setenv("PATH", str(tmp_path))  # and no git program at all
    assert gc.git_commit() is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without CUDA")
def test_a_call_without_cuda_is_one_line_and_status_2(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"),
                           "--call", "1", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stderr == ""
    assert done.stdout == ("make gpu-check: needs a CUDA GPU, and this machine has none "
                           "(nothing run)\n")
    assert list(tmp_path.iterdir()) == []


def test_durations_are_read_from_junit_xml(tmp_path):
    """pytest's JUnit XML: a test file's tests and a notebook's cells add up."""
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_device" name="test_a" time="1.5" />'
        '<testcase classname="tests.test_device" name="test_b" time="2.0" />'
        '<testcase classname="tests.test_runtime" name="test_deterministic_on_cuda_'
        'resumes_bit_for_bit[a]" time="1.5" />'
        '<testcase classname="tests.test_runtime" name="test_deterministic_on_cuda_'
        'resumes_bit_for_bit[b]" time="2.5" />'
        '<testcase classname="chapters.01_init.ipynb" name="Cell 0" time="3.0" />'
        '<testcase classname="chapters.01_init.ipynb" name="Cell 1" time="0.25" />'
        '</testsuite></testsuites>')
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"files": {"tests/test_device.py": {
        "seconds": 99, "measured": "old"}}, "parts": {"flash": {"seconds": 1}}}))
    found = gc.record_durations([junit], "here, today", path)
    assert found["files"] == {
        "tests/test_device.py": {"seconds": 3.5, "measured": "here, today"},
        "tests/test_runtime.py": {"seconds": 4.0, "measured": "here, today"},
        "tests/test_runtime.py::test_deterministic_on_cuda_resumes_bit_for_bit": {
            "seconds": 4.0, "measured": "here, today"},
        "chapters/01_init.ipynb": {"seconds": 3.2, "measured": "here, today"}}
    assert found["parts"] == {"flash": {"seconds": 1}}
    assert json.loads(path.read_text()) == found
