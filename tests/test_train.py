"""tlm.train: the corpus, get_batch, evaluation, the plain loop that `tlm train` runs, the
parameter groups of weight decay, and another text cut in two (split_text, prepare_text)."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tlm
from tlm.run import train_model
from tlm.train import (HELD_OUT, evaluate, get_batch, play_text, prepare_text,
                       shakespeare_splits, split_text, token_bytes)
from tiny_runs import (ROOT, TINY, TINY_CONFIG, byte_vocab, run_generate, tlm_train,
                       weights)


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
    config = {**tlm.run.MODEL_OPTIONS, **tlm.run.OPTIMIZER_OPTIONS,
              **tlm.run.RUN_OPTIONS, "decay": "gains"}
    with pytest.raises(ValueError, match="--decay must be one of"):
        tlm.check_config(config)


def test_the_package_model_is_small_and_its_record_is_its_own(monkeypatch, tmp_path):
    import shlex

    import tlm.cli
    from tlm.run import MODEL_OPTIONS, OPTIMIZER_OPTIONS
    from tlm.train import SHAKESPEARE_MODEL
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
    saved = tlm.run._run_state(SHAKESPEARE_MODEL)["config"]  # newer options: defaults
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


def test_split_run_equals_uninterrupted_run_bit_for_bit(data_dir, tmp_path):
    common = [*TINY, "--data-dir", data_dir, "--steps", 20, "--checkpoint-every", 5,
              "--eval-every", 5]
    assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "a"]))) == 0
    assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "b",
                                    "--stop-at", 10]))) == 0
    assert torch.load(tmp_path / "b/checkpoint.pt", weights_only=True)["iteration"] == 10
    # --resume takes the model and optimizer settings from the checkpoint
    assert tlm_train(list(map(str, ["--out-dir", tmp_path / "b", "--data-dir", data_dir,
                                    "--resume", "--quiet"]))) == 0
    a, b = weights(tmp_path / "a/checkpoint.pt"), weights(tmp_path / "b/checkpoint.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [r["step"] for r in map(json.loads, open(tmp_path / "b/log.jsonl"))
             if "loss" in r]
    assert steps == list(range(1, 21))  # one record per step, none twice
    assert (tmp_path / "b/loss.png").stat().st_size > 1000


def test_the_default_run_is_the_plain_loop_bit_for_bit(data_dir, tmp_path):
    """train_model's default path (one process, float32, the default decay and
    attention) computes what the plain loop computes: every logged loss, every held-out
    loss and the final weights, bit for bit."""
    from tlm.run import MODEL_OPTIONS, OPTIMIZER_OPTIONS, RUN_OPTIONS
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


# --- another text: split_text and prepare_text -----------------------------------------

EOT = "<|endoftext|>"


def _nearest(points: list[int], target: int) -> int:
    """The point nearest to target; of two as near, the earlier one."""
    return min(points, key=lambda p: (abs(p - target), p))


@pytest.mark.parametrize("seed", range(40))
def test_split_text_holds_out_whole_documents_from_the_separator_nearest_the_cut(
        tmp_path, seed):
    """Documents joined by <|endoftext|>: train.txt is the first k of them, valid.txt the
    rest, k chosen so that the separator starts nearest to (1 - f) of the bytes; the
    oracle builds both from the list of documents, not from the file."""
    rng = np.random.default_rng(seed)
    words = ["the", "king", "é", "ÆTHELRED", "—", "night", "\n", "öl", "ship"]
    docs = [" ".join(rng.choice(words, size=rng.integers(1, 60))) + "."
            for _ in range(rng.integers(2, 12))]
    fraction = float(rng.uniform(0.05, 0.6))
    (tmp_path / "in.txt").write_text(EOT.join(docs), encoding="utf-8")
    paths = split_text(tmp_path / "in.txt", tmp_path / "out", fraction)
    size = len(EOT.join(docs).encode())
    starts = [len(EOT.join(docs[:k]).encode()) for k in range(1, len(docs))]
    k = 1 + starts.index(_nearest(starts, round(size * (1 - fraction))))
    assert paths["train"].read_text(encoding="utf-8") == EOT.join(docs[:k])
    assert paths["valid"].read_text(encoding="utf-8") == EOT.join(docs[k:])


@pytest.mark.parametrize("seed", range(40))
def test_split_text_without_a_separator_cuts_at_the_nearest_line_break(tmp_path, seed):
    rng = np.random.default_rng(seed)
    lines = ["".join(rng.choice(list("abc déf\t"), size=rng.integers(1, 30))) + "x"
             for _ in range(rng.integers(2, 30))]
    text = "\n".join(lines) + "\n" * int(rng.integers(0, 2))
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    fraction = float(rng.uniform(0.05, 0.6))
    paths = split_text(tmp_path / "in.txt", tmp_path / "out", fraction)
    ends = [len("\n".join(lines[:k]).encode()) + 1 for k in range(1, len(lines))]
    cut = _nearest(ends, round(len(text.encode()) * (1 - fraction)))
    train = paths["train"].read_bytes()
    assert len(train) == cut and train.endswith(b"\n")
    assert train + paths["valid"].read_bytes() == text.encode()


def test_a_cut_that_leaves_no_text_on_one_side_is_passed_over(tmp_path):
    """One document and a final <|endoftext|>: the separator, and the line break nearest
    to the point (which leaves only the separator after it), leave no text on one side;
    the line break before it does."""
    (tmp_path / "in.txt").write_text("a\nb\nc\nd\ne\nf\n" + EOT, encoding="utf-8")
    paths = split_text(tmp_path / "in.txt", tmp_path / "out", 0.6)  # the point: byte 10
    assert paths["train"].read_text() == "a\nb\nc\nd\ne\n"
    assert paths["valid"].read_text() == "f\n" + EOT


def test_split_text_finds_a_bad_byte_past_its_first_16_mib(tmp_path):
    """The check decodes 16 MiB at a time: a character cut by a step's end is whole, and
    the offset of a bad byte is the oracle's (bytes.decode) across the boundary."""
    step = 1 << 24
    good = b"a\n" * (step // 2 - 1) + b"x" + "é".encode() + b"\n" + b"tail\n"
    assert good[step - 1:step + 1] == "é".encode()  # the character straddles the steps
    (tmp_path / "good.txt").write_bytes(good)
    paths = split_text(tmp_path / "good.txt", tmp_path / "out")
    assert paths["train"].read_bytes() + paths["valid"].read_bytes() == good
    bad = good[:step + 3] + b"\xff" + good[step + 3:]
    (tmp_path / "bad.txt").write_bytes(bad)
    with pytest.raises(UnicodeDecodeError) as oracle:
        bad.decode("utf-8")
    with pytest.raises(ValueError, match=f"byte 0xff at offset {oracle.value.start:,}$"):
        split_text(tmp_path / "bad.txt", tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("content, fraction, message", [
    (None, 0.1, "is not a file"),
    (b"", 0.1, "is empty"),
    ("Viola: adieu, café".encode("latin-1"), 0.1,
     "is not UTF-8 text: byte 0xe9 at offset 17"),
    (b"oneline,nobreak", 0.1, "has no <|endoftext|>, line break or space with text on "
     "both sides to cut it at (15 bytes)"),
    (b"   \n\n  \n", 0.1, "has no <|endoftext|>, line break or space with text on both "
     "sides to cut it at (8 bytes)"),
    (f"{EOT}\n \n{EOT}\n".encode(), 0.5, "has no <|endoftext|>, line break or space"),
    (b"a\nb\n", 0.0, "--valid-fraction must be a number between 0 and 1, got 0.0"),
    (b"a\nb\n", 1, "got 1"),
    (b"a\nb\n", float("nan"), "got nan"),
    (b"a\nb\n", True, "got True"),
    (b"a\nb\n", "0.1", "got '0.1'"),
])
def test_split_text_refuses_bad_input_in_one_line(tmp_path, content, fraction, message):
    source = tmp_path / "in.txt"
    if content is not None:
        source.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        split_text(source, tmp_path / "out", fraction)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_split_text_refuses_to_replace_its_input(tmp_path):
    (tmp_path / "train.txt").write_text("a\nb\nc\n")
    with pytest.raises(ValueError, match="is the train.txt that the command writes"):
        split_text(tmp_path / "train.txt", tmp_path)
    assert (tmp_path / "train.txt").read_text() == "a\nb\nc\n"


def test_prepare_text_writes_what_tlm_train_reads(tmp_path):
    """Both splits encoded with a BPE trained on the training split alone: decoding
    train.npy and valid.npy gives train.txt and valid.txt back, and a run trains on
    them."""
    rng = np.random.default_rng(0)
    stories = [" ".join(rng.choice(["Tom", "saw", "a", "big", "dog", "and", "ran"],
                                   size=60)) + ".\n" for _ in range(30)]
    (tmp_path / "stories.txt").write_text(("\n" + EOT + "\n").join(stories))
    counts = prepare_text(tmp_path / "stories.txt", tmp_path / "d", vocab_size=300)
    d = tmp_path / "d"
    tokenizer = tlm.Tokenizer.from_files(d / "vocab.json", d / "merges.txt", [EOT])
    for split in ("train", "valid"):
        ids = np.load(d / f"{split}.npy")
        assert len(ids) == counts[split] > 0
        assert tokenizer.decode(ids.tolist()) == (d / f"{split}.txt").read_text()
    held_out = (d / "valid.txt").read_text()
    assert held_out.startswith("\n") and held_out.count(EOT) == 2  # the last 3 stories
    assert tlm_train(list(map(str, [*TINY, "--data-dir", d, "--out-dir", tmp_path / "r",
                                        "--steps", 2]))) == 0
