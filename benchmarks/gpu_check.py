"""make gpu-check: the book's GPU half, in two calls that each fit one command of a lent GPU.

Usage:
  python benchmarks/gpu_check.py --plan            the two calls, each part's time limit and
                                                   the durations it comes from (no GPU needed)
  python benchmarks/gpu_check.py --call 1|2 [--out DIR] [--wheels DIR] [--commit ID]
  python benchmarks/gpu_check.py --durations FILE.xml ...   record measured durations

A lent GPU runs one command for at most 10 minutes, and a session has 15 minutes of device
time, the machine's start included: two calls of at most CALL_SECONDS each, one after the
other. Each call runs its parts in order, each with its own time limit and log; a part that
fails or runs out of time does not stop the next.
  call 1, the figures:
    flash     benchmarks/flash_attention.py --gpu-check: the Triton kernels against sdpa's
              FlashAttention-2 backend at the Spring 2025 leaderboard's shape, timed as
              that harness times it, the autotuner's choices, then 16 heads of 4,096
    gpu       benchmarks/gpu.py --no-decode: training steps at the GPT-2-small shape
  call 2, the book on CUDA:
    tests     the tests whose outcome depends on the device (DEVICE_TESTS), TLM_DEVICE=cuda
    chapters  the chapters under nbval, TLM_DEVICE=cuda, against the stored outputs
    decode    benchmarks/decode.py --device cuda: compiled decoding against Hugging Face
Each part's limit comes from benchmarks/gpu_check_durations.json: the tests' durations, per
test file (or test) measured from pytest's JUnit XML, and the benchmarks' expected ones
(estimates, stated as such, until a GPU has run them), times a margin; the chapters get what
is left of the call. A chapter or test file that does not fit its part's limit is left out,
and the plan and the report name it. pytest parts print each test's
outcome as it ends (-v), so a part stopped at its limit still reports what passed.
Each call writes DIR/gpu-check-<date>-<time>-call<N>.md (default DIR: benchmarks/results; a
second run writes a new report), with each part's log and JUnit XML in the folder of the
same name: the GPU, torch and Triton measured (and whether they are the pinned ones), each
part's verdict, time and limit, what was left out, the figures against their targets, the
autotuner's choices, the README's GPU table filled in. No step needs git (--commit names the
tree). Without CUDA, --call prints one line and exits with status 2.
--wheels DIR: first install the wheels in DIR (the test tools and data packages a machine
without a package registry lacks; see benchmarks/gpu-check-requirements.txt) into a folder
on PYTHONPATH.
"""

import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / "benchmarks" / "gpu_check_durations.json"
CALL_SECONDS = 360  # one call: 2 x 6 min and a machine's start fit 15 device-minutes
SETUP_SECONDS = 30  # of a call, before its parts: installing the wheels, importing torch
MARGIN = 1.3  # a part's limit: its expected duration times this
WORKERS = 8  # pytest-xdist workers of a pytest part (the lent machine has 16 cores)
PYTEST_START = 25  # seconds before a pytest part's first test: workers start, collect
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "nbval_sanitize.cfg"]
# The tests whose outcome depends on the device: the modules and tests that read
# torch.cuda.is_available() (tests/test_gpu_check.py checks that none is missing).
DEVICE_TESTS = [
    "tests/test_device.py", "tests/test_flash_attention.py", "tests/test_init.py",
    "tests/test_cli.py::test_doctor_reports_what_is_installed",
    "tests/test_runtime.py::test_a_device_this_machine_lacks_is_one_line",
    "tests/test_runtime.py::test_deterministic_on_cuda_refuses_another_cublas_workspace",
    "tests/test_runtime.py::test_deterministic_on_cuda_resumes_bit_for_bit"]
# name: (call, command after the interpreter); a pytest part's files come from the plan
PARTS = {
    "flash": (1, ["benchmarks/flash_attention.py", "--gpu-check"]),
    "gpu": (1, ["benchmarks/gpu.py", "--no-decode"]),
    # each test to the next free worker: on a GPU the flash tests compile many kernels
    "tests": (2, ["-m", "pytest", "-v", "-n", str(WORKERS), "--dist", "load"]),
    "chapters": (2, ["-m", "pytest", "-v", "-n", str(WORKERS), "--dist", "loadfile",
                     *NBVAL]),
    "decode": (2, ["benchmarks/decode.py", "--device", "cuda", "--repeats", "3",
                   "--new-tokens", "128"]),
}
CALLS = {1: "the figures", 2: "the book on CUDA"}
TARGETS = {"flash": 1.0, "flash fwd+bwd": 0.9, "gpu": 0.45, "decode": 3.0}
PINNED = {"torch": "2.13.0", "triton": "3.9.0"}  # requirements.txt


def read_durations(path: Path = DURATIONS) -> dict:
    return json.loads(path.read_text())


def makespan(seconds: list[float], workers: int) -> float:
    """When the last of these files ends, each whole on one of `workers` workers, the
    longest first (as --dist loadfile hands them out in the order given)."""
    loads = [0.0] * workers
    for s in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += s
    return max(loads)


def fit(files: dict[str, float], limit: float, workers: int = WORKERS
        ) -> tuple[list[str], list[str]]:
    """The files that fit a pytest part's limit (expected time, with the margin, within
    it), the longest first, and those left out."""
    kept, left = [], []
    for name in sorted(files, key=files.get, reverse=True):
        trial = [files[n] for n in kept + [name]]
        if PYTEST_START + MARGIN * makespan(trial, workers) <= limit:
            kept.append(name)
        else:
            left.append(name)
    return kept, left


def _files_of(selection: list[str], durations: dict) -> dict[str, float]:
    """Measured seconds of each test file or test id in `selection` (a test id: its
    file's, when the test alone was not measured)."""
    measured = durations["files"]
    return {name: measured.get(name, measured.get(name.split("::")[0], {})).get(
        "seconds", 60.0) for name in selection}


def plan(durations: dict) -> dict:
    """Each call's parts: {call: [(part, limit, argv tail, basis, left out)]}."""
    chapters = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "chapters").glob("*.ipynb"))
    calls = {}
    for call in CALLS:
        left = CALL_SECONDS - SETUP_SECONDS
        rows, pytest_parts = [], []
        for name, (c, _) in PARTS.items():
            if c != call:
                continue
            if name in ("tests", "chapters"):
                pytest_parts.append(name)
                continue
            expected = durations["parts"][name]["seconds"]
            limit = math.ceil(MARGIN * expected)
            rows.append((name, limit, [], durations["parts"][name]["basis"], []))
            left -= limit
        if "tests" in pytest_parts:
            files = _files_of(DEVICE_TESTS, durations)
            limit = math.ceil(PYTEST_START + MARGIN * makespan(list(files.values()),
                                                               WORKERS))
            kept, out = fit(files, limit)
            rows.insert(0, ("tests", limit, kept,
                            _basis(files, kept, durations), out))
            left -= limit
        if "chapters" in pytest_parts:
            files = _files_of(chapters, durations)
            kept, out = fit(files, left)
            rows.insert(1, ("chapters", left, kept, _basis(files, kept, durations),
                            out))
        calls[call] = rows
    return calls


def _basis(files: dict[str, float], kept: list[str], durations: dict) -> str:
    where = sorted({durations["files"].get(n.split("::")[0], {}).get("measured", "never")
                    for n in kept})
    longest = max(kept, key=files.get) if kept else None
    return (f"{len(kept)} of {len(files)}, {sum(files[n] for n in kept):.0f} s in all "
            f"(longest {longest} {files.get(longest, 0):.0f} s), expected "
            f"{makespan([files[n] for n in kept], WORKERS):.0f} s on {WORKERS} workers, "
            f"+ {PYTEST_START} s to start; measured {'; '.join(where)}")


def print_plan(calls: dict) -> bool:
    """Print the plan; whether each call fits CALL_SECONDS."""
    ok = True
    print(f"make gpu-check: {len(calls)} calls of at most {CALL_SECONDS} s each "
          f"({SETUP_SECONDS} s of them to set up), limits = expected x {MARGIN}")
    for call, rows in calls.items():
        total = SETUP_SECONDS + sum(limit for _, limit, *_ in rows)
        fits = total <= CALL_SECONDS
        ok &= fits
        print(f"call {call} ({CALLS[call]}): {total} s of {CALL_SECONDS}, fits: {fits}")
        wheels = " WHEELS=.whl" if call == 2 else ""  # the test tools, the data
        print(f"  command: make gpu-check CALL={call} PYTHON=python3{wheels} OUT=$OUT")
        for name, limit, _, basis, out in rows:
            print(f"  {name:8s} limit {limit:3d} s: {basis}")
            if out:
                print(f"  {'':8s} left out: {', '.join(out)}")
    return ok


def run_part(name: str, argv: list[str], limit: float, log: Path, env: dict) -> dict:
    """Run one part with a time limit; its output goes to log. Returns its record."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the part and what it started (pytest's workers)
            proc.wait()
            status = "timed out"
    seconds = time.perf_counter() - start
    text = log.read_text(errors="replace")
    print(f"{name}: {'passed' if status == 0 else f'FAILED ({status})'} in {seconds:.0f} s "
          f"(limit {limit:.0f} s)", flush=True)
    return dict(name=name, status=status, seconds=seconds, limit=limit, text=text)


OUTCOME = re.compile(r"\b(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (\S+::.*?)\s*$")


def outcomes(text: str) -> dict[str, str]:
    """Each test's outcome, from pytest -v's lines (with xdist: "[gw0] [ 5%] PASSED
    tests/x.py::test_y"), as far as the log goes."""
    found = {}
    for line in text.splitlines():
        if m := OUTCOME.search(line):
            found.setdefault(m[2], m[1])
    return found


def figures(parts: dict) -> dict:
    """The target figures read from the parts' outputs (absent where a part did not
    print them)."""
    found = {}
    flash = parts.get("flash", {}).get("text", "")
    if m := re.search(r"leaderboard: flash fwd ([\d.]+) ms, sdpa ([\d.]+) ms, sdpa/flash "
                      r"([\d.]+); fwd\+bwd ([\d.]+) ms, sdpa ([\d.]+) ms, sdpa/flash "
                      r"([\d.]+)", flash):
        found["flash"] = dict(fwd_ms=float(m[1]), sdpa_fwd_ms=float(m[2]),
                              fwd_ratio=float(m[3]), ms=float(m[4]), sdpa_ms=float(m[5]),
                              ratio=float(m[6]))
    if m := re.search(r"^autotuner's choices.*$", flash, re.M):
        found["choices"] = m[0]
    gpu = parts.get("gpu", {}).get("text", "")
    rows = re.findall(r"^(tlm eager|HF eager|tlm compiled|HF compiled|tlm eager, tlm\.AdamW"
                      r" \+ clipping)\s+([\d.]+) ms\s+([\d,]+)\s+([\d.]+)%", gpu, re.M)
    if rows:
        found["gpu"] = {name: dict(ms=float(ms), tokens=int(tok.replace(",", "")),
                                   mfu=float(mfu) / 100) for name, ms, tok, mfu in rows}
    decode = parts.get("decode", {}).get("text", "")
    rates = dict(re.findall(r"^(tlm plain loop|tlm eager|HF generate|tlm compiled)\s+"
                            r"([\d.]+)", decode, re.M))
    if rates:
        found["decode"] = {name: float(rate) for name, rate in rates.items()}
    return found


def _against_targets(found: dict) -> list[str]:
    lines = []
    if "flash" in found:
        f = found["flash"]
        lines += [f"- FlashAttention at the Spring 2025 leaderboard shape: forward "
                  f"{f['fwd_ms']:.2f} ms against sdpa's {f['sdpa_fwd_ms']:.2f} ms (medians), "
                  f"{f['fwd_ratio']:.3f}x sdpa's speed (target >= {TARGETS['flash']}x): "
                  f"{f['fwd_ratio'] >= TARGETS['flash']}",
                  f"- forward + backward, as the leaderboard's harness times it: "
                  f"{f['ms']:.2f} ms against {f['sdpa_ms']:.2f} ms, {f['ratio']:.3f}x "
                  f"(target >= {TARGETS['flash fwd+bwd']}x): "
                  f"{f['ratio'] >= TARGETS['flash fwd+bwd']}"]
    if "choices" in found:
        lines.append(f"- {found['choices']}")
    if "gpu" in found and "tlm compiled" in found["gpu"]:
        mfu = found["gpu"]["tlm compiled"]["mfu"]
        lines.append(f"- compiled training step at the GPT-2-small shape: {mfu:.1%} MFU "
                     f"(target >= {TARGETS['gpu']:.0%}): {mfu >= TARGETS['gpu']}")
    if "decode" in found and {"tlm compiled", "HF generate"} <= set(found["decode"]):
        d = found["decode"]
        ratio = d["tlm compiled"] / d["HF generate"]
        lines.append(f"- compiled decoding: {d['tlm compiled']:.0f} tokens/s, HF generate "
                     f"{d['HF generate']:.0f}: {ratio:.2f}x (target >= "
                     f"{TARGETS['decode']}x): {ratio >= TARGETS['decode']}")
    return lines


def report(call: int, parts: dict, left_out: dict, machine: str, when: str) -> str:
    """The report's Markdown."""
    lines = [f"# make gpu-check, call {call} ({CALLS[call]}), {when}", "", machine, "",
             "| part | verdict | time | limit | tests passed / failed / skipped |",
             "|---|---|---|---|---|"]
    for p in parts.values():
        verdict = "passed" if p["status"] == 0 else f"FAILED ({p['status']})"
        counts = ""
        if p["name"] in ("tests", "chapters"):
            seen = list(outcomes(p["text"]).values())
            counts = (f"{seen.count('PASSED')} / {seen.count('FAILED') + seen.count('ERROR')}"
                      f" / {seen.count('SKIPPED')}")
        lines.append(f"| {p['name']} | {verdict} | {p['seconds']:.0f} s | "
                     f"{p['limit']:.0f} s | {counts} |")
    for name, out in left_out.items():
        if out:
            lines += ["", f"Left out of {name} (they do not fit its limit): "
                      + ", ".join(out)]
    for p in parts.values():
        failed = [t for t, o in outcomes(p["text"]).items() if o in ("FAILED", "ERROR")]
        if failed:
            lines += ["", f"## {p['name']}: failed", ""] + [f"- {t}" for t in failed]
    found = figures(parts)
    if against := _against_targets(found):
        lines += ["", "## Against the targets", "", *against]
    if "gpu" in found:
        lines += ["", "## The README's GPU table (from the gpu part)", "",
                  "| | step | tokens/s | MFU |", "|---|---|---|---|"]
        for name, r in found["gpu"].items():
            lines.append(f"| {name} | {r['ms']:.1f} ms | {r['tokens']:,} | "
                         f"{r['mfu']:.1%} |")
    for p in parts.values():
        tail = "\n".join(p["text"].rstrip().splitlines()[-40:])
        lines += ["", f"## {p['name']}: the last lines", "", "```", tail, "```"]
    return "\n".join(lines) + "\n"


def install_wheels(wheels: Path) -> str:
    """pip-install the wheels in a folder into a temporary folder; return that folder."""
    target = tempfile.mkdtemp(prefix="gpu-check-site-")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                    "--no-deps", "--no-compile", "--target", target,
                    *map(str, sorted(wheels.glob("*.whl")))], check=True)
    return target


def git_commit() -> str | None:
    """The tree's commit, or None where git or the repository is absent."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):  # no git on this machine
        return None
    if done.returncode != 0:  # not a git repository (a copy of the tree)
        return None
    return done.stdout.strip() or None


def describe_machine(commit: str | None) -> str:
    """The GPU, torch, Triton and Python measured, whether torch and Triton are the
    pinned ones, and the tree (git's commit where git is there, else --commit's)."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    commit = commit or git_commit()
    found = {"torch": torch.__version__.split("+")[0], "triton": triton_version}
    pinned = ", ".join(f"{name} {found[name]} {'is' if found[name] == version else 'is not'}"
                       f" the pinned {version}" for name, version in PINNED.items())
    return (f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA "
            f"{torch.version.cuda}), triton {triton_version}, Python "
            f"{platform.python_version()} ({pinned}); the tree of "
            f"{'commit ' + commit if commit else 'an unnamed commit (no git, no --commit)'}")


def record_durations(junits: list[Path], measured: str, path: Path = DURATIONS) -> dict:
    """Fold pytest JUnit XML files into the durations file: each test file's and
    notebook's seconds (the sum of its tests'), and each test's that DEVICE_TESTS names."""
    durations = read_durations(path) if path.exists() else {"files": {}, "parts": {}}
    sums = {}
    for junit in junits:
        for case in ET.parse(junit).getroot().iter("testcase"):
            file = case.get("file") or _file_of_class(case.get("classname", ""))
            seconds = float(case.get("time", 0))
            sums[file] = sums.get(file, 0.0) + seconds
            node = f"{file}::{case.get('name').split('[')[0]}"  # its parameters together
            if node in DEVICE_TESTS:
                sums[node] = sums.get(node, 0.0) + seconds
    for name, seconds in sums.items():
        durations["files"][name] = {"seconds": round(seconds, 1), "measured": measured}
    path.write_text(json.dumps(durations, indent=1, sort_keys=True) + "\n")
    return durations


def _file_of_class(classname: str) -> str:
    """The file of pytest's JUnit class name: tests.test_x (or tests.test_x.TestY) ->
    tests/test_x.py; chapters.01_init.ipynb -> chapters/01_init.ipynb."""
    if classname.endswith(".ipynb"):
        return classname.replace(".", "/", 1)
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        if (ROOT / ("/".join(parts[:end]) + ".py")).is_file():
            return "/".join(parts[:end]) + ".py"
    return "/".join(parts) + ".py"


def run_call(call: int, out: Path, wheels: Path | None, commit: str | None) -> int:
    import torch
    if not torch.cuda.is_available():
        print("make gpu-check: needs a CUDA GPU, and this machine has none (nothing run)")
        return 2
    start = time.perf_counter()
    env = dict(os.environ, TLM_DEVICE="cuda", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="2")
    paths = [str(ROOT)]
    if wheels:
        paths.insert(0, install_wheels(wheels))
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    now = datetime.datetime.now()
    name = f"gpu-check-{now:%Y-%m-%d-%H%M%S}-call{call}"
    logs = out / name
    logs.mkdir(parents=True, exist_ok=True)
    machine = describe_machine(commit)
    print(machine, flush=True)
    rows = plan(read_durations())[call]
    parts, left_out = {}, {}
    for part, limit, files, _, left in rows:
        argv = list(PARTS[part][1])
        if part in ("tests", "chapters"):
            argv += [f"--junitxml={logs / part}.xml", *files]
            left_out[part] = left
        remaining = CALL_SECONDS - (time.perf_counter() - start)
        if remaining < 10:
            print(f"{part}: not run, the call's time is spent", flush=True)
            left_out[part] = ["the whole part (the call's time was spent)"]
            continue
        parts[part] = run_part(part, argv, min(limit, remaining - 5),
                               logs / f"{part}.log", env)
    path = out / f"{name}.md"
    path.write_text(report(call, parts, left_out, machine, f"{now:%Y-%m-%d %H:%M}"))
    print(f"report: {path}; logs: {logs}/")
    return 0 if all(p["status"] == 0 for p in parts.values()) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--plan", action="store_true")
    what.add_argument("--call", type=int, choices=sorted(CALLS))
    what.add_argument("--durations", type=Path, nargs="+", metavar="JUNIT_XML")
    parser.add_argument("--measured", default=f"CPU, {datetime.date.today()}",
                        help="with --durations: where and when they were measured")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--wheels", type=Path)
    parser.add_argument("--commit", help="the tree's commit, where git is absent")
    args = parser.parse_args()
    if args.plan:
        return 0 if print_plan(plan(read_durations())) else 1
    if args.durations:
        record_durations(args.durations, args.measured)
        print(f"wrote {DURATIONS.relative_to(ROOT)}")
        return 0
    return run_call(args.call, args.out, args.wheels, args.commit)


if __name__ == "__main__":
    sys.exit(main())
