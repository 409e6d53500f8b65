"""tlm.run: `tlm train`'s options and their checks, the token files, the run directory and
its lock, the log and the checkpoint, resuming bit for bit (see tests/tiny_runs.py)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tlm
from tlm.run import train_model
from tlm.tokenizer import write_merges, write_vocab
from tiny_runs import ROOT, TINY, byte_vocab, tlm_train, weights


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
    assert tlm_train(list(map(str, [*args, "--out-dir", tmp_path / "k", "--resume",
                                    "--stop-at", 70]))) == 0
    assert tlm_train(list(map(str, [*args, "--out-dir", tmp_path / "u", "--stop-at", 70]))) == 0
    a, b = weights(tmp_path / "k/checkpoint.pt"), weights(tmp_path / "u/checkpoint.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ids_beyond_the_vocabulary_are_refused(data_dir, tmp_path, capsys):
    np.save(data_dir / "valid.npy", np.array([1, 2, 300, 4] * 10, dtype=np.uint16))
    code = tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path])))
    err = capsys.readouterr().err
    assert code == 2 and "valid.npy holds token ids up to 300" in err
    assert "vocab_size is 257" in err


def test_a_context_longer_than_the_data_is_refused(data_dir, tmp_path, capsys):
    code = tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path,
                                    "--context-length", 2000])))
    assert code == 2
    assert "valid.npy has 1,600 tokens, too few for context_length=2000" in \
        capsys.readouterr().err


def test_resume_refuses_another_architecture_and_a_missing_checkpoint(data_dir, tmp_path,
                                                                      capsys):
    common = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path, "--steps", 4]
    assert tlm_train(list(map(str, [*common, "--resume"]))) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    assert tlm_train(list(map(str, common))) == 0
    before = (tmp_path / "checkpoint.pt").read_bytes()
    assert tlm_train(list(map(str, [*common, "--resume", "--d-model", 64]))) == 2
    assert "d_model=32 there, 64 here" in capsys.readouterr().err
    assert (tmp_path / "checkpoint.pt").read_bytes() == before


def test_a_diverging_run_stops_and_keeps_its_last_good_checkpoint(data_dir, tmp_path,
                                                                  capsys):
    code = tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path,
                                    "--steps", 50, "--lr", 1e30, "--grad-clip", 0,
                                    "--warmup-steps", 0, "--checkpoint-every", 1])))
    assert code == 1
    err = capsys.readouterr().err
    assert "training stopped" in err or "not finite" in err
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert all(torch.isfinite(w).all() for w in state["model"].values())
    assert 1 <= state["iteration"] < 50


def test_train_model_checks_the_data_files_exist(tmp_path):
    config = {**tlm.run.MODEL_OPTIONS, **tlm.run.OPTIMIZER_OPTIONS,
              **tlm.run.RUN_OPTIONS, "data_dir": tmp_path, "out_dir": tmp_path / "o"}
    with pytest.raises(FileNotFoundError):
        train_model(config, progress=False)


def test_resume_refuses_a_checkpoint_without_settings(data_dir, tmp_path, capsys):
    model = tlm.TransformerLM(257, 16, 32, 2, 2, 64, 10000.0)
    tlm.save_checkpoint(model, tlm.AdamW(model.parameters()), 3, tmp_path / "checkpoint.pt")
    code = tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path,
                                    "--resume"])))
    assert code == 2
    assert "is not a checkpoint of tlm train" in capsys.readouterr().err


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
    code = tlm_train(list(map(str, [*TINY, "--data-dir", tmp_path / "none", "--out-dir", out,
                                    *args])))
    assert code == 2 and capsys.readouterr().err == f"error: {message}\n"
    assert not out.exists()


def test_missing_files_are_named(data_dir, tmp_path, capsys):
    assert tlm_train(list(map(str, [*TINY, "--out-dir", tmp_path / "r", "--resume"]))) == 2
    assert capsys.readouterr().err == f"error: --resume: there is no checkpoint at {tmp_path / 'r' / 'checkpoint.pt'}\n"
    (data_dir / "valid.npy").unlink()
    assert tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path / "r"]))) == 2
    assert capsys.readouterr().err == (f"error: --data-dir {data_dir} has no valid.npy "
                                       f"(`tlm data shakespeare {data_dir}` writes one)\n")


def test_resume_drops_an_incomplete_last_log_line(data_dir, tmp_path, capsys):
    common = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path / "r", "--steps", 10,
              "--checkpoint-every", 5, "--eval-every", 5]
    assert tlm_train(list(map(str, [*common, "--stop-at", 5]))) == 0
    log = tmp_path / "r" / "log.jsonl"
    log.write_text(log.read_text() + '{"step": 6, "loss": 4.')  # a disk that filled up
    capsys.readouterr()
    assert tlm_train(list(map(str, [*common, "--resume"]))) == 0
    assert f"{log}: dropped an incomplete last line" in capsys.readouterr().err
    steps = [r["step"] for r in map(json.loads, log.read_text().splitlines()) if "loss" in r]
    assert steps == list(range(1, 11))
    log.write_text('{"step": 1\n' + log.read_text())  # damage before the end is refused
    assert tlm_train(list(map(str, [*common, "--resume"]))) == 2
    assert f"{log} line 1 is not a JSON record" in capsys.readouterr().err


def test_resume_refuses_another_tokenizer_and_a_fresh_run_never_overwrites(data_dir, tmp_path,
                                                                           capsys):
    common = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path / "r", "--steps", 4]
    assert tlm_train(list(map(str, common))) == 0
    before = (tmp_path / "r" / "checkpoint.pt").read_bytes()
    assert tlm_train(list(map(str, common))) == 2
    assert "already holds a run: --resume continues it" in capsys.readouterr().err
    write_vocab(byte_vocab() | {257: b"xy"}, data_dir / "vocab.json")
    write_merges([(b"x", b"y")], data_dir / "merges.txt")  # a whole other tokenizer
    assert tlm_train(list(map(str, [*common, "--resume"]))) == 2
    assert "has another tokenizer than the run: its vocab.json differs" in capsys.readouterr().err
    assert (tmp_path / "r" / "checkpoint.pt").read_bytes() == before


def test_a_run_saved_before_decay_and_tying_existed_resumes_as_it_ran(data_dir, tmp_path):
    common = [*TINY, "--data-dir", data_dir, "--steps", 20, "--checkpoint-every", 5,
              "--eval-every", 5, "--decay", "all"]
    assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "a"]))) == 0
    assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "b",
                                    "--stop-at", 10]))) == 0
    ckpt = tmp_path / "b/checkpoint.pt"
    state = torch.load(ckpt, weights_only=True)
    for name in ("decay", "tie_embeddings"):  # as a checkpoint of an older tlm
        del state["config"][name]
    torch.save(state, ckpt)
    assert tlm_train(list(map(str, ["--out-dir", tmp_path / "b", "--data-dir", data_dir,
                                    "--resume", "--quiet"]))) == 0
    resumed = torch.load(ckpt, weights_only=True)
    assert resumed["config"]["decay"] == "all"  # what it did, not today's default
    assert resumed["config"]["tie_embeddings"] is False
    a, b = weights(tmp_path / "a/checkpoint.pt"), resumed["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the default now spares the RMSNorm gains
    assert tlm.run.OPTIMIZER_OPTIONS["decay"] == "matrices"


def test_a_run_owns_its_directory_while_it_goes_on(data_dir, tmp_path, capsys):
    """Two runs into one --out-dir at once, or a --resume while the run goes on: the
    second is refused before it writes anything. The lock ends with its process."""
    import fcntl
    out, common = tmp_path / "run", [*TINY, "--data-dir", data_dir, "--steps", 4]
    assert tlm_train(list(map(str, [*common, "--out-dir", out]))) == 0
    log = (out / "log.jsonl").read_text()
    with open(out / ".lock") as held:  # as another run holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        for more in ([], ["--resume"]):
            assert tlm_train(list(map(str, [*common, "--out-dir", out, *more]))) == 2
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
        assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "live"]))) == 2
        assert "is in use by another run" in capsys.readouterr().err
    finally:
        proc.kill()
        proc.wait()
    assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "live"]))) == 0


def test_a_refused_run_leaves_no_directory_and_a_run_removes_stale_temporary_files(
        data_dir, tmp_path):
    out = tmp_path / "new"
    (data_dir / "valid.npy").rename(data_dir / "held.npy")
    assert tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", out]))) == 2
    assert not out.exists()
    (data_dir / "held.npy").rename(data_dir / "valid.npy")
    out.mkdir()
    stale = [out / ".checkpoint.pt.k2j4x9.tmp", out / ".log.jsonl.a1b2c3.tmp"]
    for path in stale:  # what a run killed while writing leaves
        path.write_bytes(b"partial")
    (out / "notes.txt").write_text("mine")
    assert tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", out,
                                    "--steps", 2]))) == 0
    assert not any(path.exists() for path in stale)
    assert (out / "notes.txt").read_text() == "mine"


def test_a_run_stopped_during_its_last_evaluation_evaluates_on_resume(
        data_dir, tmp_path, monkeypatch, capsys):
    """The last checkpoint is written before the last evaluation: a run interrupted
    there resumes into that evaluation and reports it, not step 0's."""
    import tlm.run
    common = [*TINY, "--data-dir", data_dir, "--steps", 6, "--eval-every", 100]
    assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "whole"]))) == 0
    whole = capsys.readouterr().out
    assert whole.startswith("step 6: held-out loss ")
    evaluate = tlm.run.evaluate

    def interrupted_at_the_end(model, data, lengths, batch_size=16, max_windows=None):
        if max_windows is None:  # the last evaluation scores every window
            raise KeyboardInterrupt
        return evaluate(model, data, lengths, batch_size, max_windows)

    monkeypatch.setattr(tlm.run, "evaluate", interrupted_at_the_end)
    out = tmp_path / "cut"
    assert tlm_train(list(map(str, [*common, "--out-dir", out]))) == 130
    assert torch.load(out / "checkpoint.pt", weights_only=True)["iteration"] == 6
    monkeypatch.setattr(tlm.run, "evaluate", evaluate)
    capsys.readouterr()
    assert tlm_train(["--out-dir", str(out), "--resume", "--quiet"]) == 0
    assert capsys.readouterr().out == whole
    records = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss" in r] == [0, 6]
    assert tlm_train(["--out-dir", str(out), "--resume", "--quiet"]) == 0  # once only
    assert capsys.readouterr().out == whole
    assert (out / "log.jsonl").read_text().count("val_loss") == 2


def test_resume_refuses_a_stop_below_the_checkpoint(data_dir, tmp_path, capsys):
    common = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path, "--steps", 8]
    assert tlm_train(list(map(str, [*common, "--stop-at", 4]))) == 0
    capsys.readouterr()
    assert tlm_train(list(map(str, [*common, "--resume", "--stop-at", 3]))) == 2
    assert capsys.readouterr().err == ("error: --stop-at 3: the run is already at "
                                       "step 4\n")


def test_a_vocabulary_other_than_the_tokenizers_is_refused(data_dir, tmp_path, capsys):
    """A larger one would let the sampler draw ids that the tokenizer cannot decode."""
    for size in (512, 200):
        out = tmp_path / str(size)
        assert tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", out,
                                        "--vocab-size", size]))) == 2
        assert capsys.readouterr().err == (
            f"error: --vocab-size must be the tokenizer's, 257 (in "
            f"{data_dir / 'vocab.json'}), or left out; got {size}\n")
        assert not out.exists()


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
    assert tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir",
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
    (["--eps", 1e-46], "--eps must be a number float32 does not round to 0 (above 2**-150, "
     "about 7.006e-46), got 1e-46"),
    (["--eps", 7e-46], "--eps must be a number float32 does not round to 0 (above 2**-150, "
     "about 7.006e-46), got 7e-46"),
    (["--eps", 2.0**-150], "--eps must be a number float32 does not round to 0 (above "
     f"2**-150, about 7.006e-46), got {2.0**-150!r}"),
])
def test_numbers_past_what_training_can_hold_are_refused(tmp_path, capsys, args,
                                                         message):
    out = tmp_path / "run"
    code = tlm_train(list(map(str, [*TINY, "--data-dir", tmp_path / "none", "--out-dir", out,
                                    *args])))
    assert code == 2 and capsys.readouterr().err == f"error: {message}\n"
    assert not out.exists()


def test_a_file_system_without_locks_runs_unlocked_with_a_warning(data_dir, tmp_path,
                                                                  monkeypatch, capsys):
    """flock fails with ENOLCK or ENOSYS on some network file systems (Lustre without
    -o flock): the run goes on, and says that it is not protected."""
    import errno

    import tlm.run

    def no_locks(f, how):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(tlm.run.fcntl, "flock", no_locks)
    out = tmp_path / "run"
    assert tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", out,
                                    "--steps", 2]))) == 0
    assert capsys.readouterr().err == (
        f"warning: {out / '.lock'} cannot be locked ({os.strerror(errno.ENOLCK)}): two "
        f"runs in {out} at once would not be refused\n")
    assert (out / "checkpoint.pt").exists()


def test_train_model_takes_a_dict_and_a_bool(tmp_path):
    for config, resume in (([("steps", 3)], False), ({}, "no")):
        with pytest.raises(TypeError, match="^train_model takes a config dict and resume "
                                            "True or False, got "):
            train_model(config, resume=resume)


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
    assert tlm_train(list(map(str, [*args, "--out-dir", other]))) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --out-dir {other} holds another tokenizer than --data-dir "
                   f"{data_dir} (its vocab.json differs), which a run would replace: "
                   "choose another --out-dir\n")
    assert _tree(other) == before and not (other / ".lock").exists()
    # a merges.txt that the data lacks would be left beside the data's vocabulary
    (tmp_path / "project").mkdir()
    write_vocab(byte_vocab(), tmp_path / "project" / "vocab.json")
    write_merges([(b"a", b"b")], tmp_path / "project" / "merges.txt")
    assert tlm_train(list(map(str, [*args, "--out-dir", tmp_path / "project"]))) == 2
    assert "(its merges.txt differs)" in capsys.readouterr().err
    # the same tokenizer, and files of the user's own beside it: the run goes on
    (tmp_path / "project" / "merges.txt").unlink()
    (tmp_path / "project" / "notes.txt").write_text("mine")
    assert tlm_train(list(map(str, [*args, "--out-dir", tmp_path / "project"]))) == 0
    assert (tmp_path / "project" / "notes.txt").read_text() == "mine"


def test_a_new_run_refuses_to_replace_a_log_a_figure_or_a_folder(data_dir, tmp_path,
                                                                  capsys):
    """A log.jsonl or loss.png with no checkpoint beside it (the user's, or a run's that
    stopped before its first checkpoint) was replaced without a word; a folder where the
    run writes a file, or an --out-dir that is a file, was an errno line (and a lock
    file left behind)."""
    args = [*TINY, "--data-dir", data_dir, "--steps", 3]
    cases = [("log.jsonl", "my notes"), ("loss.png", "my figure"), ("vocab.json", None)]
    for name, text in cases:
        out = tmp_path / name.split(".")[0]
        out.mkdir()
        (out / name).write_text(text) if text else (out / name).mkdir()
        before = _tree(out)
        assert tlm_train(list(map(str, [*args, "--out-dir", out]))) == 2
        assert capsys.readouterr().err == (f"error: --out-dir {out} holds {name}, which "
                                           "a new run would replace: remove it, or "
                                           "choose another --out-dir\n")
        assert _tree(out) == before and not (out / ".lock").exists()
    (tmp_path / "afile").write_text("x")
    assert tlm_train(list(map(str, [*args, "--out-dir", tmp_path / "afile"]))) == 2
    assert capsys.readouterr().err == (f"error: --out-dir {tmp_path / 'afile'} exists and "
                                       "is not a directory\n")


def test_resume_from_another_working_directory_finds_the_data(data_dir, tmp_path,
                                                             monkeypatch, capsys):
    """The run records its data directory whole: --resume from elsewhere finds it. A
    run of an older tlm recorded it as typed; then the message says where the path came
    from instead of blaming a --data-dir never given."""
    monkeypatch.chdir(tmp_path)
    common = [*TINY, "--steps", 6, "--checkpoint-every", 3]
    assert tlm_train(list(map(str, [*common, "--data-dir", "data", "--out-dir", "run",
                                    "--stop-at", 3]))) == 0
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert saved["config"]["data_dir"] == str(data_dir)  # absolute
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert tlm_train(["--out-dir", str(tmp_path / "run"), "--resume", "--quiet"]) == 0
    capsys.readouterr()
    # a checkpoint of an older tlm, with the path as it was typed
    saved["config"]["data_dir"] = "data"
    torch.save(saved, tmp_path / "run" / "checkpoint.pt")
    assert tlm_train(["--out-dir", str(tmp_path / "run"), "--resume", "--quiet"]) == 2
    ckpt = tmp_path / "run" / "checkpoint.pt"
    assert capsys.readouterr().err == (
        f"error: --resume: the run's data directory data (recorded in {ckpt}, relative "
        "to where the run started) is not there: pass --data-dir\n")
    assert tlm_train(["--out-dir", str(tmp_path / "run"), "--resume", "--quiet",
                      "--data-dir", str(data_dir)]) == 0


def test_resume_continues_the_run_it_read_in_a_copied_or_moved_project(data_dir, tmp_path,
                                                                       monkeypatch):
    """--resume without --out-dir reads runs/shakespeare/checkpoint.pt: that run goes on,
    in that directory, whatever out_dir its checkpoint recorded (here the absolute path
    of a project since copied, then moved); the original project is not touched."""
    import shutil
    project = tmp_path / "proj"
    project.mkdir()
    monkeypatch.chdir(project)
    common = [*TINY, "--steps", 12, "--checkpoint-every", 6, "--eval-every", 6]
    assert tlm_train(list(map(str, [*common, "--data-dir", data_dir, "--out-dir",
                                    project / "runs" / "shakespeare", "--stop-at",
                                    6]))) == 0
    original = (project / "runs" / "shakespeare" / "checkpoint.pt").read_bytes()
    shutil.copytree(project, tmp_path / "copy")
    monkeypatch.chdir(tmp_path / "copy")
    assert tlm_train(["--resume", "--quiet"]) == 0
    copied = torch.load(tmp_path / "copy" / "runs" / "shakespeare" / "checkpoint.pt",
                        weights_only=True)
    assert copied["iteration"] == 12
    assert (project / "runs" / "shakespeare" / "checkpoint.pt").read_bytes() == original
    monkeypatch.chdir(tmp_path)
    project.rename(tmp_path / "moved")
    monkeypatch.chdir(tmp_path / "moved")
    assert tlm_train(["--resume", "--quiet"]) == 0
    moved = torch.load(tmp_path / "moved" / "runs" / "shakespeare" / "checkpoint.pt",
                       weights_only=True)
    assert moved["iteration"] == 12
    assert all(torch.equal(moved["model"][k], copied["model"][k]) for k in moved["model"])


def test_a_data_directory_without_merges_is_refused_before_training(data_dir, tmp_path,
                                                                    capsys):
    """Its run could not be sampled: `tlm generate` reads the run's copy of merges.txt."""
    (data_dir / "merges.txt").unlink()
    assert tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir",
                                    tmp_path / "r", "--steps", 3]))) == 2
    assert capsys.readouterr().err == (f"error: --data-dir {data_dir} has no merges.txt "
                                       f"(`tlm data shakespeare {data_dir}` writes one)\n")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("merges, message", [
    ("", "merges.txt has 0 merges for vocab.json's 1 merged tokens: not one tokenizer's"),
    ("#version: 0.2\ngarbage line here\n", "merges.txt, line 2: expected two tokens"),
    ("#version: 0.2\nx y\n", "merge 0 (b'x', b'y'): b'xy' is not in"),
])
def test_merges_that_do_not_go_with_the_vocabulary_are_refused(data_dir, tmp_path,
                                                              capsys, merges, message):
    """An empty merges.txt beside a vocabulary with merged tokens would train and sample
    without merges; a broken or foreign one would fail only in `tlm generate`."""
    write_vocab(byte_vocab() | {257: b"th"}, data_dir / "vocab.json")
    (data_dir / "merges.txt").write_text(merges)
    assert tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir",
                                    tmp_path / "r", "--steps", 3]))) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


def test_special_tokens_of_the_users_need_no_merges(data_dir, tmp_path):
    """`tlm tokenizer train --special-token "<|pad|>"` makes a vocabulary with a second
    special token, which no merge makes: such a data directory trains."""
    write_vocab(byte_vocab() | {257: b"<|pad|>", 258: b"th"}, data_dir / "vocab.json")
    write_merges([(b"t", b"h")], data_dir / "merges.txt")
    assert tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir",
                                    tmp_path / "r", "--steps", 3]))) == 0
