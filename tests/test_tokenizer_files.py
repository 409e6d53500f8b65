"""The tokenizer's files: GPT-2's vocab.json and merges.txt, tiktoken's ranks, .npy ids."""

import contextlib
import io
import os
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

import tlm
import tlm.cli
from tlm.tokenizer import Tokenizer, package_data_path, train_bpe
from tlm.tokenizer import BYTE_TO_CHAR, read_merges, read_vocab, write_merges, write_vocab
from tlm.tokenizer_files import load_tiktoken_ranks, merges_from_ranks

EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def gpt2():
    return tlm.gpt2_tokenizer()


def test_the_byte_table_of_gpt2():
    """Hand-derived: 188 printable Latin-1 bytes as themselves, the other 68 from U+0100 on."""
    assert len(set(BYTE_TO_CHAR.values())) == 256
    assert [b for b in range(256) if BYTE_TO_CHAR[b] == chr(b)] == [
        *range(33, 127), *range(161, 173), *range(174, 256)]
    assert BYTE_TO_CHAR[0] == "\u0100" and BYTE_TO_CHAR[32] == "Ġ" and BYTE_TO_CHAR[10] == "Ċ"
    assert BYTE_TO_CHAR[127] == chr(0x100 + 33) and BYTE_TO_CHAR[173] == chr(0x100 + 67)


# ---- files ----

def test_save_and_load_round_trip_bytes_that_are_not_utf8(tmp_path, gpt2):
    vocab = {i: bytes([i]) for i in range(256)}
    merges = [(b"\xff", b"\xfe"), (b"\xff\xfe", b" "), (b"\xe6", b"\x97")]
    for a, b in merges:
        vocab[len(vocab)] = a + b
    tok = Tokenizer(vocab, merges, [EOT])
    tok.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    back = Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", [EOT])
    assert back.vocab == tok.vocab and back.merges == merges
    gpt2.save(tmp_path / "g.json", tmp_path / "g.txt")
    assert read_vocab(tmp_path / "g.json") == gpt2.vocab
    assert read_merges(tmp_path / "g.txt") == gpt2.merges
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json", "g.txt", "merges.txt",
                                                          "vocab.json"]  # no temporary files


def test_a_failed_save_leaves_the_previous_file(tmp_path, monkeypatch):
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [])
    tok.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    before = (tmp_path / "vocab.json").read_bytes()

    def fail(*args):
        raise OSError("No space left on device")
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        Tokenizer({**tok.vocab, 256: b"ab"}, [(b"a", b"b")]).save(
            tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert (tmp_path / "vocab.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merges.txt", "vocab.json"]


def test_malformed_files_name_the_file_and_line(tmp_path):
    bad_json = tmp_path / "vocab.json"
    bad_json.write_text('{"a": 0,\n "b": }', encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab\.json, line 2: not valid JSON"):
        read_vocab(bad_json)
    bad_json.write_text('{"a": 0, "b": 0}', encoding="utf-8")
    with pytest.raises(ValueError, match="id 0 is given to two tokens"):
        read_vocab(bad_json)
    bad_json.write_text('["a"]', encoding="utf-8")
    with pytest.raises(ValueError, match="expected a JSON object"):
        read_vocab(bad_json)
    merges = tmp_path / "merges.txt"
    merges.write_text("#version: 0.2\na b\nc\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"merges\.txt, line 3: expected two tokens"):
        read_merges(merges)
    merges.write_text("a b\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"merge 0 \(b'a', b'b'\): b'ab' is not in the vocab"):
        Tokenizer({i: bytes([i]) for i in range(256)}, read_merges(merges))


def test_files_that_are_not_utf8_name_the_file_and_the_byte(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b'{"ab": 1\x80}')
    for read in (read_vocab, read_merges):
        with pytest.raises(ValueError, match=r"junk\.bin is not UTF-8 text: byte 8 "
                                             r"\(b'\\x80'\)"):
            read(junk)
    merges = tmp_path / "merges.txt"
    merges.write_bytes(b"#version: 0.2\r\na b\r\n")  # Windows line ends are line ends
    assert read_merges(merges) == [(b"a", b"b")]
    merges.write_bytes(b"#version: 0.2\r\na b\r\n\xff\n")
    with pytest.raises(ValueError, match=r"merges\.txt is not UTF-8 text: byte 20 "):
        read_merges(merges)
    write_vocab({i: bytes([i]) for i in range(256)}, tmp_path / "vocab.json")
    with pytest.raises(ValueError, match=r"junk\.bin is not UTF-8 text: byte 8"):
        Tokenizer.from_files(tmp_path / "vocab.json", junk)
    (tmp_path / "t.txt").write_text("text", encoding="utf-8")
    done = _cli("encode", "t.txt", "--vocab", "junk.bin", "--merges", "junk.bin", "--out",
                "ids.npy", cwd=tmp_path)
    assert done.returncode == 2 and not (tmp_path / "ids.npy").exists()
    assert done.stderr == ("error: junk.bin is not UTF-8 text: byte 8 (b'\\x80') starts no "
                           "character\n")


# ---- tiktoken's ranks ----

def test_merges_from_a_hand_made_ranks_table(tmp_path):
    single = {bytes([b]): b for b in range(256)}
    ranks = {**single, b"ab": 256, b"abc": 257, b"bc": 258}
    # "abc": with ranks below 257, a·b·c merges to ab·c and stops there
    assert merges_from_ranks(ranks) == [(b"a", b"b"), (b"ab", b"c"), (b"b", b"c")]
    with pytest.raises(ValueError, match=r"token b'abc' \(rank 256\) is no merge"):
        merges_from_ranks({**single, b"abc": 256})
    path = tmp_path / "t.tiktoken"
    path.write_bytes(b"YWI= 256\n\nYWJj 257\n")  # base64 of ab and abc, a blank line
    assert load_tiktoken_ranks(path) == {b"ab": 256, b"abc": 257}
    path.write_bytes(b"YWI= 256\nnot-base64! 3\n")
    with pytest.raises(ValueError, match=r"t\.tiktoken, line 2: expected a base64 token"):
        load_tiktoken_ranks(path)


def test_gpt2_merges_are_its_ranks_in_order(gpt2):
    path = package_data_path("whisper", "assets", "gpt2.tiktoken", install="openai-whisper")
    ranks = load_tiktoken_ranks(path)
    by_rank = sorted(ranks, key=ranks.get)
    assert len(gpt2.merges) == 50_000 and len(gpt2.vocab) == 50_257
    assert all(a + b == by_rank[256 + k] for k, (a, b) in enumerate(gpt2.merges))
    # the first merges of GPT-2's published merges.txt
    assert [(a + b) for a, b in gpt2.merges[:4]] == [b" t", b" a", b"he", b"in"]


# ---- the command line ----

def _cli_process(*args, cwd):
    """`python -m tlm tokenizer ARGS`, the entry point a user runs."""
    return subprocess.run([sys.executable, "-m", "tlm", "tokenizer", *args], cwd=cwd,
                          capture_output=True, text=True)


def _cli(*args, cwd):
    """The same command in this process (a new Python costs seconds per call): its exit
    status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            code = tlm.cli.main(["tokenizer", *args])
        except SystemExit as done:  # argparse: --help, or a usage error
            code = done.code
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(),
                                 stderr=err.getvalue())


def test_command_line_train_and_encode(tmp_path):
    text = EOT.join(f"document {i}: the cat sat on the mat, {i * 37} times.\n" for i in range(60))
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    done = _cli_process("train", "corpus.txt", "--vocab-size", "300", "--out-dir", "bpe",
                        "--special-token", EOT, "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "43 merges, 300 tokens" in done.stdout
    vocab, merges = train_bpe(tmp_path / "corpus.txt", 300, [EOT])
    tok = Tokenizer.from_files(tmp_path / "bpe" / "vocab.json", tmp_path / "bpe" / "merges.txt",
                               [EOT])
    assert tok.merges == merges and tok.vocab == vocab
    done = _cli("encode", "corpus.txt", "--vocab", "bpe/vocab.json", "--merges",
                "bpe/merges.txt", "--special-token", EOT, "--out", "ids.npy", "--processes",
                "2", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ids = np.load(tmp_path / "ids.npy", mmap_mode="r")
    assert ids.dtype == np.uint16 and list(ids) == tok.encode(text)
    assert not [p for p in tmp_path.rglob("*.tmp")]  # nothing half-written is left


def test_command_line_reports_bad_input_without_a_traceback(tmp_path):
    (tmp_path / "corpus.txt").write_text("text", encoding="utf-8")
    done = _cli("train", "corpus.txt", "--vocab-size", "100", "--out-dir", "bpe", "--quiet",
                cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: vocab_size must be at least 256 + 0 special tokens " \
                                  "= 256, got 100"
    done = _cli("encode", "missing.txt", "--vocab", "v.json", "--merges", "m.txt", "--out",
                "ids.npy", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("error: ")
    assert not (tmp_path / "ids.npy").exists()
    assert _cli("--help", cwd=tmp_path).returncode == 0
    # a special token the vocabulary lacks would get an id past it: refused, naming both
    (tmp_path / "bpe").mkdir()
    write_vocab({i: bytes([i]) for i in range(256)}, tmp_path / "bpe" / "vocab.json")
    write_merges([], tmp_path / "bpe" / "merges.txt")
    done = _cli("encode", "corpus.txt", "--vocab", "bpe/vocab.json", "--merges",
                "bpe/merges.txt", "--special-token", EOT, "--out", "ids.npy", cwd=tmp_path)
    assert done.returncode == 2 and not (tmp_path / "ids.npy").exists()
    assert done.stderr.strip() == (f"error: --special-token {EOT!r} is not in bpe/vocab.json: "
                                   "the tokenizer was trained without it")


def test_encode_file_refuses_vocabularies_past_uint16(tmp_path, gpt2):
    big = Tokenizer({**gpt2.vocab, 70_000: b"\x00\x00\x01"}, gpt2.merges)
    (tmp_path / "t.txt").write_text("hi", encoding="utf-8")
    with pytest.raises(ValueError, match="do not fit uint16"):
        tlm.tokenizer_files.encode_file(big, tmp_path / "t.txt", tmp_path / "ids.npy")


def test_encode_file_warns_when_a_file_is_one_chunk(tmp_path, monkeypatch):
    """No special token to cut at: one chunk, one process, every id in memory, and a
    warning says so; a file cut at special tokens gets none."""
    monkeypatch.setattr(tlm.tokenizer_files, "ONE_CHUNK_WARNING", 100)
    tok = Tokenizer({i: bytes([i]) for i in range(256)} | {256: EOT.encode()}, [], [EOT])
    plain = tmp_path / "plain.txt"
    plain.write_text("the cat sat on the mat. " * 40, encoding="utf-8")
    with pytest.warns(UserWarning, match="is one chunk, it has no special token"):
        tlm.tokenizer_files.encode_file(tok, plain, tmp_path / "plain.npy", 2)
    no_specials = Tokenizer({i: bytes([i]) for i in range(256)}, [])
    with pytest.warns(UserWarning, match="the tokenizer has no special tokens"):
        tlm.tokenizer_files.encode_file(no_specials, plain, tmp_path / "plain.npy", 2)
    cut = tmp_path / "documents.txt"
    cut.write_text(EOT.join(["the cat sat on the mat. " * 4] * 10), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        n = tlm.tokenizer_files.encode_file(tok, cut, tmp_path / "documents.npy", 2)
    assert list(np.load(tmp_path / "documents.npy")) == tok.encode(cut.read_text()) and n


def test_encode_file_one_chunk_with_special_tokens_only_at_its_start(tmp_path, monkeypatch):
    """Special tokens only before the first place a cut is looked for leave one chunk, and
    the warning does not say the file has none; the file is scanned for cuts once."""
    monkeypatch.setattr(tlm.tokenizer_files, "ONE_CHUNK_WARNING", 100)
    scans = []
    scan = tlm.tokenizer.chunk_boundaries
    monkeypatch.setattr(tlm.tokenizer, "chunk_boundaries",
                        lambda *a, **k: scans.append(a) or scan(*a, **k))
    tok = Tokenizer({i: bytes([i]) for i in range(256)} | {256: EOT.encode()}, [], [EOT])
    early = tmp_path / "early.txt"
    early.write_text("a" + EOT + "the cat sat on the mat. " * 40, encoding="utf-8")
    with pytest.warns(UserWarning, match=r"is one chunk, it has no special token "
                                         r"\['<\|endoftext\|>'\] past its start to cut at"):
        n = tlm.tokenizer_files.encode_file(tok, early, tmp_path / "early.npy", 2)
    assert list(np.load(tmp_path / "early.npy")) == tok.encode(early.read_text()) and n
    assert len(scans) == 1


@pytest.mark.parametrize("out", ["corpus.txt", "bpe/vocab.json", "bpe/merges.txt",
                                 "./bpe/../corpus.txt", "link.txt"])
def test_encode_refuses_to_write_over_one_of_its_inputs(tmp_path, out):
    """--out naming the text (a slip of tab completion), the vocabulary or the merges
    replaced that file by token ids and exited 0: refused in one line, nothing written."""
    (tmp_path / "corpus.txt").write_text(f"the cat sat. {EOT} the mat.", encoding="utf-8")
    (tmp_path / "link.txt").symlink_to(tmp_path / "corpus.txt")
    (tmp_path / "bpe").mkdir()
    write_vocab({i: bytes([i]) for i in range(256)} | {256: EOT.encode()},
                tmp_path / "bpe" / "vocab.json")
    write_merges([], tmp_path / "bpe" / "merges.txt")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    done = _cli("encode", "corpus.txt", "--vocab", "bpe/vocab.json", "--merges",
                "bpe/merges.txt", "--special-token", EOT, "--out", out, "--quiet",
                cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    name = {"corpus.txt": "input", "./bpe/../corpus.txt": "input", "link.txt": "input",
            "bpe/vocab.json": "--vocab", "bpe/merges.txt": "--merges"}[out]
    assert done.stderr == (f"error: --out {out} is the {name} file: writing it would "
                           "replace it; choose another\n")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not list(tmp_path.rglob("*.tmp"))


def test_train_refuses_to_write_over_its_input_and_processes_must_be_positive(tmp_path):
    (tmp_path / "vocab.json").write_text("the cat sat on the mat " * 20, encoding="utf-8")
    before = (tmp_path / "vocab.json").read_bytes()
    done = _cli("train", "vocab.json", "--vocab-size", "260", "--out-dir", ".", "--quiet",
                cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == ("error: --out-dir .: its vocab.json would be written over the "
                           "input file; choose another\n")
    assert (tmp_path / "vocab.json").read_bytes() == before
    assert not (tmp_path / "merges.txt").exists()
    for action in (["train", "vocab.json", "--vocab-size", "260", "--out-dir", "bpe"],
                   ["encode", "vocab.json", "--vocab", "v", "--merges", "m", "--out",
                    "x.npy"]):
        done = _cli(*action, "--processes", "0", cwd=tmp_path)
        assert done.returncode == 2
        assert done.stderr == ("error: --processes must be at least 1 (or left out: one "
                               "per CPU core), got 0\n")
