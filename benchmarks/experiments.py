"""CS336 §7's experiments on Shakespeare, each run by `tlm train`: a learning-rate sweep up to
rates that diverge, batch sizes at an equal number of tokens, and architecture ablations
(no RMSNorm, post-norm, no RoPE, SiLU instead of SwiGLU at the same number of weights), and
strong weight decay on every parameter, on the matrices only, or on the Linear layers only.
Every run's training and held-out curves, exit status and wall time go to one results file,
with the command and the machine, which the "Training on text" chapter plots.

Usage: python benchmarks/experiments.py [--steps 300] [--out tlm/shakespeare_experiments.json]
                                       [--only EXPERIMENT ...]
--only runs the named experiments again and replaces their runs in the results file.
The plays are prepared as `tlm data shakespeare` does (vocabulary 4,096); every run has the
chapter's model and differs from the base run (batch 32, peak rate 3e-3) in one setting.
About 35 minutes on a 2-core CPU.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tlm.train import prepare_shakespeare
from tlm.utils import _replace_atomically

ROOT = Path(__file__).resolve().parent.parent
MODEL = ["--context-length", "128", "--d-model", "128", "--num-layers", "4",
         "--num-heads", "4", "--d-ff", "352"]
BASE = {"lr": 3e-3, "batch_size": 32, "ablation": "none", "weight_decay": 0.1,
        "decay": "all"}
LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 1.0, 3.0]
BATCH_SIZES = [8, 16, 32, 64, 128]
ABLATIONS = ["no_rmsnorm", "post_norm", "no_rope", "silu_ffn"]
DECAYS = [(1.0, "all"), (1.0, "matrices"), (10.0, "all"), (10.0, "matrices"),
          (10.0, "linear")]
EXPERIMENTS = ("learning rate", "batch size", "ablation", "weight decay")


def settings() -> list[dict]:
    """One dict per run: the base run, then each experiment's changes to it."""
    runs = [dict(BASE, experiment="learning rate", lr=lr) for lr in LRS]
    runs += [dict(BASE, experiment="batch size", batch_size=b)
             for b in BATCH_SIZES if b != BASE["batch_size"]]
    runs += [dict(BASE, experiment="ablation", ablation=a) for a in ABLATIONS]
    runs += [dict(BASE, experiment="weight decay", weight_decay=w, decay=d)
             for w, d in DECAYS]
    return runs


def train(data: Path, out: Path, steps: int, run: dict) -> dict:
    """Train one run; the same number of tokens whatever the batch size."""
    steps = steps * BASE["batch_size"] // run["batch_size"]
    args = [*MODEL, "--batch-size", run["batch_size"], "--steps", steps,
            "--warmup-steps", steps // 10, "--lr", run["lr"], "--min-lr", run["lr"] / 10,
            "--ablation", run["ablation"], "--weight-decay", run["weight_decay"],
            "--decay", run["decay"], "--eval-every", steps // 6,
            "--eval-windows", 32, "--checkpoint-every", steps, "--log-every", steps // 30]
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "tlm", "train", *map(str, args),
                             "--data-dir", data, "--out-dir", out, "--quiet"], cwd=ROOT,
                            capture_output=True, text=True)
    seconds = time.perf_counter() - start
    records = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    tokens = run["batch_size"] * 128
    return {**run, "steps": steps, "exit_status": result.returncode,
            "error": result.stderr.strip().splitlines()[-1] if result.returncode else None,
            "wall_s": round(seconds, 1),
            "train": [[r["step"] * tokens, r["loss"]] for r in records if "loss" in r],
            "valid": [[r["step"] * tokens, r["val_loss"], r["val_bits_per_byte"]]
                      for r in records if "val_loss" in r]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300,
                        help="steps of the base run (batch 32); others see as many tokens")
    parser.add_argument("--out", default="tlm/shakespeare_experiments.json")
    parser.add_argument("--only", nargs="+", choices=EXPERIMENTS, default=EXPERIMENTS)
    args = parser.parse_args()
    runs, begin = [], time.perf_counter()
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, "
               f"{torch.get_num_threads()} thread(s)")
    kept, command = {"runs": [], "wall_s": 0}, "python benchmarks/experiments.py"
    if set(args.only) != set(EXPERIMENTS):  # replace these experiments' runs
        kept = json.loads(Path(args.out).read_text())
        kept["runs"] = [dict(BASE, **r) for r in kept["runs"]  # the settings then
                        if r["experiment"] not in args.only]
        command = kept["command"] + "; " + " ".join([command, *map(repr, sys.argv[1:])])
        if machine not in kept["machine"]:
            machine = kept["machine"] + "; then " + machine
    elif sys.argv[1:]:
        command = " ".join([command, *sys.argv[1:]])
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        prepare_shakespeare(data)  # what `tlm data shakespeare` writes
        for i, run in enumerate(r for r in settings() if r["experiment"] in args.only):
            runs.append(train(data, Path(tmp) / f"run{i}", args.steps, run))
            r = runs[-1]
            print(f"{r['experiment']}: lr {r['lr']:g}, batch {r['batch_size']}, "
                  f"{r['ablation']}, decay {r['weight_decay']:g} on {r['decay']}: "
                  f"held-out {r['valid'][-1][1]:.3f} at {r['valid'][-1][0]:,} tokens, "
                  f"exit {r['exit_status']} "
                  f"({r['wall_s']:.0f} s)", flush=True)
    order = {name: i for i, name in enumerate(EXPERIMENTS)}
    runs = sorted(kept["runs"] + runs, key=lambda r: order[r["experiment"]])
    result = {"command": command,
              "model": " ".join(MODEL), "base": BASE, "steps": args.steps,
              "tokens_per_run": args.steps * BASE["batch_size"] * 128,
              "torch": torch.__version__,
              "machine": machine,
              "wall_s": kept["wall_s"] + round(time.perf_counter() - begin),
              "runs": runs}
    with _replace_atomically(args.out, "w") as f:
        f.write(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
