"""make gpu-check: the book's GPU half on one CUDA GPU, each part with its own time limit and log.

Usage: python benchmarks/gpu_check.py [--out DIR] [--budget SECONDS] [--parts a,b,...]
                                      [--wheels DIR]

Parts, in this order (a part that fails or runs out of time does not stop the next):
  flash     benchmarks/flash_attention.py --quick: the Triton kernels against sdpa, first at
            the Spring 2025 leaderboard's shape (target: forward + backward at least 0.8x
            the speed of sdpa's FlashAttention-2 backend on an H100)
  gpu       benchmarks/gpu.py --no-decode: training steps at the GPT-2-small shape
            (target: the compiled step at 45% MFU or more on an H100)
  decode    benchmarks/decode.py --device cuda (target: compiled decoding at least 3x the
            tokens/s of Hugging Face's generate)
  tests     pytest tests on the GPU (leaving out the two files that need a package
            registry or a browser: test_standalone.py, test_pages.py)
  chapters  every chapter under nbval, TLM_DEVICE=cuda, against the stored outputs
About 9 minutes on an H100 in all; --budget (default 560 s) caps the whole, and each part
gets its own limit or what is left of the budget, whichever is less.
Writes DIR/gpu-check-<date>.md (default DIR: benchmarks/results), the report: the
machine, each part's verdict, time and last lines, the figures against the targets and the
README's GPU table filled from them; each part's whole output is in
DIR/gpu-check-<date>/<part>.log. Without CUDA it prints one line and exits with status 2.
--wheels DIR: first install the wheels in DIR (the test tools a machine without a package
registry lacks; see benchmarks/gpu-check-requirements.txt) into a folder on PYTHONPATH.
"""

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "nbval_sanitize.cfg"]
# name: (command after the interpreter, time limit in seconds)
PARTS = {
    "flash": (["benchmarks/flash_attention.py", "--quick"], 150),  # most of it compiling
    "gpu": (["benchmarks/gpu.py", "--no-decode"], 170),
    "decode": (["benchmarks/decode.py", "--device", "cuda"], 80),
    "tests": (["-m", "pytest", "tests", "-q", "-n", "8", "--dist", "loadfile",
               "--ignore=tests/test_standalone.py", "--ignore=tests/test_pages.py"], 90),
    "chapters": (["-m", "pytest", "chapters", "-q", "-n", "8", "--dist", "loadfile",
                  *NBVAL], 130),
}
TARGETS = {"flash": 0.8, "gpu": 0.45, "decode": 3.0}


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


def figures(parts: dict) -> dict:
    """The target figures read from the parts' outputs (absent where a part did not
    print them)."""
    found = {}
    flash = parts.get("flash", {}).get("text", "")
    if m := re.search(r"flash fwd\+bwd ([\d.]+) ms, sdpa ([\d.]+) ms, sdpa/flash ([\d.]+)",
                      flash):
        found["flash"] = dict(flash_ms=float(m[1]), sdpa_ms=float(m[2]), ratio=float(m[3]))
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


def report(parts: dict, found: dict, machine: str, date: str) -> str:
    """The report's Markdown."""
    lines = [f"# make gpu-check, {date}", "", machine, "",
             "| part | verdict | time | limit |", "|---|---|---|---|"]
    for p in parts.values():
        verdict = "passed" if p["status"] == 0 else f"FAILED ({p['status']})"
        lines.append(f"| {p['name']} | {verdict} | {p['seconds']:.0f} s | "
                     f"{p['limit']:.0f} s |")
    lines += ["", "## Against the targets", ""]
    if "flash" in found:
        f = found["flash"]
        lines.append(f"- FlashAttention forward + backward at the Spring 2025 leaderboard "
                     f"shape: {f['flash_ms']:.2f} ms, sdpa's flash backend "
                     f"{f['sdpa_ms']:.2f} ms: {f['ratio']:.2f}x sdpa's speed (target "
                     f">= {TARGETS['flash']}x): {f['ratio'] >= TARGETS['flash']}")
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--budget", type=float, default=560)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--wheels", type=Path)
    args = parser.parse_args()
    names = args.parts.split(",")
    if unknown := [n for n in names if n not in PARTS]:
        parser.error(f"--parts: unknown {unknown}, expected some of {list(PARTS)}")
    import torch
    if not torch.cuda.is_available():
        print("make gpu-check: needs a CUDA GPU, and this machine has none (nothing run)")
        return 2
    start = time.perf_counter()
    env = dict(os.environ, TLM_DEVICE="cuda", PYTHONUNBUFFERED="1")
    paths = [str(ROOT)]
    if args.wheels:
        paths.insert(0, install_wheels(args.wheels))
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    date = datetime.date.today().isoformat()
    logs = args.out / f"gpu-check-{date}"
    logs.mkdir(parents=True, exist_ok=True)
    import triton
    machine = (f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA "
               f"{torch.version.cuda}), triton {triton.__version__}, Python "
               f"{platform.python_version()}, the tree of commit "
               + subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    print(machine, flush=True)
    parts = {}
    for name in names:
        argv, limit = PARTS[name]
        left = args.budget - (time.perf_counter() - start)
        if left < 10:
            print(f"{name}: not run, the budget is spent", flush=True)
            continue
        parts[name] = run_part(name, argv, min(limit, left), logs / f"{name}.log", env)
    path = args.out / f"gpu-check-{date}.md"
    path.write_text(report(parts, figures(parts), machine, date))
    print(f"report: {path}; logs: {logs}/")
    return 0 if all(p["status"] == 0 for p in parts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
