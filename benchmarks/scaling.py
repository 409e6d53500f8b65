"""A compute-optimal scaling study on Shakespeare (CS336 assignment 3 in small form): the
family of `tlm.scaling` trained at four budgets of training FLOPs, five to seven widths
each, then a prediction for five times the largest budget from the curves that show
their minimum, written into the results before the run that checks it is made.

Usage: python benchmarks/scaling.py [--jobs 2] [--work runs/scaling]
                                    [--out tlm/scaling_study.json]
       python benchmarks/scaling.py --quick   (one small run, against its stored value)
Every run uses one thread; --jobs runs that many at once. A killed study resumes where
it stopped when run again with the same --work (finished runs are kept in --out, the
long check run resumes from its checkpoint). About 95 minutes on a 2-core CPU.
"""

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from tlm.scaling import RECIPE, train_point
from tlm.train import prepare_shakespeare
from tlm.utils import _replace_atomically

# widths at each budget: around the minimum, every run under four epochs of the plays
GRID = {3e11: (8, 16, 32, 48, 64, 80), 1e12: (8, 16, 32, 48, 64, 80, 96),
        3e12: (32, 48, 64, 80, 96, 128), 1e13: (64, 80, 96, 128, 160)}
REPEATED = dict(d_model=16, budget=1e12, fraction=0.25)  # the same run on a quarter
CHECK_FACTOR = 5  # the prediction's budget: five times the largest
QUICK = dict(d_model=16, budget=2e10)  # seconds: the chapter re-runs it
QUICK_SEEDS = (1, 2, 3, 4)  # the same point from other seeds: its spread


def key(run: dict) -> str:
    return f"{run['budget']:g} d{run['d_model']} x{run.get('fraction', 1):g}"


def _worker(args) -> dict:
    torch.set_num_threads(1)
    d_model, budget, data, out, checkpoints = args
    if out.exists() and not (out / "checkpoint.pt").exists():
        shutil.rmtree(out)  # killed before its first checkpoint: start it again
    return train_point(d_model, budget, data, out, checkpoints)


def _data(work: Path, fraction: float = 1.0) -> Path:
    """The plays as `tlm data shakespeare` writes them; with a fraction, the first part
    of the training tokens only (the same tokenizer and held-out plays)."""
    full = work / "data"
    if not (full / "valid.npy").exists():
        prepare_shakespeare(full)
    if fraction == 1:
        return full
    part = work / f"data-{fraction:g}"
    if not (part / "valid.npy").exists():
        part.mkdir(parents=True, exist_ok=True)
        train = np.load(full / "train.npy")
        np.save(part / "train.npy", train[:round(len(train) * fraction)])
        for name in ("valid.npy", "vocab.json", "merges.txt"):
            (part / name).write_bytes((full / name).read_bytes())
    return part


def _save(out: Path, study: dict) -> None:
    with _replace_atomically(out, "w") as f:
        f.write(json.dumps(study, indent=1) + "\n")


def _train_all(runs: list[dict], study: dict, work: Path, out: Path, jobs: int,
               begin: float, wall_s0: float) -> None:
    todo = [r for r in runs if key(r) not in {key(s) for s in study["runs"]}]
    todo.sort(key=lambda r: -r["budget"])  # the longest first
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_worker, (r["d_model"], r["budget"],
                                         _data(work, r.get("fraction", 1)),
                                         work / key(r).replace(" ", "_"), 1)): r
                   for r in todo}
        for future in as_completed(futures):
            run = dict(future.result(), fraction=futures[future].get("fraction", 1))
            study["runs"].append(run)
            study["wall_s"] = round(time.perf_counter() - begin + wall_s0)
            _save(out, study)
            print(f"{len(study['runs'])}/{len(runs)} {key(run)}: {run['steps']} steps, "
                  f"held-out loss {run['loss']:.4f} ({run['wall_s']:.0f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work", default="runs/scaling")
    parser.add_argument("--out", default="tlm/scaling_study.json")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work, out = Path(args.work), Path(args.out)
    if args.quick:
        stored = json.loads(out.read_text())["quick"]
        with tempfile.TemporaryDirectory() as tmp:
            run = train_point(QUICK["d_model"], QUICK["budget"], _data(work),
                              Path(tmp) / "run")
        print(f"held-out loss {run['loss']!r}, stored {stored['loss']!r}, difference "
              f"{run['loss'] - stored['loss']:.2e}")
        return
    begin = time.perf_counter()
    study = json.loads(out.read_text()) if out.exists() else {
        "command": " ".join(["python benchmarks/scaling.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, one thread a run",
        "recipe": RECIPE, "grid": {f"{b:g}": list(w) for b, w in GRID.items()},
        "wall_s": 0, "runs": []}
    wall_s0 = study["wall_s"]  # the minutes of the runs before a resume
    study["grid"] = {f"{b:g}": list(w) for b, w in GRID.items()}
    runs = [dict(d_model=d, budget=b) for b, ws in GRID.items() for d in ws]
    runs.append(dict(REPEATED))
    _train_all(runs, study, work, out, args.jobs, begin, wall_s0)
    if "quick" not in study:
        with tempfile.TemporaryDirectory() as tmp:
            study["quick"] = train_point(QUICK["d_model"], QUICK["budget"], _data(work),
                                         Path(tmp) / "run")
        _save(out, study)
    if "quick_seeds" not in study:  # how far the small point moves with the seed
        losses = []
        for seed in QUICK_SEEDS:
            with tempfile.TemporaryDirectory() as tmp:
                losses.append(train_point(QUICK["d_model"], QUICK["budget"], _data(work),
                                          Path(tmp) / "run", seed=seed)["loss"])
        study["quick_seeds"] = losses
        _save(out, study)
    if "prediction" not in study:  # written down before the run that checks it
        from tlm.scaling import bracketed, predict_optimum
        grid = [r for r in study["runs"] if r["fraction"] == 1]
        study["prediction"] = predict_optimum(bracketed(grid), CHECK_FACTOR * max(GRID))
        study["prediction"]["written"] = time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                       time.gmtime())
        _save(out, study)
    p = study["prediction"]
    print(f"prediction for {p['budget']:.3g} FLOPs: d_model {p['d_model']}, "
          f"held-out loss {p['loss']:.4f}", flush=True)
    if "check" not in study:
        study["check"] = _worker((p["d_model"], p["budget"], _data(work),
                                  work / "check", 8))
        study["wall_s"] = round(time.perf_counter() - begin + wall_s0)
        _save(out, study)
    c = study["check"]
    print(f"check: held-out loss {c['loss']:.4f} against {p['loss']:.4f} predicted")


if __name__ == "__main__":
    main()
