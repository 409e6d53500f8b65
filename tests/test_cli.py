"""tlm.cli: `tlm data`, `tlm generate`, `tlm doctor`, `tlm train --help` and usage errors, each
in one line with exit status 2 (see tests/tiny_runs.py)."""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tlm
from tlm.cli import main
from tlm.tokenizer import write_merges, write_vocab
from tlm.train import HELD_OUT
from tiny_runs import (ROOT, TINY, byte_vocab, doctor_rows, run_cli, run_generate,
                       tlm_train)


def test_help_lists_every_option():
    out = run_cli("--help").stdout
    from tlm.run import MODEL_OPTIONS, OPTIMIZER_OPTIONS, RUN_OPTIONS
    for name in {**MODEL_OPTIONS, **OPTIMIZER_OPTIONS, **RUN_OPTIONS}:
        assert "--" + name.replace("_", "-") in out


def test_generate_samples_reproducibly_and_the_cache_changes_nothing(run_dir):
    ckpt = run_dir / "checkpoint.pt"
    a = run_generate(ckpt, "--prompt", "the ", "--seed", 5, "--max-new-tokens", 12)
    b = run_generate(ckpt, "--prompt", "the ", "--seed", 5, "--max-new-tokens", 12)
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout.startswith("the ")
    # 40 new tokens with a context of 16: the window slides, with and without the cache
    greedy = [ckpt, "--temperature", 0, "--max-new-tokens", 40, "--prompt", "the cat"]
    cached, uncached = run_generate(*greedy), run_generate(*greedy, "--no-cache")
    assert cached.returncode == 0 and cached.stdout == uncached.stdout
    model, tokenizer = tlm.load_run(ckpt)
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
    (["--temperature", -1], "--temperature must be a finite number >= 0, got -1.0"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0, got nan"),
    (["--temperature", "inf"], "--temperature must be a finite number >= 0, got inf"),
    # a negative number in any float spelling is a value, not an option
    (["--temperature", "-1e-46"], "--temperature must be a finite number >= 0, got -1e-46"),
    (["--temperature", "-inf"], "--temperature must be a finite number >= 0, got -inf"),
    (["--top-p", "-1E+3"], "--top-p must be in (0, 1], got -1000.0"),
    (["--prompt", "the \udcff"], "--prompt is not UTF-8 text: byte 0xff at character 4"),
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


def test_a_run_without_endoftext_samples_from_a_prompt(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    write_vocab({i: bytes([i]) for i in range(256)}, d / "vocab.json")  # no special token
    write_merges([], d / "merges.txt")
    ids = np.frombuffer(b"to be or not to be. " * 300, dtype=np.uint8).astype(np.uint16)
    np.save(d / "train.npy", ids[:5000])
    np.save(d / "valid.npy", ids[5000:])
    assert tlm_train(list(map(str, [*TINY, "--data-dir", d, "--out-dir", tmp_path / "run",
                                    "--steps", 5]))) == 0
    ckpt = tmp_path / "run" / "checkpoint.pt"
    sample = run_generate(ckpt, "--prompt", "to be", "--max-new-tokens", 10, "--temperature", 0)
    assert sample.returncode == 0 and sample.stdout.startswith("to be")
    model, tokenizer = tlm.load_run(ckpt)
    assert tokenizer.special_tokens == [] and len(tokenizer.vocab) == 256
    bare = run_generate(ckpt)
    assert bare.returncode == 2 and "--prompt is needed" in bare.stderr
    # a checkpoint next to another run's larger vocabulary is refused
    write_vocab(byte_vocab() | {257: b"xy"}, tmp_path / "run" / "vocab.json")
    write_merges([(b"x", b"y")], tmp_path / "run" / "merges.txt")
    other = run_generate(ckpt, "--prompt", "to")
    assert other.returncode == 2 and "the tokenizer of another run?" in other.stderr


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


@pytest.mark.parametrize("error", [
    MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. "
                                "DefaultCPUAllocator: can't allocate memory: you tried to "
                                "allocate 4503599627370496 bytes.")],
    ids=["Python's", "torch's CPU allocator's"])
def test_running_out_of_memory_is_one_line(run_dir, monkeypatch, capsys, error):
    """--num-samples 10**11, or a --batch-size no machine holds: one line, status 1, not
    a traceback (torch's allocator raises a RuntimeError, Python a MemoryError); any
    other RuntimeError still propagates."""
    import tlm.cli

    def greedy(*args, **kwargs):
        raise error
    monkeypatch.setattr(tlm.cli, "generate", greedy)
    assert main(["generate", str(run_dir), "--device", "cpu", "--num-samples", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: out of memory (") and err.endswith("): ask for less\n")
    assert len(err.splitlines()) == 1

    def buggy(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(tlm.cli, "generate", buggy)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["generate", str(run_dir), "--device", "cpu"])


def test_generate_refuses_a_directory_that_is_no_run(data_dir, capsys):
    assert main(["generate", str(data_dir), "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (f"error: CHECKPOINT {data_dir} is a directory "
                                       "without a checkpoint.pt (a run's directory holds "
                                       "one)\n")


def test_doctor_reports_a_package_without_metadata(monkeypatch, capsys):
    """Importable from a folder on PYTHONPATH, say, with no distribution metadata."""
    real = importlib.metadata.distribution

    def distribution(name):
        if name == "numpy":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    assert doctor_rows(capsys)["numpy"].split(None, 1)[1].startswith("no metadata")


@pytest.mark.parametrize("version, tested", [
    ("2.11.0", True), ("2.13.0+cu130", True), ("2.12.1+cpu", True),
    ("2.10.2", False), ("2.14.0.dev20270101+cu130", False), ("3.0.0", False),
    ("unknown", False)])
def test_doctor_says_whether_torch_is_in_the_tested_range(monkeypatch, capsys, version,
                                                          tested):
    monkeypatch.setattr(torch, "__version__", version)
    row = doctor_rows(capsys)["torch"]
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
        assert doctor_rows(capsys)["tiktoken"].split()[1] == shown


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


def test_data_removes_what_a_killed_run_left_inside_dir(tmp_path, monkeypatch, capsys):
    """A folder of tlm data's name that holds only its files: what a killed run left."""
    import tlm.cli
    out = tmp_path / "data"
    (out / ".tmp-tlm-data-k1ll3d").mkdir(parents=True)
    (out / ".tmp-tlm-data-k1ll3d" / "train.txt").write_text("half")
    (out / ".tmp-tlm-data-k1ll3d" / ".vocab.json.x1y2.tmp").write_text("half")
    monkeypatch.setattr(tlm.cli, "prepare_shakespeare", fake_prepare)
    assert main(["data", "shakespeare", str(out), "--quiet"]) == 0  # not "not empty"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def _files(path: Path) -> dict:
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_data_never_removes_what_it_did_not_make(tmp_path, monkeypatch, capsys):
    """A user's folder named .tmp-..., one of tlm data's name holding a user's file, and
    FILE inside such a folder: content of DIR, which --force leaves in place."""
    import tlm.cli
    monkeypatch.setattr(tlm.cli, "prepare_shakespeare", fake_prepare)
    out = tmp_path / "data"
    (out / ".tmp-notes").mkdir(parents=True)
    (out / ".tmp-notes" / "notes.txt").write_text("precious")
    (out / ".tmp-tlm-data-mine").mkdir()
    (out / ".tmp-tlm-data-mine" / "train.txt").write_text("kept")
    (out / ".tmp-tlm-data-mine" / "notes.txt").write_text("mine")
    (out / ".tmp-file").write_text("a file")
    before = _files(out)
    assert main(["data", "shakespeare", str(out), "--quiet"]) == 2
    assert "is not empty: choose another, or pass --force" in capsys.readouterr().err
    assert _files(out) == before
    assert main(["data", "shakespeare", str(out), "--quiet", "--force"]) == 0
    assert {k: v for k, v in _files(out).items() if k in before} == before
    text = tmp_path / "text"
    (text / ".tmp-tlm-data-x").mkdir(parents=True)  # FILE in a folder of that name
    (text / ".tmp-tlm-data-x" / "train.txt").write_text("a b c\nd e f\n" * 50)
    source = text / ".tmp-tlm-data-x" / "train.txt"
    before = source.read_bytes()
    assert main(["data", "text", str(source), str(text), "--quiet", "--vocab-size", "257",
                 "--force"]) == 0
    assert source.read_bytes() == before


def test_without_a_lock_no_leftover_is_removed(tmp_path, monkeypatch, capsys):
    """Where DIR cannot be locked (Windows, a file system without flock), a folder of
    tlm data's name may be another run's, still being written: it is left alone."""
    import tlm.cli
    monkeypatch.setattr(tlm.cli, "prepare_shakespeare", fake_prepare)
    monkeypatch.setattr(tlm.cli, "fcntl", None)
    out = tmp_path / "data"
    (out / ".tmp-tlm-data-live").mkdir(parents=True)
    (out / ".tmp-tlm-data-live" / "train.txt").write_text("being written")
    assert main(["data", "shakespeare", str(out), "--quiet"]) == 0
    assert (out / ".tmp-tlm-data-live" / "train.txt").read_text() == "being written"


def test_a_second_data_run_into_one_dir_is_refused(tmp_path, monkeypatch, capsys):
    """While one `tlm data` writes DIR it holds DIR's lock (flock on the folder); a
    second is refused in one line and touches nothing; the lock ends with the first."""
    fcntl = pytest.importorskip("fcntl")
    import tlm.cli
    monkeypatch.setattr(tlm.cli, "prepare_shakespeare", fake_prepare)
    out = tmp_path / "data"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)  # the first run's lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["data", "shakespeare", str(out), "--quiet"]) == 2
        assert capsys.readouterr().err == (f"error: DIR {out} is in use by another "
                                           "`tlm data`: wait for it to end, or choose "
                                           "another\n")
        assert list(out.iterdir()) == []
    finally:
        os.close(fd)
    assert main(["data", "shakespeare", str(out), "--quiet"]) == 0


def test_force_refuses_a_folder_in_place_of_a_data_file_before_moving_any(tmp_path,
                                                                          capsys):
    """--force replaces the six files one rename at a time: a folder named like one of
    them would stop it halfway, new files beside old ones. Refused before any work."""
    (tmp_path / "in.txt").write_text("a b c\nd e f\n" * 50)
    out = tmp_path / "d"
    assert main(["data", "text", str(tmp_path / "in.txt"), str(out), "--quiet",
                 "--vocab-size", "257"]) == 0
    (out / "valid.txt").unlink()
    (out / "valid.txt").mkdir()
    before = _files(out)
    assert main(["data", "text", str(tmp_path / "in.txt"), str(out), "--quiet",
                 "--vocab-size", "260", "--force"]) == 2
    assert capsys.readouterr().err.endswith(
        f"error: DIR {out} holds valid.txt, which is not a file and which --force would "
        "replace: remove it\n")
    assert _files(out) == before and (out / "valid.txt").is_dir()


def test_data_into_a_path_below_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "in.txt").write_text("a\nb\n" * 20)
    assert main(["data", "text", str(tmp_path / "in.txt"), str(tmp_path / "afile" / "sub"),
                 "--quiet"]) == 2
    assert capsys.readouterr().err == (f"error: DIR {tmp_path / 'afile' / 'sub'} lies in "
                                       f"{tmp_path / 'afile'}, which is not a directory\n")


def test_data_text_cuts_a_file_of_one_line_at_a_space(tmp_path, capsys):
    """text8 and its kind are one line of words: cut at the space nearest the share."""
    words = " ".join(f"word{i % 97}" for i in range(5000))
    (tmp_path / "one.txt").write_text(words, encoding="utf-8")
    out = tmp_path / "d"
    assert main(["data", "text", str(tmp_path / "one.txt"), str(out), "--quiet",
                 "--vocab-size", "300"]) == 0
    train, valid = ((out / f"{s}.txt").read_text() for s in ("train", "valid"))
    assert train + valid == words and train.endswith(" ") and not valid.startswith(" ")
    assert 0.09 < len(valid) / len(words) < 0.11
    assert capsys.readouterr().err == ""  # the share asked for: no warning


def test_data_text_warns_where_the_held_out_share_is_far_from_the_one_asked(tmp_path,
                                                                         capsys):
    """One <|endoftext|>, at 47% of the bytes: the nearest separator holds out 53%."""
    doc = "the king and the queen\n"
    text = doc * 47 + "<|endoftext|>" + doc * 53
    (tmp_path / "in.txt").write_text(text)
    assert main(["data", "text", str(tmp_path / "in.txt"), str(tmp_path / "d"), "--quiet",
                 "--vocab-size", "270"]) == 0
    share = (tmp_path / "d" / "valid.txt").stat().st_size / len(text)
    assert capsys.readouterr().err == ("warning: --valid-fraction 0.1 asked for 10.0% of "
                                       "the text held out; the nearest place to cut it "
                                       f"holds out {share:.1%}\n")
    assert 0.5 < share < 0.54


def test_doctor_says_whether_compile_can_build_here(capsys):
    rows = doctor_rows(capsys)
    assert re.fullmatch(r"compile\s+ok\s+C\+\+ compiler \S+ builds, for --compile", rows["compile"])
    # (Inductor's own override, undone on exit; monkeypatch's undo deleted the setting)
    with torch._inductor.config.patch({"cpp.cxx": (None, "/nonexistent/g++")}):
        rows = doctor_rows(capsys)
    assert re.fullmatch(r"compile\s+no\s+--compile on the CPU needs a working C\+\+ compiler "
                        r"\(g\+\+ or clang\): InvalidCxxCompiler: No working C\+\+ compiler .*",
                        rows["compile"]), rows["compile"]


@pytest.mark.parametrize("fails_on, message", [
    ("", "fatal error: no headers"),  # every build: a broken toolchain
    ("*omp*", "fatal error: omp.h: No such file"),  # OpenMP's flag: Apple's clang
])
def test_doctor_builds_with_the_compiler_it_finds(capsys, tmp_path, fails_on, message):
    """A compiler that answers --version but cannot build what Inductor builds (a broken
    toolchain, one without OpenMP) is found by Inductor's lookup; the doctor's one-line
    build, with Inductor's flags, finds it out."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to answer --version")
    fake = tmp_path / "g++"
    fake.write_text("#!/bin/bash\n"
                    f"[ \"$1\" = --version ] && exec {shutil.which('g++')} --version\n"
                    f"for a in \"$@\"; do case \"$a\" in {fails_on or '*'}) "
                    f"echo '{message}' >&2; exit 1;; esac; done\n"
                    f"exec {shutil.which('g++')} \"$@\"\n")
    fake.chmod(0o755)
    with torch._inductor.config.patch({"cpp.cxx": (None, str(fake))}):
        row = doctor_rows(capsys)["compile"]
    assert re.fullmatch(r"compile\s+no\s+--compile on the CPU needs a working C\+\+ "
                        r"compiler \(g\+\+ or clang\): RuntimeError: the build failed: "
                        + re.escape(message), row), row


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


def test_data_text_writes_the_files_of_a_data_directory(tmp_path, capsys):
    """Any UTF-8 file, its end held out: the six files, the share of the text held out
    as the files hold it, and the same --force rule as the plays."""
    lines = [f"line {i}: {'é' * (i % 7)} the king and the queen" for i in range(400)]
    (tmp_path / "book.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "data"
    assert main(["data", "text", str(tmp_path / "book.txt"), str(out), "--vocab-size",
                 "300", "--valid-fraction", "0.25", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["merges.txt", "train.npy",
                                                     "train.txt", "valid.npy",
                                                     "valid.txt", "vocab.json"]
    total = (tmp_path / "book.txt").stat().st_size
    share = (out / "valid.txt").stat().st_size / total
    assert 0.24 < share < 0.26
    printed = capsys.readouterr().out
    assert f"held-out tokens (the last {share:.1%} of the text), vocabulary 300 -> " \
        f"{out} (" in printed
    tokens = [len(np.load(out / f"{s}.npy")) for s in ("train", "valid")]
    assert printed.startswith(f"{tokens[0]:,} training and {tokens[1]:,} held-out")
    assert main(["data", "text", str(tmp_path / "book.txt"), str(out), "--quiet"]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main(["data", "text", str(tmp_path / "book.txt"), str(out), "--quiet",
                 "--force", "--valid-fraction", "0.5"]) == 0
    assert 0.49 < (out / "valid.txt").stat().st_size / total < 0.51


@pytest.mark.parametrize("content, args, message", [
    (None, [], "error: FILE {file} is not a file"),
    (b"", [], "error: FILE {file} is empty"),
    (b"caf\xe9\n", [], "error: FILE {file} is not UTF-8 text: byte 0xe9 at offset 3"),
    (b"oneword", [], "error: FILE {file} has no <|endoftext|>, line break or space with "
     "text on both sides to cut it at (7 bytes)"),
    (b"\n \n<|endoftext|> x", [], "error: FILE {file} has no <|endoftext|>, line break or "
     "space with text on both sides to cut it at (18 bytes)"),
    (b"a\nb\n", ["--valid-fraction", "1.5"],
     "error: --valid-fraction must be a number between 0 and 1, got 1.5"),
    (b"a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n", ["--vocab-size", "100"],
     "error: vocab_size must be at least 256 + 1 special tokens = 257, got 100"),
])
def test_data_text_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path, capsys,
                                                                     content, args,
                                                                     message):
    file = tmp_path / "in.txt"
    if content is not None:
        file.write_bytes(content)
    assert main(["data", "text", str(file), str(tmp_path / "d"), "--quiet", *args]) == 2
    assert capsys.readouterr().err == message.format(file=file) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == (["in.txt"] if content
                                                          is not None else [])


def test_data_text_refuses_a_file_it_would_replace(tmp_path, capsys):
    """--force replaces DIR's data files: the text to split must not be one of them."""
    out = tmp_path / "data"
    out.mkdir()
    (out / "train.txt").write_text("a\nb\nc\n")
    assert main(["data", "text", str(out / "train.txt"), str(out), "--force"]) == 2
    assert capsys.readouterr().err == (f"error: FILE {out / 'train.txt'} is the "
                                       f"train.txt that the command writes into {out}: "
                                       "copy it elsewhere first\n")
    assert [p.name for p in out.iterdir()] == ["train.txt"]
    assert (out / "train.txt").read_text() == "a\nb\nc\n"
