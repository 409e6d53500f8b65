"""What the tests of `tlm train`, `tlm generate` and `tlm data` share: a byte-level data
directory and a 2-layer model of width 32, so that a run takes seconds on a CPU.

They train and sample on the CPU, whatever the machine has: several compare weights or
samples bit for bit, which CUDA repeats only with --deterministic (the tests that need
CUDA say so, and skip without it)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from tlm.cli import main
from tlm.tokenizer import write_merges, write_vocab

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--context-length", "16", "--d-model", "32", "--num-layers", "2",
        "--num-heads", "2", "--d-ff", "64", "--batch-size", "4", "--warmup-steps", "2",
        "--eval-windows", "4", "--log-every", "1", "--quiet", "--device", "cpu"]


def byte_vocab() -> dict[int, bytes]:
    return {**{i: bytes([i]) for i in range(256)}, 256: b"<|endoftext|>"}


def make_data_dir(d: Path) -> Path:
    """A tokenizer directory and token files: text of a repeated sentence, as bytes (a
    byte-level tokenizer: no merges)."""
    d.mkdir()
    write_vocab(byte_vocab(), d / "vocab.json")
    write_merges([], d / "merges.txt")
    text = b"the cat sat on the mat. " * 400
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    np.save(d / "train.npy", ids[:8000])
    np.save(d / "valid.npy", ids[8000:])
    return d


def make_run_dir(data_dir: Path, out_dir: Path) -> Path:
    """A 30-step run on make_data_dir's data."""
    assert tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir",
                                    out_dir, "--steps", 30]))) == 0
    return out_dir


def tlm_train(argv: list[str]) -> int:
    """`tlm train ARGV...` in this process."""
    return main(["train", *argv])


def run_cli(*args) -> subprocess.CompletedProcess:
    """`tlm train ARGS...` in a new process."""
    return subprocess.run([sys.executable, "-m", "tlm", "train", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def weights(path) -> dict:
    return torch.load(path, weights_only=True)["model"]


TINY_CONFIG = dict(context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=64,
                   batch_size=4, warmup_steps=2, eval_windows=4, log_every=1, steps=12,
                   eval_every=6, checkpoint_every=6, grad_accum_steps=2, device="cpu")


def run_generate(*args) -> subprocess.CompletedProcess:
    """`tlm generate ARGS` on the CPU (a --device in ARGS comes later and wins)."""
    return subprocess.run([sys.executable, "-m", "tlm", "generate", "--device", "cpu",
                           *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def doctor_rows(capsys) -> dict[str, str]:
    """`tlm doctor`'s rows, by their first word."""
    assert main(["doctor"]) == 0
    return {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
