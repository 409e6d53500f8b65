"""tlm.train and the command line: the corpus, get_batch, evaluation, `tlm train`,
`tlm generate`, `tlm data` and `tlm doctor`.

The runs here use a byte-level vocabulary and a 2-layer model of width 32, so that the
resume and kill tests take seconds. They train and sample on the CPU, whatever the
machine has: several compare weights or samples bit for bit, which CUDA repeats only
with --deterministic (the tests that need CUDA say so, and skip without it).
"""

import importlib.metadata
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tlm
from tlm.tokenizer import write_merges, write_vocab
from tlm.cli import main
from tlm.train import (HELD_OUT, evaluate, get_batch, play_text, shakespeare_splits,
                       token_bytes, train_model)

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--context-length", "16", "--d-model", "32", "--num-layers", "2",
        "--num-heads", "2", "--d-ff", "64", "--batch-size", "4", "--warmup-steps", "2",
        "--eval-windows", "4", "--log-every", "1", "--quiet", "--device", "cpu"]


def byte_vocab() -> dict[int, bytes]:
    return {**{i: bytes([i]) for i in range(256)}, 256: b"<|endoftext|>"}


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """A tokenizer directory and token files: text of a repeated sentence, as bytes."""
    d = tmp_path / "data"
    d.mkdir()
    write_vocab(byte_vocab(), d / "vocab.json")
    text = b"the cat sat on the mat. " * 400
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    np.save(d / "train.npy", ids[:8000])
    np.save(d / "valid.npy", ids[8000:])
    return d


def _main(argv: list[str]) -> int:
    """`tlm train ARGV...` in this process."""
    return main(["train", *argv])


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tlm", "train", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def weights(path) -> dict:
    return torch.load(path, weights_only=True)["model"]


# --- the corpus ---------------------------------------------------------------------

def test_play_text_removes_the_markup():
    md = ("# Macbeth\n\n## ACT I\n\n_Thunder. Enter three Witches_\n\n"
          "**First Witch**  \nWhen shall we three meet again  \nIn rain?\n\n"
          "__\\[Awaking]_  \nO\\--no!\n")
    assert play_text(md) == ("Macbeth\n\nACT I\n\nThunder. Enter three Witches\n\n"
                             "First Witch:\nWhen shall we three meet again\nIn rain?\n\n"
                             "[Awaking]\nO--no!\n")


def test_whole_plays_are_held_out():
    splits = shakespeare_splits()
    assert (len(splits["train"]), len(splits["valid"])) == (34, len(HELD_OUT))
    titles = {play.splitlines()[0] for play in splits["valid"]}
    assert titles == {"Hamlet", "Henry V", "The Tempest", "Twelfth Night"}
    assert not titles & {play.splitlines()[0] for play in splits["train"]}
    for text in splits["train"] + splits["valid"]:
        assert "**" not in text and "  \n" not in text and "\n#" not in text
    with pytest.raises(ValueError, match="unknown names \\['hamlet2'\\]"):
        shakespeare_splits(("hamlet2",))
    with pytest.raises(ValueError, match="held_out must name at least one play"):
        shakespeare_splits(())


# --- get_batch ------------------------------------------------------------------------

class CountingArray:
    """A 1-D array that counts the elements read through slicing."""

    def __init__(self, n):
        self.data, self.ndim, self.read = np.arange(n, dtype=np.uint16), 1, 0

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        out = self.data[index]
        self.read += out.size
        return out


def test_get_batch_returns_shifted_windows_and_reads_only_them():
    data = CountingArray(10_000)
    x, y = get_batch(data, 8, 32, "cpu", torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert data.read == 8 * 33
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(x, x[:, :1] + torch.arange(32))  # contiguous windows of arange
    assert torch.equal(y[:, -1], x[:, -1] + 1)


def test_get_batch_draws_every_start_uniformly():
    n, T = 12, 4  # starts 0 .. 7: the last window ends on the last token
    x, _ = get_batch(np.arange(n), 80_000, T, "cpu", torch.Generator().manual_seed(1))
    counts = np.bincount(x[:, 0].numpy(), minlength=n)
    assert counts[n - T:].sum() == 0
    assert np.allclose(counts[:n - T] / 10_000, 1, atol=0.05)


def test_get_batch_is_reproducible_with_a_generator_and_reads_memmaps(tmp_path):
    np.save(tmp_path / "ids.npy", np.arange(5000, dtype=np.uint16))
    data = np.load(tmp_path / "ids.npy", mmap_mode="r")
    a = get_batch(data, 4, 8, "cpu", torch.Generator().manual_seed(3))
    b = get_batch(data, 4, 8, "cpu", torch.Generator().manual_seed(3))
    assert all(torch.equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize("args, error, match", [
    ((np.arange(10), 2, 10), ValueError, "has 10 tokens; context_length=10 needs at least 11"),
    ((np.zeros((4, 4)), 2, 2), TypeError, "1-D array of token ids"),
    ((np.arange(10), 0, 2), ValueError, "batch_size"),
    ((np.arange(10), 2, 2.5), TypeError, "context_length"),
])
def test_get_batch_rejects_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        get_batch(*args, "cpu")


# --- evaluation -----------------------------------------------------------------------

def test_evaluate_against_cross_entropy_by_hand():
    torch.manual_seed(0)
    model = tlm.TransformerLM(257, 8, 16, 1, 2, 32, 10000.0)
    vocab = {**byte_vocab(), 256: b"<|endoftext|>"}
    data = np.random.default_rng(0).integers(0, 257, size=50).astype(np.uint16)
    got = evaluate(model, data, token_bytes(vocab), batch_size=2)
    windows = torch.tensor(data[:48].astype(np.int64)).reshape(6, 8)  # (50 - 1) // 8
    targets = torch.tensor(data[1:49].astype(np.int64)).reshape(6, 8)
    with torch.no_grad():
        logits = model(windows).double()
    nats = F.cross_entropy(logits.reshape(-1, 257), targets.reshape(-1), reduction="sum")
    nbytes = sum(13 if t == 256 else 1 for t in targets.reshape(-1).tolist())
    assert got["loss"] == pytest.approx(nats.item() / 48, rel=1e-6)
    assert got["perplexity"] == pytest.approx(math.exp(nats.item() / 48), rel=1e-5)
    assert got["bits_per_byte"] == pytest.approx(nats.item() / math.log(2) / nbytes,
                                                 rel=1e-6)
    assert (got["tokens"], got["bytes"]) == (48, nbytes)  # ids 1 to 48; id 0 and 49 unscored


# --- the command line -----------------------------------------------------------------

def test_help_lists_every_option():
    out = run_cli("--help").stdout
    from tlm.train import MODEL_OPTIONS, OPTIMIZER_OPTIONS, RUN_OPTIONS
    for name in {**MODEL_OPTIONS, **OPTIMIZER_OPTIONS, **RUN_OPTIONS}:
        assert "--" + name.replace("_", "-") in out


def test_split_run_equals_uninterrupted_run_bit_for_bit(data_dir, tmp_path):
    common = [*TINY, "--data-dir", data_dir, "--steps", 20, "--checkpoint-every", 5,
              "--eval-every", 5]
    assert _main(list(map(str, [*common, "--out-dir", tmp_path / "a"]))) == 0
    assert _main(list(map(str, [*common, "--out-dir", tmp_path / "b",
                                "--stop-at", 10]))) == 0
    assert torch.load(tmp_path / "b/checkpoint.pt", weights_only=True)["iteration"] == 10
    # --resume takes the model and optimizer settings from the checkpoint
    assert _main(list(map(str, ["--out-dir", tmp_path / "b", "--data-dir", data_dir,
                                "--resume", "--quiet"]))) == 0
    a, b = weights(tmp_path / "a/checkpoint.pt"), weights(tmp_path / "b/checkpoint.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [r["step"] for r in map(json.loads, open(tmp_path / "b/log.jsonl"))
             if "loss" in r]
    assert steps == list(range(1, 21))  # one record per step, none twice
    assert (tmp_path / "b/loss.png").stat().st_size > 1000


def test_a_killed_run_resumes_from_its_last_checkpoint(data_dir, tmp_path):
    args = [*TINY, "--data-dir", data_dir, "--steps", 400, "--checkpoint-every", 7,
            "--eval-every", 1000]
    proc = subprocess.Popen([sys.executable, "-m", "tlm", "train", *map(str, args),
                             "--out-dir", tmp_path / "k"], cwd=ROOT)
    log, deadline = tmp_path / "k/log.jsonl", time.monotonic() + 120
    while time.monotonic() < deadline:
        done = [json.loads(x)["step"] for x in (log.read_text().splitlines()
                                                 if log.exists() else [])]
        if done and max(done) >= 30:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = torch.load(tmp_path / "k/checkpoint.pt", weights_only=True)
    assert state["iteration"] % 7 == 0 and state["iteration"] >= 28
    assert _main(list(map(str, [*args, "--out-dir", tmp_path / "k", "--resume",
                                "--stop-at", 70]))) == 0
    assert _main(list(map(str, [*args, "--out-dir", tmp_path / "u", "--stop-at", 70]))) == 0
    a, b = weights(tmp_path / "k/checkpoint.pt"), weights(tmp_path / "u/checkpoint.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ids_beyond_the_vocabulary_are_refused(data_dir, tmp_path, capsys):
    np.save(data_dir / "valid.npy", np.array([1, 2, 300, 4] * 10, dtype=np.uint16))
    code = _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path])))
    err = capsys.readouterr().err
    assert code == 2 and "valid.npy holds token ids up to 300" in err
    assert "vocab_size is 257" in err


def test_a_context_longer_than_the_data_is_refused(data_dir, tmp_path, capsys):
    code = _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path,
                                "--context-length", 2000])))
    assert code == 2
    assert "valid.npy has 1,600 tokens, too few for context_length=2000" in \
        capsys.readouterr().err


def test_resume_refuses_another_architecture_and_a_missing_checkpoint(data_dir, tmp_path,
                                                                      capsys):
    common = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path, "--steps", 4]
    assert _main(list(map(str, [*common, "--resume"]))) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    assert _main(list(map(str, common))) == 0
    before = (tmp_path / "checkpoint.pt").read_bytes()
    assert _main(list(map(str, [*common, "--resume", "--d-model", 64]))) == 2
    assert "d_model=32 there, 64 here" in capsys.readouterr().err
    assert (tmp_path / "checkpoint.pt").read_bytes() == before


def test_a_diverging_run_stops_and_keeps_its_last_good_checkpoint(data_dir, tmp_path,
                                                                  capsys):
    code = _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path,
                                "--steps", 50, "--lr", 1e30, "--grad-clip", 0,
                                "--warmup-steps", 0, "--checkpoint-every", 1])))
    assert code == 1
    err = capsys.readouterr().err
    assert "training stopped" in err or "not finite" in err
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert all(torch.isfinite(w).all() for w in state["model"].values())
    assert 1 <= state["iteration"] < 50


def test_train_model_checks_the_data_files_exist(tmp_path):
    config = {**tlm.train.MODEL_OPTIONS, **tlm.train.OPTIMIZER_OPTIONS,
              **tlm.train.RUN_OPTIONS, "data_dir": tmp_path, "out_dir": tmp_path / "o"}
    with pytest.raises(FileNotFoundError):
        train_model(config, progress=False)


# --- tlm generate ---------------------------------------------------------------------

def run_generate(*args) -> subprocess.CompletedProcess:
    """`tlm generate ARGS` on the CPU (a --device in ARGS comes later and wins)."""
    return subprocess.run([sys.executable, "-m", "tlm", "generate", "--device", "cpu",
                           *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.fixture
def run_dir(data_dir, tmp_path) -> Path:
    write_merges([], data_dir / "merges.txt")  # a byte-level tokenizer: no merges
    assert _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir",
                                tmp_path / "run", "--steps", 30]))) == 0
    return tmp_path / "run"


def test_generate_samples_reproducibly_and_the_cache_changes_nothing(run_dir):
    ckpt = run_dir / "checkpoint.pt"
    a = run_generate(ckpt, "--prompt", "the ", "--seed", 5, "--max-new-tokens", 12)
    b = run_generate(ckpt, "--prompt", "the ", "--seed", 5, "--max-new-tokens", 12)
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout.startswith("the ")
    # 40 new tokens with a context of 16: the window slides, with and without the cache
    greedy = [ckpt, "--temperature", 0, "--max-new-tokens", 40, "--prompt", "the cat"]
    cached, uncached = run_generate(*greedy), run_generate(*greedy, "--no-cache")
    assert cached.returncode == 0 and cached.stdout == uncached.stdout
    model, tokenizer = tlm.train.load_run(ckpt)
    ids = torch.tensor(tokenizer.encode("the cat"))
    expected = tlm.generate(model, ids, 40, temperature=0, eos_id=256)
    assert expected.shape == (7 + 40,) and 256 not in expected.tolist()
    assert cached.stdout == tokenizer.decode(expected.tolist()) + "\n"
    long = "the cat sat on the mat. the cat"  # a prompt longer than the context
    for how in (["--seed", 1], ["--temperature", 0]):
        out = [run_generate(ckpt, "--prompt", long, *how, *cache)
               for cache in ([], ["--no-cache"])]
        assert out[0].returncode == 0 and out[0].stdout == out[1].stdout
        assert out[0].stdout.startswith(long)
    # greedy writes past the prompt; a draw may pick <|endoftext|> first and stop (as
    # torch 2.11's random numbers do with seed 1), which the training text never has
    assert len(out[0].stdout) > len(long) + 1
    two = run_generate(ckpt, "--num-samples", 2, "--max-new-tokens", 5)
    assert two.returncode == 0 and two.stdout.count("\n---\n") == 1


@pytest.mark.parametrize("args, message", [
    (["--top-p", 1.5], "--top-p must be in (0, 1], got 1.5"),
    (["--top-k", 0], "--top-k must be at least 1, got 0"),
    (["--temperature", -1], "--temperature must be >= 0, got -1.0"),
    (["--temperature", "nan"], "--temperature must be >= 0, got nan"),
    (["--max-new-tokens", -1], "--max-new-tokens must be at least 1, got -1"),
    (["--max-new-tokens", 0], "--max-new-tokens must be at least 1, got 0"),
    (["--num-samples", 0], "--num-samples must be at least 1"),
    (["--device", "nodevice"], "device:"),
])
def test_generate_refuses_bad_input(run_dir, args, message, capsys):
    """In this process (`main`, as the console script calls it); one subprocess below."""
    code = main(["generate", "--device", "cpu", str(run_dir / "checkpoint.pt"),
                 *map(str, args)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_generate_refuses_bad_input_in_a_new_process(run_dir):
    result = run_generate(run_dir / "checkpoint.pt", "--top-p", 1.5)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("error: --top-p must be in (0, 1], got 1.5")


def test_generate_refuses_a_checkpoint_without_settings(tmp_path):
    missing = run_generate(tmp_path / "none.pt")
    assert missing.returncode == 2 and "No such file" in missing.stderr
    torch.save({"model": {}}, tmp_path / "bare.pt")
    bare = run_generate(tmp_path / "bare.pt")
    assert bare.returncode == 2 and "not a checkpoint of tlm train" in bare.stderr


def test_importing_every_submodule_replaces_no_function():
    """A submodule named like a function (tlm.generate) would replace it when imported."""
    code = ("import importlib, pkgutil, tlm\n"
            "before = {k: v for k, v in vars(tlm).items() if callable(v)}\n"
            "for m in pkgutil.iter_modules(tlm.__path__):\n"
            "    if m.name != '__main__':\n"
            "        importlib.import_module('tlm.' + m.name)\n"
            "changed = [k for k, v in before.items() if getattr(tlm, k) is not v]\n"
            "print(changed, type(tlm.generate).__name__, tlm.generate.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.stdout.strip() == "[] function tlm.generation", out.stderr


def test_resume_refuses_a_checkpoint_without_settings(data_dir, tmp_path, capsys):
    model = tlm.TransformerLM(257, 16, 32, 2, 2, 64, 10000.0)
    tlm.save_checkpoint(model, tlm.AdamW(model.parameters()), 3, tmp_path / "checkpoint.pt")
    code = _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path,
                                "--resume"])))
    assert code == 2
    assert "is not a checkpoint of tlm train" in capsys.readouterr().err


# --- options are checked first, then the files ----------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--lr", -1], "--lr must be a positive number, got -1.0"),
    (["--steps", 1], "--warmup-steps must be at most --steps (1), got 2"),
    (["--steps", 0], "--steps must be a positive int, got 0"),
    (["--stop-at", 0], "--stop-at must be a positive int, got 0"),
    (["--stop-at", -5], "--stop-at must be a positive int, got -5"),
    (["--stop-at", 500], "--stop-at must be at most --steps (400), got 500"),
    (["--max-minutes", 0], "--max-minutes must be a positive number (leave it out for no limit), got 0.0"),
    (["--max-minutes", -1], "--max-minutes must be a positive number (leave it out for no limit), got -1.0"),
    (["--min-lr", 1], "--min-lr must be at most --lr (0.003), got 1.0"),
    (["--beta2", 1], "--beta2 must be in [0, 1), got 1.0"),
    (["--weight-decay", "nan"], "--weight-decay must be a number >= 0, got nan"),
])
def test_bad_options_are_refused_before_any_file_is_read_or_written(tmp_path, capsys,
                                                                     args, message):
    out = tmp_path / "run"
    code = _main(list(map(str, [*TINY, "--data-dir", tmp_path / "none", "--out-dir", out,
                                *args])))
    assert code == 2 and capsys.readouterr().err == f"error: {message}\n"
    assert not out.exists()


def test_missing_files_are_named(data_dir, tmp_path, capsys):
    assert _main(list(map(str, [*TINY, "--out-dir", tmp_path / "r", "--resume"]))) == 2
    assert capsys.readouterr().err == f"error: --resume: there is no checkpoint at {tmp_path / 'r' / 'checkpoint.pt'}\n"
    (data_dir / "valid.npy").unlink()
    assert _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path / "r"]))) == 2
    assert capsys.readouterr().err == (f"error: --data-dir {data_dir} has no valid.npy "
                                       f"(`tlm data shakespeare {data_dir}` writes one)\n")


@pytest.mark.parametrize("name", ["cuda", "mps"])
def test_a_device_this_machine_lacks_is_one_line(run_dir, data_dir, tmp_path, name):
    mps = getattr(torch.backends, "mps", None)
    have = torch.cuda.is_available() if name == "cuda" else bool(mps and mps.is_available())
    for result in (run_cli(*TINY, "--data-dir", data_dir, "--out-dir", tmp_path / "r",
                           "--steps", 2, "--device", name),
                   run_generate(run_dir / "checkpoint.pt", "--device", name)):
        if have:  # the device works here: the run trains and samples on it
            assert result.returncode == 0, result.stderr
        else:
            assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
            assert result.stderr.startswith(f"error: device: {name} is not available here")


def test_a_run_without_endoftext_samples_from_a_prompt(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    write_vocab({i: bytes([i]) for i in range(256)}, d / "vocab.json")  # no special token
    write_merges([], d / "merges.txt")
    ids = np.frombuffer(b"to be or not to be. " * 300, dtype=np.uint8).astype(np.uint16)
    np.save(d / "train.npy", ids[:5000])
    np.save(d / "valid.npy", ids[5000:])
    assert _main(list(map(str, [*TINY, "--data-dir", d, "--out-dir", tmp_path / "run",
                                "--steps", 5]))) == 0
    ckpt = tmp_path / "run" / "checkpoint.pt"
    sample = run_generate(ckpt, "--prompt", "to be", "--max-new-tokens", 10, "--temperature", 0)
    assert sample.returncode == 0 and sample.stdout.startswith("to be")
    model, tokenizer = tlm.train.load_run(ckpt)
    assert tokenizer.special_tokens == [] and len(tokenizer.vocab) == 256
    bare = run_generate(ckpt)
    assert bare.returncode == 2 and "--prompt is needed" in bare.stderr
    # a checkpoint next to another run's larger vocabulary is refused
    write_vocab(byte_vocab() | {257: b"xy"}, tmp_path / "run" / "vocab.json")
    write_merges([(b"x", b"y")], tmp_path / "run" / "merges.txt")
    other = run_generate(ckpt, "--prompt", "to")
    assert other.returncode == 2 and "the tokenizer of another run?" in other.stderr


# --- tlm data, tlm doctor, python -m tlm ----------------------------------------------

def fake_prepare(out_dir, vocab_size=4096, held_out=HELD_OUT, num_processes=None,
                 progress=False, fail=False):  # prepare_shakespeare's signature
    for name in ("train.txt", "valid.txt", "merges.txt", "train.npy"):
        (Path(out_dir) / name).write_text(f"{name} {vocab_size}")
    # as BPE that ran out of pairs to merge: fewer tokens than asked for
    write_vocab({i: str(i).encode() for i in range(vocab_size // 2)},
                Path(out_dir) / "vocab.json")
    if fail:
        raise OSError("disk full")
    (Path(out_dir) / "valid.npy").write_text("valid")
    return {"train": 10, "valid": 2}


def test_data_writes_every_file_or_none(tmp_path, monkeypatch, capsys):
    import tlm.cli
    out = tmp_path / "data"
    monkeypatch.setattr(tlm.cli, "prepare_shakespeare",
                        lambda *a, **k: fake_prepare(*a, **k, fail=True))
    assert main(["data", "shakespeare", str(out), "--quiet"]) == 2
    assert capsys.readouterr().err == "error: disk full\n"
    assert list(tmp_path.iterdir()) == []  # neither DIR nor a temporary directory
    monkeypatch.setattr(tlm.cli, "prepare_shakespeare", fake_prepare)
    assert main(["data", "shakespeare", str(out), "--vocab-size", "300"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["merges.txt", "train.npy", "train.txt",
                                                     "valid.npy", "valid.txt", "vocab.json"]
    assert "vocabulary 150 -> " in capsys.readouterr().out  # what was written
    assert (out / "merges.txt").read_text() == "merges.txt 300"
    assert [p.name for p in tmp_path.iterdir()] == ["data"]
    capsys.readouterr()
    assert main(["data", "shakespeare", str(out), "--vocab-size", "500"]) == 2
    assert capsys.readouterr().err == (f"error: DIR {out} is not empty: choose another, or "
                                       "pass --force to replace its data files\n")
    assert (out / "merges.txt").read_text() == "merges.txt 300"  # untouched
    assert main(["data", "shakespeare", str(out), "--vocab-size", "500", "--force"]) == 0
    assert (out / "merges.txt").read_text() == "merges.txt 500"


def test_usage_errors_are_one_line_with_status_2():
    for args in (["data", "tinystories", "d"], ["train", "--no-such-option"], ["frobnicate"], []):
        result = subprocess.run([sys.executable, "-m", "tlm", *args], capture_output=True,
                                text=True, cwd=ROOT, timeout=120)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith("error: ")
    assert "invalid choice: 'tinystories'" in subprocess.run(
        [sys.executable, "-m", "tlm", "data", "tinystories", "d"], capture_output=True,
        text=True, cwd=ROOT).stderr


def test_doctor_reports_what_is_installed():
    result = subprocess.run([sys.executable, "-m", "tlm", "doctor"], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stdout
    rows = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()}
    assert rows["torch"] == torch.__version__ and rows["numpy"] == np.__version__
    assert rows["python"] == ".".join(map(str, sys.version_info[:3]))
    assert rows["device"] == str(tlm.get_device())
    if torch.cuda.is_available():
        assert rows["cuda:0"] == torch.cuda.get_device_name(0).split()[0]
    else:
        assert rows["cuda"] == "no"


def test_resume_drops_an_incomplete_last_log_line(data_dir, tmp_path, capsys):
    common = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path / "r", "--steps", 10,
              "--checkpoint-every", 5, "--eval-every", 5]
    assert _main(list(map(str, [*common, "--stop-at", 5]))) == 0
    log = tmp_path / "r" / "log.jsonl"
    log.write_text(log.read_text() + '{"step": 6, "loss": 4.')  # a disk that filled up
    capsys.readouterr()
    assert _main(list(map(str, [*common, "--resume"]))) == 0
    assert f"{log}: dropped an incomplete last line" in capsys.readouterr().err
    steps = [r["step"] for r in map(json.loads, log.read_text().splitlines()) if "loss" in r]
    assert steps == list(range(1, 11))
    log.write_text('{"step": 1\n' + log.read_text())  # damage before the end is refused
    assert _main(list(map(str, [*common, "--resume"]))) == 2
    assert f"{log} line 1 is not a JSON record" in capsys.readouterr().err


def test_resume_refuses_another_tokenizer_and_a_fresh_run_never_overwrites(data_dir, tmp_path,
                                                                           capsys):
    common = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path / "r", "--steps", 4]
    assert _main(list(map(str, common))) == 0
    before = (tmp_path / "r" / "checkpoint.pt").read_bytes()
    assert _main(list(map(str, common))) == 2
    assert "already holds a run: --resume continues it" in capsys.readouterr().err
    write_vocab(byte_vocab() | {257: b"xy"}, data_dir / "vocab.json")
    assert _main(list(map(str, [*common, "--resume"]))) == 2
    assert "has another tokenizer than the run: its vocab.json differs" in capsys.readouterr().err
    assert (tmp_path / "r" / "checkpoint.pt").read_bytes() == before


@pytest.mark.parametrize("decay, spared", [
    ("all", set()),
    ("matrices", {"ln1.weight", "ln2.weight", "ln_final.weight"}),
    ("linear", {"ln1.weight", "ln2.weight", "ln_final.weight", "token_embeddings.weight"}),
])
def test_param_groups_decay_exactly_the_chosen_weights(decay, spared):
    torch.manual_seed(0)
    model = tlm.TransformerLM(50, 8, 16, 2, 2, 32, 10000.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for p in model.parameters():  # zero gradients: Adam's update is 0, only decay acts
        p.grad = torch.zeros_like(p)
    lr, wd = 0.1, 0.5
    tlm.AdamW(tlm.param_groups(model, wd, decay), lr=lr).step()
    for name, value in model.state_dict().items():
        kept = name.split(".", 2)[-1] in spared or name in spared
        factor = 1.0 if kept else 1 - lr * wd  # hand-derived: w <- w (1 - lr wd)
        torch.testing.assert_close(value, before[name] * factor, rtol=0, atol=0,
                                   msg=f"{decay}: {name}")
    with pytest.raises(ValueError, match="decay must be one of .*got 'gains'"):
        tlm.param_groups(model, wd, "gains")
    config = {**tlm.train.MODEL_OPTIONS, **tlm.train.OPTIMIZER_OPTIONS,
              **tlm.train.RUN_OPTIONS, "decay": "gains"}
    with pytest.raises(ValueError, match="--decay must be one of"):
        tlm.check_config(config)


def test_the_package_model_is_small_and_its_record_is_its_own(monkeypatch, tmp_path):
    import shlex

    import tlm.cli
    from tlm.train import MODEL_OPTIONS, OPTIMIZER_OPTIONS, SHAKESPEARE_MODEL
    folder = SHAKESPEARE_MODEL.parent
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 10 * 2**20
    state = torch.load(SHAKESPEARE_MODEL, weights_only=True)
    assert {v.dtype for v in state["model"].values()} == {torch.bfloat16}
    record = json.loads((folder / "run.json").read_text())
    log = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    last = [r for r in log if "val_loss" in r][-1]
    assert last["step"] == state["iteration"] == state["config"]["steps"] == record["steps"]
    assert record["held_out"]["bits_per_byte"] == last["val_bits_per_byte"]
    # what the chapters say of it: the best of the recorded recipes, better than the
    # README's 27-minute run (2.080 bits per byte), under 30 minutes of training
    shipped = record["held_out_bfloat16"]["bits_per_byte"]
    assert shipped <= min(r["held_out"]["bits_per_byte"] for r in record["compared"])
    assert abs(shipped - record["held_out"]["bits_per_byte"]) < 0.005  # bfloat16 costs ~0
    assert shipped < 2.080 and record["training_s"] <= 30 * 60
    # the recorded command asks for exactly the checkpoint's settings
    seen = {}
    monkeypatch.setattr(tlm.cli, "train_model", lambda config, **kw: seen.update(config))
    args = shlex.split(record["train"])
    assert args[:2] == ["tlm", "train"]
    assert tlm.cli.main([*args[1:], "--out-dir", str(tmp_path)]) == 0
    saved = tlm.train._run_state(SHAKESPEARE_MODEL)["config"]  # newer options: defaults
    for name in [*MODEL_OPTIONS, *OPTIMIZER_OPTIONS]:
        if name != "vocab_size":
            assert seen[name] == saved[name], name
    assert state["config"]["vocab_size"] == len(json.loads((folder / "vocab.json").read_text()))
    model, tokenizer = tlm.load_run(SHAKESPEARE_MODEL)
    assert model.lm_head.weight.dtype == torch.float32 and not model.training
    assert tokenizer.decode(tokenizer.encode("HAMLET:\n")) == "HAMLET:\n"
    sampled = run_generate("shakespeare", "--prompt", "HAMLET:", "--max-new-tokens", 30,
                           "--device", "cpu", "--top-k", 40)
    assert sampled.returncode == 0 and sampled.stdout.startswith("HAMLET:")
    assert len(sampled.stdout.strip()) > len("HAMLET:")


def test_param_groups_count_a_tied_weight_once():
    torch.manual_seed(0)
    model = tlm.TransformerLM(50, 8, 16, 2, 2, 32, 10000.0, tie_embeddings=True)
    for decay in ("all", "matrices", "linear"):
        groups = tlm.param_groups(model, 0.1, decay)
        ids = [id(p) for g in groups for p in g["params"]]
        assert len(ids) == len(set(ids)) == len(list(model.parameters()))
        tied = model.lm_head.weight  # a Linear's weight: decayed under every choice
        assert any(p is tied for p in groups[0]["params"])
        tlm.AdamW(groups, lr=1e-3)  # torch refuses a parameter listed twice


def test_a_run_saved_before_decay_and_tying_existed_resumes_as_it_ran(data_dir, tmp_path):
    common = [*TINY, "--data-dir", data_dir, "--steps", 20, "--checkpoint-every", 5,
              "--eval-every", 5, "--decay", "all"]
    assert _main(list(map(str, [*common, "--out-dir", tmp_path / "a"]))) == 0
    assert _main(list(map(str, [*common, "--out-dir", tmp_path / "b",
                                "--stop-at", 10]))) == 0
    ckpt = tmp_path / "b/checkpoint.pt"
    state = torch.load(ckpt, weights_only=True)
    for name in ("decay", "tie_embeddings"):  # as a checkpoint of an older tlm
        del state["config"][name]
    torch.save(state, ckpt)
    assert _main(list(map(str, ["--out-dir", tmp_path / "b", "--data-dir", data_dir,
                                "--resume", "--quiet"]))) == 0
    resumed = torch.load(ckpt, weights_only=True)
    assert resumed["config"]["decay"] == "all"  # what it did, not today's default
    assert resumed["config"]["tie_embeddings"] is False
    a, b = weights(tmp_path / "a/checkpoint.pt"), resumed["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the default now spares the RMSNorm gains
    assert tlm.train.OPTIMIZER_OPTIONS["decay"] == "matrices"


def test_generate_takes_a_run_directory_and_a_folder_named_shakespeare(run_dir, tmp_path):
    by_file = run_generate(run_dir / "checkpoint.pt", "--prompt", "the", "--max-new-tokens", 5)
    by_dir = run_generate(run_dir, "--prompt", "the", "--max-new-tokens", 5)
    assert by_dir.returncode == 0 and by_dir.stdout == by_file.stdout
    (tmp_path / "shakespeare").mkdir()  # not a run: the name still means the package's model
    packaged = subprocess.run([sys.executable, "-m", "tlm", "generate", "shakespeare",
                               "--prompt", "HAMLET:", "--max-new-tokens", "5", "--device",
                               "cpu"], capture_output=True, text=True, cwd=tmp_path,
                              timeout=300)
    assert packaged.returncode == 0 and packaged.stdout.startswith("HAMLET:")


# --- --deterministic ------------------------------------------------------------------

def _deterministic_at_each_batch(monkeypatch) -> list[bool]:
    """Whether torch's deterministic mode is on whenever a run draws a batch."""
    seen, real = [], tlm.train.get_batch

    def spy(*args, **kwargs):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(tlm.train, "get_batch", spy)
    return seen


def test_deterministic_reaches_torch_is_kept_on_resume_and_resumes_bit_for_bit(
        data_dir, tmp_path, monkeypatch):
    seen = _deterministic_at_each_batch(monkeypatch)
    common = [*TINY, "--data-dir", data_dir, "--steps", 12, "--checkpoint-every", 6,
              "--eval-every", 6, "--deterministic"]  # on the CPU, as TINY says
    assert _main(list(map(str, [*common, "--out-dir", tmp_path / "a"]))) == 0
    assert len(seen) == 12 and all(seen)
    assert not torch.are_deterministic_algorithms_enabled()  # as before the run
    assert _main(list(map(str, [*common, "--out-dir", tmp_path / "b",
                                "--stop-at", 6]))) == 0
    seen.clear()  # the flag is not given again: the checkpoint has it
    assert _main(list(map(str, ["--out-dir", tmp_path / "b", "--data-dir", data_dir,
                                "--resume", "--quiet"]))) == 0
    assert len(seen) == 6 and all(seen)
    resumed = torch.load(tmp_path / "b/checkpoint.pt", weights_only=True)
    assert resumed["config"]["deterministic"] is True
    a = weights(tmp_path / "a/checkpoint.pt")
    assert all(torch.equal(a[k], resumed["model"][k]) for k in a)
    seen.clear()  # a run without the flag leaves the mode alone
    assert _main(list(map(str, [*common[:-1], "--out-dir", tmp_path / "c"]))) == 0
    assert seen and not any(seen)



def test_a_resumed_run_can_turn_off_what_its_checkpoint_turned_on(data_dir, tmp_path,
                                                                  monkeypatch):
    """Every on/off option has a --no- form: --no-deterministic (or --no-compile) on
    --resume drops what the checkpoint's settings say."""
    seen = _deterministic_at_each_batch(monkeypatch)
    common = ["--out-dir", tmp_path, "--data-dir", data_dir]
    assert _main(list(map(str, [*TINY, *common, "--steps", 8, "--checkpoint-every", 4,
                                "--eval-every", 4, "--deterministic", "--stop-at", 4]))) == 0
    seen.clear()
    assert _main(list(map(str, [*common, "--resume", "--quiet", "--no-deterministic"]))) == 0
    assert len(seen) == 4 and not any(seen)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["config"]
    assert saved["deterministic"] is False and saved["compile"] is False

def test_train_model_restores_the_callers_deterministic_mode(data_dir, tmp_path):
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        args = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path, "--steps", 3,
                "--deterministic"]
        assert _main(list(map(str, args))) == 0
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("value, started, message", [
    (":0:0", False, "--deterministic: CUBLAS_WORKSPACE_CONFIG must be :4096:8 or "
                    ":16:8, got ':0:0'"),
    (None, True, "--deterministic: CUDA started before CUBLAS_WORKSPACE_CONFIG was "
                 "set; set CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting Python"),
    (None, False, None),  # set here, before cuBLAS reads it
    (":16:8", True, None),  # cuBLAS's other deterministic setting
])
def test_deterministic_on_cuda_needs_the_cublas_workspace_setting(monkeypatch, value,
                                                                   started, message):
    """The rule, on any machine: torch's view of CUDA is patched."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: started)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "restored after the test")
    if value is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    try:
        if message is not None:
            with pytest.raises(ValueError, match=re.escape(message)):
                tlm.train._make_deterministic(torch.device("cuda"))
            assert not torch.are_deterministic_algorithms_enabled()
        else:
            tlm.train._make_deterministic(torch.device("cuda"))
            assert torch.are_deterministic_algorithms_enabled()
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == (value or ":4096:8")
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_deterministic_on_cuda_refuses_another_cublas_workspace(data_dir, tmp_path,
                                                                 monkeypatch, capsys):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    code = _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path,
                                "--device", "cuda", "--deterministic"])))
    assert code == 2 and not (tmp_path / "checkpoint.pt").exists()
    assert capsys.readouterr().err == ("error: --deterministic: "
                                       "CUBLAS_WORKSPACE_CONFIG must be :4096:8 or "
                                       ":16:8, got ':0:0'\n")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_deterministic_on_cuda_resumes_bit_for_bit(data_dir, tmp_path):
    """On CUDA, in new processes (cuBLAS reads its setting when it starts)."""
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    common = [*TINY, "--data-dir", data_dir, "--steps", 40, "--checkpoint-every", 20,
              "--eval-every", 20, "--device", "cuda", "--deterministic"]
    for args in ([*common, "--out-dir", tmp_path / "a"],
                 [*common, "--out-dir", tmp_path / "b", "--stop-at", 20],
                 ["--out-dir", tmp_path / "b", "--data-dir", data_dir, "--resume"]):
        done = subprocess.run([sys.executable, "-m", "tlm", "train", *map(str, args)],
                              capture_output=True, text=True, cwd=ROOT, timeout=300,
                              env=env)
        assert done.returncode == 0, done.stderr
    a, b = weights(tmp_path / "a/checkpoint.pt"), weights(tmp_path / "b/checkpoint.pt")
    assert all(v.is_cuda for v in a.values())
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- --compile: compiled gradients checked against eager ones -----------------------

class _Scaled(torch.autograd.Function):
    """The identity, whose backward pass multiplies the gradient by `scale`."""

    @staticmethod
    def forward(ctx, w, scale):
        ctx.scale = scale
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def _wrong_compiler(name: str, scale: float):
    """A stand-in for torch.compile that computes the forward pass right and the
    gradient of the parameter `name` `scale` times too large, as a broken compiler
    could."""
    def compile(module, *args, **kwargs):
        def forward(x):
            params = dict(module.named_parameters())
            params[name] = _Scaled.apply(params[name], scale)
            return torch.func.functional_call(module, params, (x,))
        return forward
    return compile


Q = "layers.0.attn.q_proj.weight"


def _tiny_model_and_batch():
    config = {**tlm.train.MODEL_OPTIONS, **tlm.train.OPTIMIZER_OPTIONS,
              "vocab_size": 257, "context_length": 16, "d_model": 32, "num_layers": 2,
              "num_heads": 2, "d_ff": 64}
    model = tlm.train.build_model(config)
    ids = torch.randint(0, 257, (4, 17), generator=torch.Generator().manual_seed(0))
    return model, ids[:, :-1], ids[:, 1:]


@pytest.mark.parametrize("scale, stops", [
    (0.0, True), (-1.0, True), (2.0, True), (1.01, True), (1.002, True),
    (1 + 1e-4, False), (1.0, False)])
def test_the_compile_check_stops_gradients_off_by_more_than_its_tolerance(scale, stops):
    model, x, y = _tiny_model_and_batch()
    wrong = _wrong_compiler(Q, scale)(model)
    rng = torch.get_rng_state()
    errors = tlm.train._gradient_errors(model, wrong, x, y)
    assert errors[Q] == pytest.approx(abs(scale - 1), rel=1e-3, abs=1e-6)
    assert max(errors.values()) == errors[Q] or scale == 1
    assert tlm.train.COMPILE_TOLERANCE == 1e-3
    if stops:
        with pytest.raises(tlm.train.CompileCheckError, match=re.escape(
                f"in float32, {Q} is off by a relative error of {errors[Q]:.2g} "
                "against eager (at most 0.001); train without --compile")):
            tlm.train._check_compiled(model, wrong, x, y)
    else:
        tlm.train._check_compiled(model, wrong, x, y)
    # the run goes on as without the check: no gradient kept, no random number drawn
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_compile_run_with_wrong_gradients_stops_before_its_first_step(
        data_dir, tmp_path, monkeypatch, capsys, dtype):
    """Checked in float32 whatever --dtype says."""
    monkeypatch.setattr(torch, "compile", _wrong_compiler(Q, 0.0))
    code = _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path,
                                "--compile", "--dtype", dtype])))
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err == (f"error: --compile: torch {torch.__version__} compiled this model "
                   f"into wrong gradients: in float32, {Q} is off by a relative error "
                   "of 1 against eager (at most 0.001); train without --compile\n")
    assert not (tmp_path / "checkpoint.pt").exists()


def test_a_compile_run_whose_gradients_are_right_trains(data_dir, tmp_path,
                                                        monkeypatch):
    """A scale within the tolerance passes the check, and the run then trains with
    the 'compiled' forward pass."""
    monkeypatch.setattr(torch, "compile", _wrong_compiler(Q, 1 + 1e-5))
    common = [*TINY, "--data-dir", data_dir, "--steps", 6, "--checkpoint-every", 3]
    assert _main(list(map(str, [*common, "--out-dir", tmp_path / "c", "--compile",
                                "--stop-at", 3]))) == 0
    assert _main(list(map(str, ["--out-dir", tmp_path / "c", "--data-dir", data_dir,
                                "--resume", "--quiet"]))) == 0  # checked again
    assert torch.load(tmp_path / "c/checkpoint.pt", weights_only=True)["iteration"] == 6


def test_torch_compile_passes_the_check_and_trains(data_dir, tmp_path, capsys):
    """The real compiler (Inductor), on the whole tiny model: a softmax or an RMSNorm whose
    `forward` returned a tensor it changed in place made torch 2.11 compile wrong gradients,
    which the check stops; the book's return a new tensor."""
    torch._dynamo.reset()
    args = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path, "--steps", 3,
            "--compile"]
    assert _main(list(map(str, args))) == 0, capsys.readouterr().err


# --- a run that does not learn --------------------------------------------------------

def _warnings(err: str, log: Path) -> tuple[list[str], list[int]]:
    """The warning lines on stderr, and the steps of the log's warning records."""
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return ([line for line in err.splitlines() if line.startswith("warning: ")],
            [r["step"] for r in records if "warning" in r])


def test_a_run_that_does_not_learn_is_warned_about(data_dir, tmp_path, monkeypatch,
                                                   capsys):
    common = [*TINY, "--data-dir", data_dir, "--steps", 60, "--eval-every", 30,
              "--checkpoint-every", 30]
    assert _main(list(map(str, [*common, "--out-dir", tmp_path / "learns"]))) == 0
    assert _warnings(capsys.readouterr().err, tmp_path / "learns/log.jsonl") == ([], [])
    monkeypatch.setattr(tlm.train, "get_lr_cosine_schedule", lambda *args: 0.0)
    assert _main(list(map(str, [*common, "--out-dir", tmp_path / "flat"]))) == 0
    lines, steps = _warnings(capsys.readouterr().err, tmp_path / "flat/log.jsonl")
    assert steps == [60] and len(lines) == 1  # step 30 is too early to tell
    assert re.fullmatch(r"warning: the training loss of step 60, \d\.\d{3}, is not "
                        r"5% below step 1's, \d\.\d{3}: the model is not learning "
                        r"\(is --lr too small\? with --compile, try without it\)",
                        lines[0])
    # resumed, from a checkpoint of step 30 that has step 1's loss, or (an older tlm's)
    # that has not: then from the log
    for keep in (True, False):
        out = tmp_path / f"resumed-{keep}"
        assert _main(list(map(str, [*common, "--out-dir", out, "--stop-at", 30]))) == 0
        if not keep:
            state = torch.load(out / "checkpoint.pt", weights_only=True)
            del state["first_loss"]
            torch.save(state, out / "checkpoint.pt")
        capsys.readouterr()
        assert _main(list(map(str, ["--out-dir", out, "--data-dir", data_dir,
                                    "--resume", "--quiet"]))) == 0
        assert _warnings(capsys.readouterr().err, out / "log.jsonl") == (lines, [60])


# --- tlm doctor -----------------------------------------------------------------------

def _doctor_rows(capsys) -> dict[str, str]:
    assert main(["doctor"]) == 0
    return {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}


def test_doctor_reports_a_package_without_metadata(monkeypatch, capsys):
    """Importable from a folder on PYTHONPATH, say, with no distribution metadata."""
    real = importlib.metadata.distribution

    def distribution(name):
        if name == "numpy":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    assert _doctor_rows(capsys)["numpy"].split(None, 1)[1].startswith("no metadata")


@pytest.mark.parametrize("version, tested", [
    ("2.11.0", True), ("2.13.0+cu130", True), ("2.12.1+cpu", True),
    ("2.10.2", False), ("2.14.0.dev20270101+cu130", False), ("3.0.0", False),
    ("unknown", False)])
def test_doctor_says_whether_torch_is_in_the_tested_range(monkeypatch, capsys, version,
                                                          tested):
    monkeypatch.setattr(torch, "__version__", version)
    row = _doctor_rows(capsys)["torch"]
    assert row.split()[1] == version
    verdict = ("in the tested range 2.11-2.13;" if tested
               else "warning: outside the tested range 2.11-2.13;")
    assert row.split(None, 2)[2].startswith(verdict)


def test_pyproject_admits_the_tested_torch_range():
    import tomllib

    from tlm.cli import TESTED_TORCH
    (a, b), (c, d) = TESTED_TORCH
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [r for r in project["dependencies"] if re.match(r"torch\b", r)] == \
        [f"torch>={a}.{b},<{c}.{d + 1}"]


# --- one run per directory, and what a run reports ----------------------------------

def test_a_run_owns_its_directory_while_it_goes_on(data_dir, tmp_path, capsys):
    """Two runs into one --out-dir at once, or a --resume while the run goes on: the
    second is refused before it writes anything. The lock ends with its process."""
    import fcntl
    out, common = tmp_path / "run", [*TINY, "--data-dir", data_dir, "--steps", 4]
    assert _main(list(map(str, [*common, "--out-dir", out]))) == 0
    log = (out / "log.jsonl").read_text()
    with open(out / ".lock") as held:  # as another run holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        for more in ([], ["--resume"]):
            assert _main(list(map(str, [*common, "--out-dir", out, *more]))) == 2
            assert capsys.readouterr().err == (f"error: --out-dir {out} is in use by "
                                               "another run: wait for it to end, or "
                                               "choose another\n")
        assert (out / "log.jsonl").read_text() == log
    proc = subprocess.Popen([sys.executable, "-m", "tlm", "train", *map(str, common),
                             "--steps", "100000", "--out-dir", tmp_path / "live"], cwd=ROOT)
    deadline = time.monotonic() + 120
    while not (tmp_path / "live/log.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert _main(list(map(str, [*common, "--out-dir", tmp_path / "live"]))) == 2
        assert "is in use by another run" in capsys.readouterr().err
    finally:
        proc.kill()
        proc.wait()
    assert _main(list(map(str, [*common, "--out-dir", tmp_path / "live"]))) == 0


def test_a_refused_run_leaves_no_directory_and_a_run_removes_stale_temporary_files(
        data_dir, tmp_path):
    out = tmp_path / "new"
    (data_dir / "valid.npy").rename(data_dir / "held.npy")
    assert _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", out]))) == 2
    assert not out.exists()
    (data_dir / "held.npy").rename(data_dir / "valid.npy")
    out.mkdir()
    stale = [out / ".checkpoint.pt.k2j4x9.tmp", out / ".log.jsonl.a1b2c3.tmp"]
    for path in stale:  # what a run killed while writing leaves
        path.write_bytes(b"partial")
    (out / "notes.txt").write_text("mine")
    assert _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", out,
                                "--steps", 2]))) == 0
    assert not any(path.exists() for path in stale)
    assert (out / "notes.txt").read_text() == "mine"


def test_a_run_stopped_during_its_last_evaluation_evaluates_on_resume(
        data_dir, tmp_path, monkeypatch, capsys):
    """The last checkpoint is written before the last evaluation: a run interrupted
    there resumes into that evaluation and reports it, not step 0's."""
    import tlm.train
    common = [*TINY, "--data-dir", data_dir, "--steps", 6, "--eval-every", 100]
    assert _main(list(map(str, [*common, "--out-dir", tmp_path / "whole"]))) == 0
    whole = capsys.readouterr().out
    assert whole.startswith("step 6: held-out loss ")
    evaluate = tlm.train.evaluate

    def interrupted_at_the_end(model, data, lengths, batch_size=16, max_windows=None):
        if max_windows is None:  # the last evaluation scores every window
            raise KeyboardInterrupt
        return evaluate(model, data, lengths, batch_size, max_windows)

    monkeypatch.setattr(tlm.train, "evaluate", interrupted_at_the_end)
    out = tmp_path / "cut"
    assert _main(list(map(str, [*common, "--out-dir", out]))) == 130
    assert torch.load(out / "checkpoint.pt", weights_only=True)["iteration"] == 6
    monkeypatch.setattr(tlm.train, "evaluate", evaluate)
    capsys.readouterr()
    assert _main(["--out-dir", str(out), "--resume", "--quiet"]) == 0
    assert capsys.readouterr().out == whole
    records = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss" in r] == [0, 6]
    assert _main(["--out-dir", str(out), "--resume", "--quiet"]) == 0  # once only
    assert capsys.readouterr().out == whole
    assert (out / "log.jsonl").read_text().count("val_loss") == 2


def test_resume_refuses_a_stop_below_the_checkpoint(data_dir, tmp_path, capsys):
    common = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path, "--steps", 8]
    assert _main(list(map(str, [*common, "--stop-at", 4]))) == 0
    capsys.readouterr()
    assert _main(list(map(str, [*common, "--resume", "--stop-at", 3]))) == 2
    assert capsys.readouterr().err == ("error: --stop-at 3: the run is already at "
                                       "step 4\n")


def test_a_vocabulary_other_than_the_tokenizers_is_refused(data_dir, tmp_path, capsys):
    """A larger one would let the sampler draw ids that the tokenizer cannot decode."""
    for size in (512, 200):
        out = tmp_path / str(size)
        assert _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", out,
                                    "--vocab-size", size]))) == 2
        assert capsys.readouterr().err == (
            f"error: --vocab-size must be the tokenizer's, 257 (in "
            f"{data_dir / 'vocab.json'}), or left out; got {size}\n")
        assert not out.exists()


@pytest.mark.parametrize("name", ["meta", "xpu"])
def test_a_device_that_cannot_hold_numbers_is_one_line(run_dir, data_dir, tmp_path,
                                                       name, capsys, monkeypatch):
    xpu = getattr(torch, "xpu", None)
    if name == "xpu" and xpu is not None and xpu.is_available():
        pytest.skip("this machine has an XPU")
    out = tmp_path / "r"
    assert _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", out,
                                "--device", name]))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: device: {name} is not usable here (")
    assert err.endswith("); try cpu\n") and len(err.splitlines()) == 1
    assert not out.exists()
    assert main(["generate", str(run_dir), "--device", name]) == 2
    assert capsys.readouterr().err == err
    monkeypatch.setenv("TLM_DEVICE", name)
    assert _doctor_rows(capsys)["device"].split()[1:3] == ["unusable", "device:"]


def test_a_full_disk_is_one_line_naming_the_file(data_dir, tmp_path):
    """A file-size limit below a checkpoint's size: the write fails part-way, inside
    torch.save, as on a full disk."""
    import resource
    size = 160_000  # bytes; the tiny model's checkpoint needs about 450,000

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    out = tmp_path / "run"
    args = [*TINY, "--data-dir", data_dir, "--out-dir", out, "--steps", 2]
    done = subprocess.run([sys.executable, "-m", "tlm", "train", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          preexec_fn=limited)
    assert (done.returncode, done.stderr) == (
        2, f"error: cannot write {out / 'checkpoint.pt'}: File too large (none was "
        "kept)\n")
    assert not (out / "checkpoint.pt").exists() and not list(out.glob(".*.tmp"))


@pytest.mark.parametrize("content, message", [
    (b"hello\n", "is not a .npy file of token ids"),
    (None, "is not a whole .npy file of token ids: "),  # a copy cut short
])
def test_a_token_file_that_is_not_whole_is_named(data_dir, tmp_path, capsys, content,
                                                 message):
    path = data_dir / "train.npy"
    path.write_bytes(content if content is not None else path.read_bytes()[:5000])
    assert _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir",
                                tmp_path / "r"]))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} {message}") and len(err.splitlines()) == 1
    assert "pickle" not in err


@pytest.mark.parametrize("config, message", [
    ({"learning_rate": 5.0}, "unknown option 'learning_rate'; did you mean 'lr'?"),
    ({"tie_embedings": True}, "unknown option 'tie_embedings'; did you mean "
                              "'tie_embeddings'?"),
    ({"frobnicate": 1}, "unknown option 'frobnicate'"),
    ({"compile": "no"}, "--compile must be True or False, got 'no'"),
    ({5: 1}, "unknown option 5"),
    ({"data_dir": None}, "--data-dir must be a path, got None"),
])
def test_train_model_refuses_an_option_it_does_not_know(tmp_path, config, message):
    with pytest.raises(ValueError) as error:
        train_model({"out_dir": str(tmp_path / "r"), **config})
    assert str(error.value) == message
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, message", [
    (["--lr", 1e38, "--min-lr", 0], "--lr must be small enough that lr / (1 - beta1) "
     "fits float32 (<= 3.4e+38), got 1e+38"),
    (["--lr", 1, "--weight-decay", 1e39], "--weight-decay must be small enough that "
     "lr * weight_decay fits float32 (<= 3.4e+38), got 1e+39"),
    (["--eps", 1e39], "--eps must be small enough that eps fits float32 (<= 3.4e+38), "
     "got 1e+39"),
    (["--seed", 10**29], f"--seed must be an int in [0, 2**63), got {10**29}"),
    (["--seed", -1], "--seed must be an int in [0, 2**63), got -1"),
    (["--eps", 1e-46], "--eps must be a number float32 does not round to 0 (>= 1.4e-45), "
     "got 1e-46"),
])
def test_numbers_past_what_training_can_hold_are_refused(tmp_path, capsys, args,
                                                         message):
    out = tmp_path / "run"
    code = _main(list(map(str, [*TINY, "--data-dir", tmp_path / "none", "--out-dir", out,
                                *args])))
    assert code == 2 and capsys.readouterr().err == f"error: {message}\n"
    assert not out.exists()


def test_generate_refuses_a_seed_torch_cannot_take(run_dir, capsys):
    assert main(["generate", str(run_dir), "--seed", str(2**64), "--device", "cpu"]) == 2
    assert capsys.readouterr().err == ("error: --seed must be an int in [0, 2**63), "
                                       f"got {2**64}\n")


def test_data_prepares_its_files_inside_dir(tmp_path, monkeypatch):
    """DIR may be a mount point (a Docker volume, another disk), where a folder beside
    it is on another file system and os.replace cannot move files out of it."""
    import tlm.cli
    out, places = tmp_path / "mounted", []

    def where(out_dir, *args, **kwargs):
        places.append(Path(out_dir).parent)
        return fake_prepare(out_dir, *args, **kwargs)

    monkeypatch.setattr(tlm.cli, "prepare_shakespeare", where)
    assert main(["data", "shakespeare", str(out), "--quiet"]) == 0
    assert places == [out]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_doctor_names_a_package_shadowed_by_a_folder(tmp_path):
    """A folder named like an installed package, in the working directory, is what
    `python -m tlm` imports: the row says so instead of the installed version."""
    (tmp_path / "tiktoken").mkdir()
    (tmp_path / "tiktoken" / "__init__.py").write_text("")
    done = subprocess.run([sys.executable, "-m", "tlm", "doctor"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("tiktoken"))
    version = importlib.metadata.version("tiktoken")
    assert row.split(None, 2)[1:] == [
        "shadowed", f"imported from {tmp_path / 'tiktoken'}, not from the installed "
        f"tiktoken {version}"]


def test_a_file_system_without_locks_runs_unlocked_with_a_warning(data_dir, tmp_path,
                                                                  monkeypatch, capsys):
    """flock fails with ENOLCK or ENOSYS on some network file systems (Lustre without
    -o flock): the run goes on, and says that it is not protected."""
    import errno

    import tlm.train

    def no_locks(f, how):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(tlm.train.fcntl, "flock", no_locks)
    out = tmp_path / "run"
    assert _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", out,
                                "--steps", 2]))) == 0
    assert capsys.readouterr().err == (
        f"warning: {out / '.lock'} cannot be locked ({os.strerror(errno.ENOLCK)}): two "
        f"runs in {out} at once would not be refused\n")
    assert (out / "checkpoint.pt").exists()


def test_doctor_counts_an_editable_install_as_installed(monkeypatch, capsys, tmp_path):
    """`pip install -e`: the package is imported from its own folder, which is not
    where the distribution's metadata lies, and that is no shadowing."""
    import importlib.util
    real_spec, real_distribution = importlib.util.find_spec, importlib.metadata.distribution
    (tmp_path / "tiktoken").mkdir()
    (tmp_path / "tiktoken" / "__init__.py").write_text("")

    def find_spec(name, *args):
        if name == "tiktoken":
            return importlib.util.spec_from_file_location(
                "tiktoken", tmp_path / "tiktoken" / "__init__.py",
                submodule_search_locations=[str(tmp_path / "tiktoken")])
        return real_spec(name, *args)

    class Editable:
        def __init__(self, found):
            self.found, self.version = found, found.version

        def locate_file(self, path):
            return self.found.locate_file(path)

        def read_text(self, name):
            if name == "direct_url.json":
                return json.dumps({"url": f"file://{tmp_path}",
                                   "dir_info": {"editable": editable}})
            return self.found.read_text(name)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib.metadata, "distribution",
                        lambda name: Editable(real_distribution(name)))
    version = importlib.metadata.version("tiktoken")
    for editable, shown in ((True, version), (False, "shadowed")):
        assert _doctor_rows(capsys)["tiktoken"].split()[1] == shown


def test_doctor_in_an_environment_of_symlinks(tmp_path):
    """site-packages made of links (a Nix-style environment, a symlink farm): every
    package is the installed one, none is shadowed."""
    import site
    farm = tmp_path / "farm"
    farm.mkdir()
    packages = Path(next(p for p in site.getsitepackages() if Path(p, "torch").exists()))
    for entry in packages.iterdir():
        if not entry.name.startswith("__editable__"):
            (farm / entry.name).symlink_to(entry)
    done = subprocess.run([sys.executable, "-S", "-m", "tlm", "doctor"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{farm}"})
    assert done.returncode == 0, done.stderr
    rows = [line.split()[:2] for line in done.stdout.splitlines()]
    assert ["numpy", importlib.metadata.version("numpy")] in rows
    assert not [row for row in rows if row[1] == "shadowed"], done.stdout


def test_train_model_takes_a_dict_and_a_bool(tmp_path):
    for config, resume in (([("steps", 3)], False), ({}, "no")):
        with pytest.raises(TypeError, match="^train_model takes a config dict and resume "
                                            "True or False, got "):
            train_model(config, resume=resume)


def test_data_removes_what_a_killed_run_left_inside_dir(tmp_path, monkeypatch, capsys):
    import tlm.cli
    out = tmp_path / "data"
    (out / ".tmp-k1ll3d").mkdir(parents=True)
    (out / ".tmp-k1ll3d" / "train.txt").write_text("half")
    monkeypatch.setattr(tlm.cli, "prepare_shakespeare", fake_prepare)
    assert main(["data", "shakespeare", str(out), "--quiet"]) == 0  # not "not empty"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


# --- the loop and its runtime ---------------------------------------------------------

def _plain_loop(data_dir: Path, config: dict) -> tuple[list[float], dict, list[float]]:
    """The loop of chapter 17's "The loop, plain", with A micro-batches a step and the
    script's seeding, written out here from the book's pieces: the training losses, the
    final weights and the held-out losses at every eval_every steps and the last."""
    from tlm.train import build_model, param_groups
    A, B, T = config["grad_accum_steps"], config["batch_size"], config["context_length"]
    model = build_model(config)
    opt = tlm.AdamW(param_groups(model, config["weight_decay"], config["decay"]),
                    lr=config["lr"], betas=(config["beta1"], config["beta2"]),
                    eps=config["eps"])
    samplers = [torch.Generator().manual_seed(config["seed"] + j) for j in range(A)]
    train = np.load(data_dir / "train.npy", mmap_mode="r")
    valid = np.load(data_dir / "valid.npy", mmap_mode="r")
    lengths = token_bytes(byte_vocab())
    losses, held_out = [], []
    for step in range(config["steps"] + 1):
        if step % config["eval_every"] == 0 or step == config["steps"]:
            windows = None if step == config["steps"] else config["eval_windows"]
            held_out.append(evaluate(model, valid, lengths, max_windows=windows)["loss"])
        if step == config["steps"]:
            return losses, model.state_dict(), held_out
        lr = tlm.get_lr_cosine_schedule(step, config["lr"], config["min_lr"],
                                        config["warmup_steps"], config["steps"])
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for sampler in samplers:
            x, y = get_batch(train, B, T, "cpu", sampler)
            part = tlm.cross_entropy(model(x), y) / A
            part.backward()
            total = total + part.detach()
        tlm.gradient_clipping(model.parameters(), config["grad_clip"])
        opt.step()
        losses.append(total.item())


TINY_CONFIG = dict(context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=64,
                   batch_size=4, warmup_steps=2, eval_windows=4, log_every=1, steps=12,
                   eval_every=6, checkpoint_every=6, grad_accum_steps=2, device="cpu")


def test_the_default_run_is_the_plain_loop_bit_for_bit(data_dir, tmp_path):
    """train_model's default path (one process, float32, the default decay and
    attention) computes what the plain loop computes: every logged loss, every held-out
    loss and the final weights, bit for bit."""
    from tlm.train import MODEL_OPTIONS, OPTIMIZER_OPTIONS, RUN_OPTIONS
    config = {**TINY_CONFIG, "data_dir": str(data_dir), "out_dir": str(tmp_path / "r")}
    train_model(config, progress=False)
    log = [json.loads(line) for line in open(tmp_path / "r/log.jsonl")]
    full = {**MODEL_OPTIONS, **OPTIMIZER_OPTIONS, **RUN_OPTIONS, **config,
            "vocab_size": 257}
    losses, final, held_out = _plain_loop(data_dir, full)
    assert [r["loss"] for r in log if "loss" in r] == losses
    assert [r["val_loss"] for r in log if "val_loss" in r] == held_out
    saved = weights(tmp_path / "r/checkpoint.pt")
    assert saved.keys() == final.keys()
    assert all(torch.equal(saved[k], final[k]) for k in final)


def test_the_loop_goes_through_its_runtime_at_every_point(data_dir, tmp_path,
                                                          monkeypatch):
    """A runtime put first in RUNTIMES runs the loop: each point is called as often as
    the loop says, and a runtime that does what Runtime does changes nothing."""
    calls = {}

    class Counting(tlm.Runtime):
        def __getattribute__(self, name):
            if name in ("wrap", "micro_batch", "autocast", "backward", "step", "mean",
                        "state_dict", "load_state_dict"):
                calls[name] = calls.get(name, 0) + 1
            return super().__getattribute__(name)

    config = {**TINY_CONFIG, "data_dir": str(data_dir)}
    train_model({**config, "out_dir": str(tmp_path / "plain")}, progress=False)
    monkeypatch.setattr(tlm.train, "RUNTIMES", [Counting, *tlm.train.RUNTIMES])
    train_model({**config, "out_dir": str(tmp_path / "counted")}, progress=False)
    steps, A = config["steps"], config["grad_accum_steps"]
    assert calls == {"wrap": 1, "micro_batch": steps * A, "autocast": steps * A,
                     "backward": steps * A, "step": steps, "mean": steps,
                     "state_dict": steps // config["checkpoint_every"]}
    a, b = weights(tmp_path / "plain/checkpoint.pt"), weights(tmp_path / "counted/checkpoint.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_train_model_takes_the_first_runtime_that_accepts_the_run(monkeypatch):
    from tlm.train import MODEL_OPTIONS, OPTIMIZER_OPTIONS, RUN_OPTIONS, _runtime
    config = {**MODEL_OPTIONS, **OPTIMIZER_OPTIONS, **RUN_OPTIONS, "device": "cpu"}
    cpu = torch.device("cpu")
    assert type(_runtime(config, cpu)) is tlm.Runtime
    for other in ({"dtype": "bfloat16"}, {"dtype": "float16"}):
        assert type(_runtime({**config, **other}, cpu)) is tlm.DistributedRuntime
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets
    assert not tlm.Runtime.accepts(config)
    assert not tlm.Runtime.accepts({**config, "fsdp": True, "dtype": "float32"})
    monkeypatch.setattr(tlm.train, "RUNTIMES", [tlm.Runtime])
    with pytest.raises(ValueError, match="need the runtime of tlm.distributed"):
        _runtime(config, cpu)


# --- a run's directory, and what it refuses --------------------------------------------

def _tree(path: Path) -> dict:
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_a_new_run_refuses_a_directory_with_another_tokenizer(data_dir, tmp_path,
                                                              capsys):
    """--out-dir naming another data directory copied this data's vocab.json and
    merges.txt over its own, and its train.npy no longer matched its tokenizer: refused
    in one line before anything is written there (no lock file either)."""
    other = tmp_path / "other"
    other.mkdir()
    write_vocab(byte_vocab() | {257: b"th"}, other / "vocab.json")
    write_merges([(b"t", b"h")], other / "merges.txt")
    np.save(other / "train.npy", np.arange(300, dtype=np.uint16) % 258)
    before = _tree(other)
    args = [*TINY, "--data-dir", data_dir, "--steps", 3]
    assert _main(list(map(str, [*args, "--out-dir", other]))) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --out-dir {other} holds another tokenizer than --data-dir "
                   f"{data_dir} (its vocab.json differs), which a run would replace: "
                   "choose another --out-dir\n")
    assert _tree(other) == before and not (other / ".lock").exists()
    # a merges.txt that the data lacks would be left beside the data's vocabulary
    (tmp_path / "project").mkdir()
    write_vocab(byte_vocab(), tmp_path / "project" / "vocab.json")
    write_merges([(b"a", b"b")], tmp_path / "project" / "merges.txt")
    assert _main(list(map(str, [*args, "--out-dir", tmp_path / "project"]))) == 2
    assert "(its merges.txt differs)" in capsys.readouterr().err
    # the same tokenizer, and files of the user's own beside it: the run goes on
    (tmp_path / "project" / "merges.txt").unlink()
    (tmp_path / "project" / "notes.txt").write_text("mine")
    assert _main(list(map(str, [*args, "--out-dir", tmp_path / "project"]))) == 0
    assert (tmp_path / "project" / "notes.txt").read_text() == "mine"


def test_resume_from_another_working_directory_finds_the_data(data_dir, tmp_path,
                                                             monkeypatch, capsys):
    """The run records its data directory whole: --resume from elsewhere finds it. A
    run of an older tlm recorded it as typed; then the message says where the path came
    from instead of blaming a --data-dir never given."""
    monkeypatch.chdir(tmp_path)
    common = [*TINY, "--steps", 6, "--checkpoint-every", 3]
    assert _main(list(map(str, [*common, "--data-dir", "data", "--out-dir", "run",
                                "--stop-at", 3]))) == 0
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert saved["config"]["data_dir"] == str(data_dir)  # absolute
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert _main(["--out-dir", str(tmp_path / "run"), "--resume", "--quiet"]) == 0
    capsys.readouterr()
    # a checkpoint of an older tlm, with the path as it was typed
    saved["config"]["data_dir"] = "data"
    torch.save(saved, tmp_path / "run" / "checkpoint.pt")
    assert _main(["--out-dir", str(tmp_path / "run"), "--resume", "--quiet"]) == 2
    ckpt = tmp_path / "run" / "checkpoint.pt"
    assert capsys.readouterr().err == (
        f"error: --resume: the run's data directory data (recorded in {ckpt}, relative "
        "to where the run started) is not there: pass --data-dir\n")
    assert _main(["--out-dir", str(tmp_path / "run"), "--resume", "--quiet",
                  "--data-dir", str(data_dir)]) == 0


def _failing_backend(gm, example_inputs):
    raise torch._inductor.exc.InvalidCxxCompiler("g++")  # Inductor, without g++


def test_a_compiler_that_cannot_build_stops_the_run_in_one_line(data_dir, tmp_path,
                                                                monkeypatch, capsys):
    """No C++ compiler (a slim Docker image, macOS without Xcode's tools): Inductor's
    80-line traceback became one line and status 1, before the first step."""
    torch._dynamo.reset()
    real = torch.compile
    monkeypatch.setattr(torch, "compile",
                        lambda model, **kw: real(model, backend=_failing_backend))
    code = _main(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir",
                                tmp_path / "run", "--compile"])))
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("error: --compile: torch.compile cannot build this model here (")
    assert "InvalidCxxCompiler" in err and err.endswith("; train without --compile\n")
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
    torch._dynamo.reset()


def test_doctor_says_whether_compile_can_build_here(monkeypatch, capsys):
    rows = _doctor_rows(capsys)
    assert re.fullmatch(r"compile\s+ok\s+C\+\+ compiler \S+, for --compile", rows["compile"])
    monkeypatch.setattr(torch._inductor.config.cpp, "cxx", (None, "/nonexistent/g++"))
    rows = _doctor_rows(capsys)
    assert re.fullmatch(r"compile\s+no\s+--compile on the CPU needs a C\+\+ compiler \(g\+\+ "
                        r"or clang\): InvalidCxxCompiler: No working C\+\+ compiler .*",
                        rows["compile"]), rows["compile"]


def test_generate_with_a_huge_max_new_tokens_stops_at_the_end_token(run_dir):
    """--max-new-tokens 10**20 with an end token means "until the document ends": the
    cached loop reserved room for all of it (an 80 GB allocation, or for 10**20 a C++
    stack). Here a model built to say <|endoftext|> at once: the stream stays the
    token embedding, all ones, and lm_head reads it only in the end token's row."""
    ckpt = run_dir / "checkpoint.pt"
    state = torch.load(ckpt, weights_only=True)
    for name, w in state["model"].items():
        if name.endswith(("output_proj.weight", "ffn.w2.weight")):
            w.zero_()
    state["model"]["token_embeddings.weight"].fill_(1.0)
    state["model"]["lm_head.weight"].zero_()[256] = 1.0
    torch.save(state, ckpt)
    for cache in ([], ["--no-cache"]):
        done = run_generate(ckpt, "--prompt", "the cat", "--max-new-tokens", 10**20,
                            "--num-samples", 2, "--temperature", 0, *cache)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout == "the cat\n\n---\nthe cat\n"
