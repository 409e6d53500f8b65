"""Two of CS336's §7 experiments on Shakespeare: a learning-rate sweep and architecture
ablations, each run by `python -m tlm.train`; the validation curves go to a results file
that the "Training on text" chapter plots.

Usage: python benchmarks/experiments.py [--steps 300] [--out tlm/shakespeare_experiments.json]
The plays are prepared as in the chapter (vocabulary 4,096); every run has the chapter's
model and differs from it in one option only.
"""

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tlm.train import write_shakespeare

ROOT = Path(__file__).resolve().parent.parent
MODEL = ["--context-length", "128", "--d-model", "128", "--num-layers", "4",
         "--num-heads", "4", "--d-ff", "352", "--batch-size", "32"]
LRS = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
ABLATIONS = [("no_rmsnorm", 3e-3), ("no_rmsnorm", 1e-2), ("no_rope", 3e-3)]


def run(*args) -> None:
    subprocess.run([sys.executable, *map(str, args)], check=True, cwd=ROOT)


def prepare(data: Path, vocab_size: int) -> None:
    write_shakespeare(data)
    eot = ["--special-token", "<|endoftext|>", "--quiet"]
    run("-m", "tlm.tokenizer", "train", data / "train.txt", "--vocab-size", vocab_size,
        "--out-dir", data, *eot)
    for split in ("train", "valid"):
        run("-m", "tlm.tokenizer", "encode", data / f"{split}.txt", "--vocab",
            data / "vocab.json", "--merges", data / "merges.txt", "--out",
            data / f"{split}.npy", *eot)


def train(data: Path, out: Path, steps: int, lr: float, ablation: str = "none") -> dict:
    args = [*MODEL, "--steps", steps, "--warmup-steps", steps // 10, "--lr", lr,
            "--min-lr", lr / 10, "--ablation", ablation, "--eval-every", 50,
            "--eval-windows", 32, "--checkpoint-every", steps, "--log-every", 10]
    result = subprocess.run([sys.executable, "-m", "tlm.train", *map(str, args),
                             "--data-dir", data, "--out-dir", out, "--quiet"], cwd=ROOT,
                            capture_output=True, text=True)
    records = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    return {"lr": lr, "ablation": ablation, "exit_code": result.returncode,
            "error": result.stderr.strip().splitlines()[-1] if result.returncode else None,
            "train": [[r["step"], r["loss"]] for r in records if "loss" in r],
            "valid": [[r["step"], r["val_loss"], r["val_bits_per_byte"]]
                      for r in records if "val_loss" in r]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--out", default="tlm/shakespeare_experiments.json")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        prepare(data, args.vocab_size)
        settings = [(lr, "none") for lr in LRS] + [(lr, a) for a, lr in ABLATIONS]
        for i, (lr, ablation) in enumerate(settings):
            start = time.perf_counter()
            runs.append(train(data, Path(tmp) / f"run{i}", args.steps, lr, ablation))
            last = runs[-1]["valid"][-1]
            print(f"lr {lr:g} {ablation}: step {last[0]} loss {last[1]:.3f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    result = {"command": " ".join(["python benchmarks/experiments.py", *sys.argv[1:]]),
              "model": " ".join(MODEL), "steps": args.steps,
              "vocab_size": args.vocab_size, "torch": torch.__version__,
              "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
              "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
