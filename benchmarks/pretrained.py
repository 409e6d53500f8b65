"""Loading a checkpoint of Qwen3-0.6B's shape: peak memory and time, tlm against transformers.

Writes a Qwen3ForCausalLM with Qwen3-0.6B's config (random weights, bfloat16, tied embeddings:
the published file's tensors and size) to a temporary directory, then loads it in a fresh
process per loader and repetition, each reporting its load time and its peak resident memory
(VmHWM of /proc/self/status, Linux: it counts the pages of the memory-mapped file that were
read as well; ru_maxrss would not do, as it is kept across fork and exec from the parent):

    tlm           tlm.from_pretrained(dir)                       (the stored bfloat16)
    transformers  AutoModelForCausalLM.from_pretrained(dir, dtype=torch.bfloat16)

A process that only imports torch and the loader's modules gives the baseline memory, which
is subtracted. After loading, every parameter is read once (summed), as a first forward
pass would read it: a loader that maps the file (transformers) has then paged it in.
Medians of --repeats runs of each, alternating.

    python benchmarks/pretrained.py [--repeats 3] [--out benchmarks/results/pretrained.json]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                 num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=True)

CHILD = r"""
import json, re, sys, time
from pathlib import Path
import torch
loader, directory = sys.argv[1], sys.argv[2]
if loader == "tlm":
    import tlm
    load = lambda: tlm.from_pretrained(directory)
elif loader == "transformers":
    import transformers
    transformers.logging.disable_progress_bar()
    load = lambda: transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.bfloat16)
else:  # the baseline: the same imports, nothing loaded
    import tlm, transformers
    load = lambda: None
def peak_kib():
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text())[1])
before = peak_kib()
start = time.perf_counter()
model = load()
seconds = time.perf_counter() - start
unique = [] if model is None else list({id(p): p for p in model.parameters()}.values())
with torch.no_grad():  # read every weight once, as a first forward pass would
    touched = sum(float(p.sum()) for p in unique)
peak = peak_kib()
params = sum(p.numel() for p in unique)
print(json.dumps({"seconds": seconds, "peak_kib": peak, "before_kib": before,
                  "params": params}))
"""


WRITER = r"""
import json, sys
import torch, transformers
transformers.logging.disable_progress_bar()
torch.manual_seed(0)
config = transformers.Qwen3Config(**json.loads(sys.argv[1]), dtype="bfloat16")
transformers.Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[2])
"""


def write_checkpoint(directory: Path) -> int:
    """The random bfloat16 checkpoint, written by another process (which needs several
    GB); returns the size of its weights file in bytes."""
    subprocess.run([sys.executable, "-c", WRITER, json.dumps(QWEN3_06B), str(directory)],
                   check=True)
    return (directory / "model.safetensors").stat().st_size


def measure(loader: str, directory: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, loader, str(directory)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        start = time.perf_counter()
        size = write_checkpoint(directory)
        print(f"checkpoint of Qwen3-0.6B's shape: {size / 2**30:.3f} GiB of weights "
              f"(written in {time.perf_counter() - start:.0f} s)")
        runs = {"baseline": [], "tlm": [], "transformers": []}
        for _ in range(args.repeats):
            for loader in runs:
                runs[loader].append(measure(loader, directory))
    base = statistics.median(r["peak_kib"] for r in runs["baseline"]) * 1024
    print(f"baseline (imports only): {base / 2**30:.2f} GiB")
    results = {"file_bytes": size, "baseline_peak_bytes": base}
    for loader in ("tlm", "transformers"):
        seconds = statistics.median(r["seconds"] for r in runs[loader])
        extra = statistics.median(r["peak_kib"] for r in runs[loader]) * 1024 - base
        results[loader] = {"seconds": seconds, "peak_over_baseline_bytes": extra,
                           "peak_over_file": extra / size,
                           "params": runs[loader][0]["params"]}
        print(f"{loader:12s} load {seconds:5.2f} s (median of {args.repeats}), peak memory "
              f"over the baseline {extra / 2**30:.2f} GiB = {extra / size:.2f} x the file")
    ratio = results["transformers"]["seconds"] / results["tlm"]["seconds"]
    print(f"time: transformers / tlm = {ratio:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
