"""Keep a run of `tlm train` as the package's model: tlm/shakespeare/.

Writes model.pt (the weights in bfloat16, with the run's config and step: no optimizer
state), the tokenizer's vocab.json and merges.txt, the run's log.jsonl, and run.json: the
`tlm train` command that reproduces the run (every option that differs from the defaults,
read from the checkpoint), its wall time and held-out score from the log, and the held-out
score of the bfloat16 weights as shipped; with --compare, the same summary of other finished
runs (the recipes that were tried beside it).

Usage: python tools/package_model.py RUN_DIR DATA_DIR [--out tlm/shakespeare]
                                     [--machine "how the run shared the machine"]
                                     [--compare OTHER_RUN_DIR ...]
DATA_DIR is the run's data directory (its valid.npy scores the shipped weights).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
from pathlib import Path

import numpy as np
import torch

from tlm.tokenizer import read_vocab
from tlm.run import MODEL_OPTIONS, OPTIMIZER_OPTIONS, RUN_OPTIONS, _run_state, load_run
from tlm.train import evaluate, token_bytes
from tlm.training import _read_checkpoint
from tlm.utils import _replace_atomically


def train_command(config: dict, data_dir: str = "data") -> str:
    """The `tlm train` command line of a run's config: the options that differ from
    the defaults (the output directory and the progress bar aside)."""
    defaults = {**MODEL_OPTIONS, **OPTIMIZER_OPTIONS, **RUN_OPTIONS}
    skip = {"data_dir", "out_dir", "vocab_size", "device"}
    flags = [f"--{k.replace('_', '-')} {v}" for k, v in config.items()
             if k in defaults and k not in skip and v != defaults[k]]
    return " ".join(["tlm train --data-dir", data_dir, *flags])


def summary(run_dir: Path) -> dict:
    """A finished run's command, training time and last held-out score, from its files."""
    state = _run_state(run_dir / "checkpoint.pt")  # a missing option: what the run did
    config = state["config"]
    if state["iteration"] != config["steps"]:
        raise SystemExit(f"{run_dir} stopped at step {state['iteration']} of "
                         f"{config['steps']}: finish it with --resume first")
    records = [json.loads(line) for line in
               (run_dir / "log.jsonl").read_text().splitlines()]
    last = [r for r in records if "val_loss" in r][-1]
    vocab = len(read_vocab(run_dir / "vocab.json"))
    return {"data": f"tlm data shakespeare data --vocab-size {vocab}",
            "train": train_command(config), "steps": state["iteration"],
            "training_s": round([r for r in records if "elapsed_s" in r][-1]["elapsed_s"]),
            "tokens": state["iteration"] * config["batch_size"] * config["context_length"],
            "train_loss": [r for r in records if "loss" in r][-1]["loss"],
            "held_out": {k.removeprefix("val_"): v for k, v in last.items()
                         if k.startswith("val_")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--out", type=Path, default=Path("tlm/shakespeare"))
    parser.add_argument("--machine", default="")
    parser.add_argument("--compare", type=Path, nargs="*", default=[])
    parser.add_argument("--wall-s", type=float, default=None,
                        help="the command's wall time, evaluations included")
    args = parser.parse_args()
    record = summary(args.run_dir)
    state = _read_checkpoint(args.run_dir / "checkpoint.pt")
    config = state["config"]
    args.out.mkdir(parents=True, exist_ok=True)
    with _replace_atomically(args.out / "model.pt") as f:
        torch.save({"model": {k: v.to(torch.bfloat16) for k, v in state["model"].items()},
                    "iteration": state["iteration"],
                    "config": dict(config, data_dir="data", out_dir="runs/shakespeare")},
                   f)
    for name in ("vocab.json", "merges.txt", "log.jsonl"):
        shutil.copyfile(args.run_dir / name, args.out / name)
    model, _ = load_run(args.out / "model.pt")  # the weights as shipped
    valid = np.load(args.data_dir / "valid.npy", mmap_mode="r")
    shipped = evaluate(model, valid, token_bytes(read_vocab(args.data_dir / "vocab.json")))
    record.update(wall_s=args.wall_s,
                  parameters=sum(p.numel() for p in model.parameters()),
                  held_out_bfloat16=shipped, torch=torch.__version__,
                  machine=f"{platform.machine()}, {args.machine}".rstrip(", "),
                  compared=[summary(other) for other in args.compare])
    with _replace_atomically(args.out / "run.json", "w") as f:
        f.write(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("train", "training_s", "held_out_bfloat16")},
                     indent=1))


if __name__ == "__main__":
    main()
