"""tlm.from_pretrained and the chat format against transformers, on checkpoints written here.

Every checkpoint is tiny and random, saved by transformers' own save_pretrained (one file and
shards, float32 and bfloat16); the oracle is transformers: its logits, its greedy generate,
its RoPE frequencies, its apply_chat_template on the real chat templates of Qwen3 and Llama
3.1/3.2 (tests/fixtures/chat_templates, where they come from is in its README).
"""
import datetime as dt
import json
import os
import types
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the hub
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import tlm  # noqa: E402
import tlm.generation  # noqa: E402
import tlm.pretrained  # noqa: E402

transformers.logging.disable_progress_bar()
FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"
LLAMA3 = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _save(directory: Path, kind: str, dtype=torch.float32, shard: str | None = None,
          **overrides) -> Path:
    torch.manual_seed(0)
    if kind == "qwen3":
        config = transformers.Qwen3Config(**{**SMALL, "head_dim": 32,
                                             "tie_word_embeddings": True, **overrides})
        model = transformers.Qwen3ForCausalLM(config)
    else:  # a Llama 3.2 in miniature: GQA, tied, the llama3 scaling
        config = transformers.LlamaConfig(**{**SMALL, "rope_theta": 500_000.0,
                                             "tie_word_embeddings": True,
                                             "rope_scaling": dict(LLAMA3), **overrides})
        model = transformers.LlamaForCausalLM(config)
    model.to(dtype).save_pretrained(directory, **({"max_shard_size": shard} if shard else {}))
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {"qwen3": _save(root / "qwen3", "qwen3"),
            "qwen3-sharded": _save(root / "qwen3-sharded", "qwen3", shard="60KB"),
            "llama3": _save(root / "llama3", "llama3"),
            "llama3-sharded": _save(root / "llama3-sharded", "llama3", shard="60KB"),
            "llama3-untied": _save(root / "llama3-untied", "llama3",
                                   tie_word_embeddings=False, rope_scaling=None),
            "qwen3-bf16": _save(root / "qwen3-bf16", "qwen3", dtype=torch.bfloat16)}


def _reference(directory):
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


@pytest.mark.parametrize("name", ["qwen3", "qwen3-sharded", "llama3", "llama3-sharded",
                                  "llama3-untied"])
def test_logits_equal_transformers(checkpoints, name):
    model = tlm.from_pretrained(checkpoints[name])
    ids = torch.randint(0, 512, (2, 200), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # 200 positions: far past the llama3 original context of 64
        gap = (model(ids) - _reference(checkpoints[name])(ids).logits).abs().max()
    assert gap < 1e-5, gap
    if "sharded" in name:
        assert len(list(checkpoints[name].glob("model-*.safetensors"))) > 3


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_greedy_tokens_equal_generate(checkpoints, name):
    prompt = torch.randint(0, 512, (10,), generator=torch.Generator().manual_seed(2))
    ours = tlm.generate(tlm.from_pretrained(checkpoints[name]), prompt, 32, temperature=0)
    theirs = _reference(checkpoints[name]).generate(
        prompt[None], max_new_tokens=32, do_sample=False, eos_token_id=None,
        pad_token_id=0)[0]
    assert torch.equal(ours, theirs)


def test_the_scaling_matters(checkpoints):
    """Without the llama3 frequencies the logits past the first position differ."""
    model = tlm.from_pretrained(checkpoints["llama3"])
    assert isinstance(model.layers[0].attn.rope, tlm.Llama3RotaryEmbedding)
    assert model.layers[0].attn.rope.scaling == {k: v for k, v in LLAMA3.items()
                                                 if k != "rope_type"}
    assert tlm.TransformerLM(**model.config).config == model.config  # rebuilds
    ids = torch.randint(0, 512, (1, 100), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        scaled = model(ids)
        for layer in model.layers:
            layer.attn.rope = tlm.RotaryPositionalEmbedding(500_000.0, 16, 256)
        assert (model(ids) - scaled).abs().max() > 1e-3


@pytest.mark.parametrize("settings", [
    dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position_embeddings=8192),
    dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position_embeddings=8192),
    dict(factor=16.0, low_freq_factor=2.0, high_freq_factor=8.0,
         original_max_position_embeddings=64)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_llama3_frequencies_equal_transformers(settings, head_dim):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
        rope_theta=500_000.0, max_position_embeddings=131072,
        rope_scaling={"rope_type": "llama3", **settings})
    theirs, scale = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    inv_freq = 500_000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ours = tlm.llama3_inv_freq(inv_freq, **settings)
    assert scale == 1.0
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=0)


def test_bfloat16_is_read_as_stored(checkpoints):
    """A bfloat16 file gives bfloat16 parameters equal to its tensors (no rounding through
    another dtype), the tied matrix once; float32 is asked for explicitly."""
    model = tlm.from_pretrained(checkpoints["qwen3-bf16"])
    stored = load_file(checkpoints["qwen3-bf16"] / "model.safetensors")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.lm_head.weight is model.token_embeddings.weight
    assert torch.equal(model.token_embeddings.weight, stored["model.embed_tokens.weight"])
    rows = tlm.qk_row_permutation(2, 32)  # tlm's q/k rows from the file's half-split ones
    assert torch.equal(model.layers[1].attn.k_proj.weight[rows],
                       stored["model.layers.1.self_attn.k_proj.weight"])
    wide = tlm.from_pretrained(checkpoints["qwen3-bf16"], dtype=torch.float32)
    assert torch.equal(wide.lm_head.weight, model.lm_head.weight.float())


def test_parameters_are_not_allocated_twice(checkpoints, monkeypatch):
    """The model is built on the meta device: no parameter is ever initialized."""
    calls = []
    real = torch.nn.init.trunc_normal_
    monkeypatch.setattr(torch.nn.init, "trunc_normal_",
                        lambda t, *a, **k: calls.append(t.device.type) or real(t, *a, **k))
    tlm.from_pretrained(checkpoints["llama3"])
    assert calls and set(calls) == {"meta"}


def _copy(src: Path, dst: Path, config=None, drop=(), add=None, reshape=None) -> Path:
    dst.mkdir()
    c = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**c, **(config or {})}))
    tensors = load_file(src / "model.safetensors")
    for name in drop:
        del tensors[name]
    tensors.update(add or {})
    for name, shape in (reshape or {}).items():
        tensors[name] = torch.zeros(shape)
    save_file(tensors, dst / "model.safetensors")
    return dst


@pytest.mark.parametrize("config, message", [
    ({"architectures": ["MistralForCausalLM"]}, "architectures .*MistralForCausalLM"),
    ({"architectures": None}, r"architectures \[\] is not supported"),
    ({"model_type": "qwen2"}, "model_type 'qwen2' does not match"),
    ({"attention_bias": True}, "attention_bias=True is not supported"),
    ({"mlp_bias": True}, "mlp_bias=True is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
    ({"use_sliding_window": True}, "use_sliding_window=True"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ({"num_experts": 8}, "num_experts=8"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}},
     "rope_type 'yarn' is not supported"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 4.0, "rope_theta": 1e6}},
     "needs low_freq_factor, high_freq_factor, original_max_position_embeddings"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},  # as Qwen's README says
     "rope_parameters \\('default'\\) and rope_scaling \\('yarn'\\) disagree"),
])
def test_a_setting_the_model_lacks_is_refused_by_name(checkpoints, tmp_path, config,
                                                      message):
    bad = _copy(checkpoints["qwen3"], tmp_path / "bad", config=config)
    with pytest.raises(ValueError, match=message):
        tlm.from_pretrained(bad)


def test_older_rope_spelling_is_read(checkpoints, tmp_path):
    """Published Llama 3.2 files: rope_theta and rope_scaling, not rope_parameters."""
    c = json.loads((checkpoints["llama3"] / "config.json").read_text())
    rope = c.pop("rope_parameters")
    old = {**c, "rope_theta": rope.pop("rope_theta"), "rope_scaling": rope}
    options, scaling = tlm.model_options(old)
    assert options["rope_theta"] == 500_000.0 and scaling["factor"] == 32.0
    assert tlm.model_options({**old, "rope_scaling": None})[1] is None


@pytest.mark.parametrize("change, message", [
    (dict(drop=["model.layers.1.mlp.up_proj.weight"]),
     "no tensor 'model.layers.1.mlp.up_proj.weight'"),
    (dict(add={"model.layers.0.self_attn.q_proj.bias": torch.zeros(128)}),
     "1 tensor.s. the model has not, e.g. 'model.layers.0.self_attn.q_proj.bias'"),
    (dict(reshape={"model.norm.weight": (63,)}),
     r"'model.norm.weight' has shape \(63,\), config.json gives \(64,\)"),
    (dict(add={"model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)}), None),
])
def test_tensors_are_checked_before_any_is_read(checkpoints, tmp_path, monkeypatch,
                                                change, message):
    bad = _copy(checkpoints["qwen3"], tmp_path / "bad", **change)
    if message is None:  # recomputed buffers of old checkpoints are ignored
        assert isinstance(tlm.from_pretrained(bad), tlm.TransformerLM)
        return
    monkeypatch.setattr(tlm.pretrained, "_read_tensor", None)  # reading one would fail
    with pytest.raises(ValueError, match=message):
        tlm.from_pretrained(bad)


def _rewrite(path: Path, name: str, data: bytes | None = None, truncate: bool = False):
    """Overwrite one tensor's bytes in place (zeros), or cut the file inside them."""
    header = tlm.read_safetensors_header(path)
    n = int.from_bytes(path.read_bytes()[:8], "little")
    begin, end = header[name]["data_offsets"]
    with open(path, "r+b") as f:
        if truncate:
            f.truncate(8 + n + (begin + end) // 2)
        else:
            f.seek(8 + n + begin)
            f.write(bytes(end - begin) if data is None else data)


def test_the_model_owns_its_weights(checkpoints, tmp_path):
    """The tensors are read into memory of the model's own: a file rewritten in place
    afterwards (which a memory-mapped tensor would follow) leaves the model as it was."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(checkpoints["qwen3"], copy)
    model = tlm.from_pretrained(copy)
    before = model.ln_final.weight.clone()
    _rewrite(copy / "model.safetensors", "model.norm.weight")
    assert torch.equal(model.ln_final.weight, before) and before.abs().sum() > 0
    assert torch.equal(tlm.from_pretrained(copy).ln_final.weight, torch.zeros(64))


def test_a_truncated_or_inconsistent_file_is_named(checkpoints, tmp_path, monkeypatch):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(checkpoints["qwen3"], copy)
    path = copy / "model.safetensors"
    header = tlm.read_safetensors_header(path)
    last = max((k for k in header if k != "__metadata__"),
               key=lambda k: header[k]["data_offsets"][1])
    size = header[last]["data_offsets"][1]
    with monkeypatch.context() as m:  # found before any tensor is read
        m.setattr(tlm.pretrained, "_read_tensor", None)
        _rewrite(path, last, truncate=True)
        cut = path.stat().st_size - 8 - int.from_bytes(path.read_bytes()[:8], "little")
        with pytest.raises(ValueError, match=f"its tensors take {size:,} bytes of data, "
                                             f"the file holds {cut:,}"):
            tlm.from_pretrained(copy)
        shutil.copy(checkpoints["qwen3"] / "model.safetensors", path)
        with open(path, "ab") as f:  # bytes after the last tensor: safetensors refuses too
            f.write(b"\0" * 4)
        with pytest.raises(ValueError, match=f"the file holds {size + 4:,}"):
            tlm.from_pretrained(copy)
        with pytest.raises(Exception):
            load_file(path)
    data = dict(load_file(checkpoints["qwen3"] / "model.safetensors"))
    save_file(data, copy / "model.safetensors")
    raw = (copy / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["model.norm.weight"]["data_offsets"][1] -= 4  # 63 floats' bytes for 64
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(text) == n
    (copy / "model.safetensors").write_bytes(raw[:8] + text + raw[8 + n:])
    with pytest.raises(ValueError, match="'model.norm.weight': 252 bytes for its shape"):
        tlm.from_pretrained(copy)


def test_int_tensors_are_refused(checkpoints, tmp_path):
    bad = _copy(checkpoints["qwen3"], tmp_path / "bad",
                add={"model.norm.weight": torch.zeros(64, dtype=torch.int32)})
    with pytest.raises(ValueError, match="'model.norm.weight' is stored as I32"):
        tlm.from_pretrained(bad)


def test_files_and_sources_are_named(checkpoints, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        tlm.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((checkpoints["qwen3"] / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor"):
        tlm.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00nope!")
    with pytest.raises(ValueError, match="not a safetensors file: its first 8 bytes give"):
        tlm.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x05")
    with pytest.raises(ValueError, match="not a safetensors file: under 8 bytes"):
        tlm.from_pretrained(tmp_path)
    (tmp_path / "models").mkdir()  # a local folder: "models/qwen" is a mistyped path
    for source in ("no/such/place", "./nothing", str(tmp_path / "config.json"), "x",
                   str(tmp_path / "models" / "qwen"), "~/qwen", "../qwen"):
        with pytest.raises(FileNotFoundError, match="neither a directory nor a hub id"):
            tlm.from_pretrained(source)
    monkeypatch.chdir(tmp_path)  # a relative path whose first part is a local folder
    with pytest.raises(FileNotFoundError, match="neither a directory nor a hub id "
                       r"'owner/name' \('models' is a local path, so it is not taken"):
        tlm.from_pretrained("models/qwen")
    with pytest.raises(TypeError, match="source must be a directory or a hub id"):
        tlm.from_pretrained(3)
    with pytest.raises(TypeError, match="dtype must be torch.float32, bfloat16"):
        tlm.from_pretrained(checkpoints["qwen3"], dtype=torch.int8)


def test_a_hub_id_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="could not download 'nobody/nothing-here' from the "
                                      "hub: ") as err:
        tlm.from_pretrained("nobody/nothing-here")
    assert "\n" not in str(err.value)


def test_a_hub_id_without_huggingface_hub(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_hub(name, *args, **kwargs):
        if name.startswith("huggingface_hub"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_hub)
    with pytest.raises(ImportError, match="pip install huggingface_hub"):
        tlm.from_pretrained("Qwen/Qwen3-0.6B")


def test_to_hf_refuses_a_scaled_model(checkpoints):
    with pytest.raises(ValueError, match="plain RotaryPositionalEmbedding only, got "
                                         "Llama3RotaryEmbedding"):
        tlm.to_hf(tlm.from_pretrained(checkpoints["llama3"]))


def test_a_file_that_is_not_safetensors_is_named(tmp_path, checkpoints):
    """A git-lfs pointer in place of the weights (a clone without LFS): a header length
    read from text, far past the file's end."""
    (tmp_path / "config.json").write_text((checkpoints["qwen3"] / "config.json").read_text())
    (tmp_path / "model.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1503300328\n")
    with pytest.raises(ValueError, match="is not a safetensors file: its first 8 bytes"):
        tlm.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 8)
    with pytest.raises(ValueError, match="is not a safetensors file"):
        tlm.from_pretrained(tmp_path)


def test_the_hub_check_reads_hf_endpoint(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.invalid:8443/x")
    reachable, why = tlm.hub_reachable(timeout=1)
    assert not reachable and why.startswith("mirror.invalid: ")


# --- the chat format ------------------------------------------------------------------

CHAT_CHECKPOINTS = {
    "qwen3": dict(template="qwen3.jinja", eos_token_id=[151645, 151643],
                  tokens=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")),
    "llama3.2": dict(template="llama3.jinja", eos_token_id=[128001, 128008, 128009],
                     tokens=dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")),
    "llama3.1": dict(template="llama3_1.jinja", eos_token_id=[128001, 128008, 128009],
                     tokens=dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")),
}


def _chat_checkpoint(directory: Path, config: dict, eos_token_id=None, jinja=None) -> Path:
    """A tokenizer of special tokens only, its tokenizer_config.json and
    generation_config.json: all that transformers needs to render a template."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(BPE(unk_token="<unk>"))
    tok.add_special_tokens(["<unk>"] + sorted(
        {v for v in config.values() if isinstance(v, str) and v.startswith("<")}))
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config}))
    if eos_token_id is not None:
        (directory / "generation_config.json").write_text(
            json.dumps({"eos_token_id": eos_token_id}))
    if jinja is not None:
        (directory / "chat_template.jinja").write_text(jinja, encoding="utf-8")
    return directory


@pytest.fixture(scope="module", params=list(CHAT_CHECKPOINTS))
def chat_checkpoint(request, tmp_path_factory):
    spec = CHAT_CHECKPOINTS[request.param]
    template = (FIXTURES / spec["template"]).read_text(encoding="utf-8")
    d = _chat_checkpoint(tmp_path_factory.mktemp(request.param),
                         {"chat_template": template, **spec["tokens"]}, spec["eos_token_id"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(d))
    return request.param, tokenizer, tlm.read_chat_files(d)


class _FrozenDatetime(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2025, 3, 7, 12, 0, 0)


@pytest.fixture(autouse=True)
def _frozen_clock(monkeypatch):
    """Llama 3.2's template writes today's date (strftime_now) on both sides."""
    from transformers.utils import chat_template_utils

    monkeypatch.setattr(tlm.generation, "datetime",
                        types.SimpleNamespace(datetime=_FrozenDatetime))
    monkeypatch.setattr(chat_template_utils, "datetime", _FrozenDatetime)


SYSTEM = {"role": "system", "content": "You are a terse assistant."}
USER = {"role": "user", "content": "What is 2+2?"}
ASSISTANT = {"role": "assistant", "content": "4"}
THINKING = {"role": "assistant", "content": "<think>\nadd two and two\n</think>\n\nIt is 4."}
CHINESE_USER = {"role": "user", "content": "你好，请用中文介绍一下你自己。"}
CHINESE_ASSISTANT = {"role": "assistant", "content": "我是一个小型语言模型。  "}
CONVERSATIONS = {
    "one user turn": [USER],
    "system and user": [SYSTEM, USER],
    "three turns": [SYSTEM, USER, ASSISTANT, CHINESE_USER],
    "chinese": [CHINESE_USER, CHINESE_ASSISTANT, USER],
    "thinking reply last": [USER, THINKING],
    "thinking reply earlier": [USER, THINKING, CHINESE_USER, CHINESE_ASSISTANT, USER],
    "a None field dropped": [USER, {"role": "assistant", "content": "4",
                                    "tool_calls": None}],
}
VARIABLES = {"none": {}, "thinking on": {"enable_thinking": True},
             "thinking off": {"enable_thinking": False},
             "date_string": {"date_string": "01 Jan 2030"}}


@pytest.mark.parametrize("variables", list(VARIABLES))
@pytest.mark.parametrize("prompt", [False, True])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_chat_text_equals_apply_chat_template(chat_checkpoint, name, prompt, variables):
    _, tokenizer, (template, tokens, _) = chat_checkpoint
    messages, extra = CONVERSATIONS[name], VARIABLES[variables]
    expected = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=prompt, **extra)
    assert tlm.render_chat(template, messages, add_generation_prompt=prompt, **tokens,
                           **extra) == expected


def test_messages_in_a_tuple_are_read_as_transformers_reads_them(chat_checkpoint):
    _, tokenizer, (template, tokens, _) = chat_checkpoint
    messages = tuple(CONVERSATIONS[list(CONVERSATIONS)[-1]])
    expected = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True)
    assert tlm.render_chat(template, messages, add_generation_prompt=True,
                           **tokens) == expected


def test_chat_files_are_read_as_transformers_reads_them(chat_checkpoint):
    name, tokenizer, (template, tokens, end_ids) = chat_checkpoint
    spec = CHAT_CHECKPOINTS[name]
    assert template == tokenizer.chat_template == (FIXTURES / spec["template"]).read_text()
    assert tokens == tokenizer.special_tokens_map
    assert end_ids == spec["eos_token_id"]


def test_qwen3_thinking_switch_and_llama_date():
    qwen = (FIXTURES / "qwen3.jinja").read_text()
    off = tlm.render_chat(qwen, [USER], add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    on = tlm.render_chat(qwen, [USER], add_generation_prompt=True)
    assert on.endswith("<|im_start|>assistant\n")
    llama = (FIXTURES / "llama3.jinja").read_text()
    assert "Today Date: 07 Mar 2025" in tlm.render_chat(llama, [USER],
                                                        bos_token="<|begin_of_text|>")


def test_tools_render_as_transformers_renders_them(chat_checkpoint):
    _, tokenizer, (template, tokens, _) = chat_checkpoint
    tools = [{"type": "function", "function": {
        "name": "add", "description": "Add two ints",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]
    expected = tokenizer.apply_chat_template([USER], tools=tools, tokenize=False,
                                             add_generation_prompt=True)
    assert tlm.render_chat(template, [USER], add_generation_prompt=True, tools=tools,
                           **tokens) == expected


FEATURES = {  # one setting of transformers' Jinja environment each
    "trim and lstrip blocks": "{% for m in messages %}\n    {% if m.role == 'user' %}\n"
                              "  U: {{ m.content }}\n    {% endif %}\n{% endfor %}\n",
    "loop controls": "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                     "{{ m.content }}{% endfor %}",
    "tools and documents": "{{ tools is defined }} {{ tools is none }} {{ documents is none }}",
    "special tokens": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}",
    "tojson": "{{ messages | tojson(indent=2, sort_keys=true) }}",
    "strftime_now": "{{ strftime_now('%Y-%m-%d') }}",
}


@pytest.mark.parametrize("name", list(FEATURES))
def test_the_environment_is_transformers(tmp_path, name):
    d = _chat_checkpoint(tmp_path, {"bos_token": "<s>", "eos_token": "</s>",
                                    "pad_token": "<pad>"})
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(d))
    messages = [SYSTEM, USER, ASSISTANT, {"role": "user", "content": "<b>你</b> & more"}]
    expected = tokenizer.apply_chat_template(messages, chat_template=FEATURES[name],
                                             tokenize=False)
    assert tlm.render_chat(FEATURES[name], messages,
                           **tokenizer.special_tokens_map) == expected


@pytest.mark.parametrize("config", [{"chat_template": "CONFIG"}, {}])
def test_chat_template_jinja_comes_first(tmp_path, config):
    d = _chat_checkpoint(tmp_path, {"eos_token": "</s>", **config}, 7,
                         jinja="FILE {{ messages[0].content }}")
    template, _, ends = tlm.read_chat_files(d)
    assert template == transformers.AutoTokenizer.from_pretrained(str(d)).chat_template
    assert template == "FILE {{ messages[0].content }}" and ends == [7]


def test_a_list_of_templates_and_tokens_as_objects(tmp_path):
    config = {"chat_template": [{"name": "tool_use", "template": "T"},
                                {"name": "default", "template": "D{{ bos_token }}"}],
              "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False,
                            "normalized": False, "rstrip": False, "single_word": False,
                            "special": True}, "eos_token": "</s>"}
    d = _chat_checkpoint(tmp_path, config, 2)
    template, tokens, _ = tlm.read_chat_files(d)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(d))
    assert tokens == tokenizer.special_tokens_map == {"bos_token": "<s>", "eos_token": "</s>"}
    assert tlm.render_chat(template, [USER], **tokens) == "D<s>"
    assert tokenizer.apply_chat_template([USER], tokenize=False) == "D<s>"


@pytest.mark.parametrize("config, eos, error, message", [
    ({"eos_token": "</s>"}, 2, ValueError, "no chat template"),
    ({"chat_template": [{"name": "rag", "template": "R"}]}, 2, ValueError,
     "no chat template"),
    ({"chat_template": "X"}, None, ValueError, "no eos_token_id in .*generation_config"),
])
def test_chat_files_refused_by_name(tmp_path, config, eos, error, message):
    d = _chat_checkpoint(tmp_path, config, eos)
    with pytest.raises(error, match=message):
        tlm.read_chat_files(d)
    (d / "generation_config.json").write_text("{}")
    with pytest.raises(ValueError, match="no chat template|no eos_token_id in"):
        tlm.read_chat_files(d)


@pytest.mark.parametrize("messages, where", [
    ("hello", "messages must be a non-empty list"), (USER, "messages must be"),
    ([], "messages must be"), ([USER, "hi"], r"messages\[1\] must be"),
    ([{"role": "user"}], r"messages\[0\] must be"),
    ([{"role": "user", "content": ["a"]}], r"messages\[0\] must be")])
def test_bad_messages_are_named(messages, where):
    with pytest.raises(TypeError, match=where):
        tlm.render_chat("{{ messages }}", messages)


def test_a_template_refusal_is_its_message(tmp_path):
    d = _chat_checkpoint(tmp_path, {"eos_token": "</s>"})
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(d))
    template = "{{ raise_exception('Only user and assistant roles are supported!') }}"
    with pytest.raises(Exception) as theirs:
        tokenizer.apply_chat_template([USER], chat_template=template, tokenize=False)
    with pytest.raises(ValueError) as ours:
        tlm.render_chat(template, [USER])
    assert str(ours.value) == str(theirs.value)


def test_multiple_end_ids_stop_generation():
    """generate stops when every sequence has produced one of the end ids."""
    torch.manual_seed(0)
    model = tlm.TransformerLM(64, 64, 32, 1, 2, 64, 10_000.0)
    prompt = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(0))
    free = tlm.generate(model, prompt, 30, temperature=0)
    firsts = [int(free[0, 4]), int(free[1, 4])]
    ends = sorted(set(firsts))
    for fn in (tlm.generate, tlm.generate_plain):
        out = fn(model, prompt, 30, temperature=0, eos_id=ends + [63])
        assert out.shape[1] == 5  # both rows ended at their first new token
    with pytest.raises(ValueError, match="a non-empty list of them"):
        tlm.generate(model, prompt, 3, eos_id=[1, 64])


# --- what an adversarial user tried (each failed before its fix) ----------------------

@pytest.mark.parametrize("change, message", [
    ({"hidden_size": None}, "config.json lacks hidden_size"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ({"rope_parameters": [1]}, "rope_parameters must be an object or null"),
])
def test_a_config_with_a_wrong_value_is_named(checkpoints, tmp_path, change, message):
    c = json.loads((checkpoints["qwen3"] / "config.json").read_text())
    c.update(change)
    c = {k: v for k, v in c.items() if not (k == "hidden_size" and v is None)}
    bad = _copy(checkpoints["qwen3"], tmp_path / "bad")
    (bad / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match=message):
        tlm.from_pretrained(bad)


def test_corrupt_json_files_are_named(checkpoints, tmp_path):
    bad = _copy(checkpoints["qwen3"], tmp_path / "bad")
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not JSON text"):
        tlm.from_pretrained(bad)
    (bad / "config.json").write_text("[1]")
    with pytest.raises(ValueError, match="config.json must hold a JSON object, got list"):
        tlm.from_pretrained(bad)
    (bad / "config.json").write_text((checkpoints["qwen3"] / "config.json").read_text())
    (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": [1]}))
    with pytest.raises(ValueError, match="weight_map must map tensor names"):
        tlm.from_pretrained(bad)


def test_a_malformed_header_entry_is_named(checkpoints, tmp_path):
    bad = _copy(checkpoints["qwen3"], tmp_path / "bad")
    raw = (bad / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["model.norm.weight"]["data_offsets"] = [-4, 252]
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    (bad / "model.safetensors").write_bytes(raw[:8] + text[:n] + raw[8 + n:])
    with pytest.raises(ValueError, match="'model.norm.weight': a header entry without"):
        tlm.from_pretrained(bad)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(device="xyz"), ValueError, "device 'xyz' is not usable here"),
    (dict(dtype=torch.float8_e4m3fn), TypeError, "dtype must be torch.float32"),
])
def test_device_and_dtype_are_checked_first(checkpoints, kwargs, error, message):
    with pytest.raises(error, match=message):
        tlm.from_pretrained(checkpoints["qwen3"], **kwargs)


@pytest.mark.parametrize("eos", ["1502", 1502.0, True, {"a": 1}, -5, []])
def test_end_ids_that_are_not_ids_are_named(tmp_path, eos):
    d = _chat_checkpoint(tmp_path, {"chat_template": "x", "eos_token": "</s>"}, eos)
    with pytest.raises(ValueError, match="generation_config.json: eos_token_id must be"):
        tlm.read_chat_files(d)


def test_overlapping_tensors_are_refused(checkpoints, tmp_path):
    """Two tensors pointed at the same bytes (v_proj at k_proj's) would load as equal;
    safetensors refuses such a file, and so does from_pretrained."""
    bad = _copy(checkpoints["qwen3"], tmp_path / "bad")
    raw = (bad / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    k, v = (f"model.layers.0.self_attn.{p}_proj.weight" for p in "kv")
    header[v]["data_offsets"] = list(header[k]["data_offsets"])
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    (bad / "model.safetensors").write_bytes(raw[:8] + text[:n] + raw[8 + n:])
    with pytest.raises(ValueError, match="byte ranges overlap or leave gaps"):
        tlm.from_pretrained(bad)
    with pytest.raises(FileNotFoundError, match="neither a directory nor a hub id"):
        tlm.from_pretrained("")


def test_add_generation_prompt_is_a_bool():
    with pytest.raises(TypeError, match="add_generation_prompt must be a bool, got str"):
        tlm.render_chat("{{ messages }}", [USER], add_generation_prompt="no")
