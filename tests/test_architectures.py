"""Options of real models: grouped-query attention, head_dim, QK-norm, tied embeddings, rms_norm_eps;
conversions to and from Llama and Qwen3; their accounting."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import tlm

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")

BASE = dict(vocab_size=300, context_length=24, d_model=64, num_layers=2, num_heads=4, d_ff=96, rope_theta=1e4)
OPTIONS = {
    "gqa": dict(num_kv_heads=2),
    "mqa": dict(num_kv_heads=1),
    "head_dim": dict(num_kv_heads=2, head_dim=24),
    "tied": dict(tie_embeddings=True),
    "qwen3": dict(num_kv_heads=2, head_dim=32, qk_norm=True, rms_norm_eps=1e-6),
    "qwen3_tied_mqa": dict(num_kv_heads=1, head_dim=8, qk_norm=True, tie_embeddings=True),
}


def reference_attention(m, x):
    """Causal GQA built from torch.nn.functional, with K and V repeated to every query head; no RoPE."""
    B, T, _ = x.shape
    h, g, d = m.num_heads, m.num_kv_heads, m.d_k
    q = F.linear(x, m.q_proj.weight).view(B, T, h, d).transpose(1, 2)
    k, v = (F.linear(x, p.weight).view(B, T, g, d).transpose(1, 2) for p in (m.k_proj, m.v_proj))
    if m.q_norm is not None:
        q = F.rms_norm(q, (d,), m.q_norm.weight, m.q_norm.eps)
        k = F.rms_norm(k, (d,), m.k_norm.weight, m.k_norm.eps)
    k, v = (t.repeat_interleave(h // g, dim=1) for t in (k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(out.transpose(1, 2).reshape(B, T, h * d), m.output_proj.weight)


def randomize_gains(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("heads,kv,head_dim,qk_norm", [(4, 2, None, False), (6, 1, None, True), (4, 4, 24, True),
                                                       (8, 2, 12, False)])
def test_attention_options_match_repeated_heads_reference(impl, heads, kv, head_dim, qk_norm):
    m = tlm.MultiHeadSelfAttention(48, heads, num_kv_heads=kv, head_dim=head_dim, qk_norm=qk_norm,
                                   rms_norm_eps=1e-6, attn_implementation=impl)
    randomize_gains(m)
    d = head_dim or 48 // heads
    assert m.q_proj.weight.shape == (heads * d, 48) and m.output_proj.weight.shape == (48, heads * d)
    assert m.k_proj.weight.shape == m.v_proj.weight.shape == (kv * d, 48)
    x = torch.randn(3, 10, 48, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out, ref = m(x), reference_attention(m, x_ref)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn(out.shape)
    ours = torch.autograd.grad(out, [x, *m.parameters()], grad)
    theirs = torch.autograd.grad(ref, [x_ref, *m.parameters()], grad)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_gqa_gradcheck_in_float64():
    m = tlm.MultiHeadSelfAttention(12, 6, max_seq_len=5, theta=100.0, num_kv_heads=2, qk_norm=True,
                                   dtype=torch.float64)
    x = torch.randn(2, 5, 12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,))


def test_query_head_i_reads_key_value_head_i_over_group():
    m = tlm.MultiHeadSelfAttention(16, 4, num_kv_heads=2)
    with torch.no_grad():  # zero the value rows of kv head 1: query heads 2 and 3 must output zero
        m.v_proj.weight[4:] = 0
    x = torch.randn(1, 6, 16)
    heads = m.attend(*m.project(x))
    assert heads.shape == (1, 4, 6, 4)
    assert heads[:, :2].abs().sum() > 0 and torch.equal(heads[:, 2:], torch.zeros(1, 2, 6, 4))


@pytest.mark.parametrize("name", list(OPTIONS))
def test_config_state_dict_and_rebuild(name):
    options = OPTIONS[name]
    model = tlm.TransformerLM(**BASE, **options)
    c = model.config
    assert c["num_kv_heads"] == options.get("num_kv_heads", 4)
    assert c["head_dim"] == options.get("head_dim", 16)
    assert c["qk_norm"] == options.get("qk_norm", False)
    assert c["tie_embeddings"] == options.get("tie_embeddings", False)
    assert {m.eps for m in model.modules() if isinstance(m, tlm.RMSNorm)} == {options.get("rms_norm_eps", 1e-5)}
    keys = set(model.state_dict())
    norms = {f"layers.{i}.attn.{n}_norm.weight" for i in range(2) for n in "qk"}
    assert (norms <= keys) == c["qk_norm"] and (norms & keys == set()) != c["qk_norm"]
    assert model.state_dict()["layers.0.attn.k_proj.weight"].shape == (c["num_kv_heads"] * c["head_dim"], 64)
    again = tlm.TransformerLM(**c)
    again.load_state_dict(model.state_dict())
    ids = torch.randint(0, 300, (2, 24))
    torch.testing.assert_close(again(ids), model(ids), rtol=0, atol=0)
    assert tlm.count_params(**c) == sum(p.numel() for p in model.parameters())


def test_defaults_are_the_handout_model():
    model = tlm.TransformerLM(**BASE)
    explicit = tlm.TransformerLM(**BASE, num_kv_heads=4, head_dim=16, qk_norm=False, tie_embeddings=False,
                                 rms_norm_eps=1e-5)
    assert model.config == explicit.config
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in explicit.state_dict().items()}
    assert model.lm_head.weight is not model.token_embeddings.weight


def test_tied_embeddings_share_one_parameter():
    model = tlm.TransformerLM(**BASE, tie_embeddings=True)
    assert model.lm_head.weight is model.token_embeddings.weight
    untied = tlm.TransformerLM(**BASE)
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in model.parameters()) == 300 * 64
    # the gradient of the shared matrix is the sum of both uses
    ids = torch.randint(0, 300, (2, 24))
    untied.load_state_dict(model.state_dict())
    model(ids).square().mean().backward()
    untied(ids).square().mean().backward()
    torch.testing.assert_close(model.lm_head.weight.grad,
                               untied.lm_head.weight.grad + untied.token_embeddings.weight.grad)
    # both keys are saved; a state dict whose copies differ is refused, not half-loaded
    state = model.state_dict()
    assert state.keys() == untied.state_dict().keys()
    assert state["lm_head.weight"].data_ptr() == state["token_embeddings.weight"].data_ptr()
    with pytest.raises(ValueError, match="ties lm_head"):
        model.load_state_dict(untied.state_dict() | {"lm_head.weight": torch.zeros(300, 64)})
    with pytest.raises(ValueError, match="ties lm_head"):
        tlm.load_model_weights(model, {"model": untied.state_dict() | {"lm_head.weight": torch.zeros(300, 64)}})


def test_tied_checkpoint_round_trip(tmp_path):
    model = tlm.TransformerLM(**BASE, tie_embeddings=True, num_kv_heads=2, qk_norm=True)
    randomize_gains(model)
    tlm.save_checkpoint(model, torch.optim.AdamW(model.parameters()), 3, tmp_path / "ck.pt")
    again = tlm.TransformerLM(**model.config)
    assert tlm.load_checkpoint(tmp_path / "ck.pt", again) == 3
    assert again.lm_head.weight is again.token_embeddings.weight
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["gqa", "mqa", "qwen3", "head_dim"])
def test_kv_cache_stores_kv_heads_and_equals_recomputation(impl, name):
    model = tlm.TransformerLM(**BASE, **OPTIONS[name], attn_implementation=impl).eval()
    ids = torch.randint(0, 300, (2, 20))
    with torch.no_grad():
        full = model(ids)
        with tlm.KVCache(model) as cache:
            steps = [model(ids[:, :12])] + [model(ids[:, t:t + 1]) for t in range(12, 20)]
            c = model.config
            assert cache.layers[0].k.shape == (2, c["num_kv_heads"], 24, c["head_dim"])
            stored = sum(t.nbytes for layer in cache.layers for t in (layer.k, layer.v))
            assert stored == tlm.kv_cache_bytes(2, 24, torch.float32, **c)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change,error,match", [
    (dict(num_kv_heads=3), ValueError, "num_heads=4 must be divisible by num_kv_heads=3"),
    (dict(num_kv_heads=0), ValueError, "num_kv_heads"),
    (dict(num_kv_heads=2.0), TypeError, "num_kv_heads"),
    (dict(head_dim=7), ValueError, "d_k must be even for RoPE, got head_dim=7"),
    (dict(head_dim=-2), ValueError, "head_dim"),
    (dict(head_dim="16"), TypeError, "head_dim"),
    (dict(qk_norm=1), TypeError, "qk_norm must be a bool"),
    (dict(tie_embeddings="yes"), TypeError, "tie_embeddings must be a bool"),
    (dict(rms_norm_eps=0.0), ValueError, "rms_norm_eps"),
    (dict(d_model=66), ValueError, "or give head_dim"),
])
def test_bad_options(change, error, match):
    with pytest.raises(error, match=match):
        tlm.TransformerLM(**{**BASE, **change})


@pytest.mark.parametrize("make,error,match", [
    (lambda: tlm.GroupedQueryAttention(12, 2, 16, 10000.0, head_dim=3), ValueError,
     "head_dim must be even for RoPE, got 3"),
    (lambda: tlm.GroupedQueryAttention(6, 2, 16, 10000.0), ValueError,
     "d_model / num_heads must be even for RoPE, got 3"),
    (lambda: type("Sub", (tlm.MultiHeadSelfAttention,), {})(16, 4, num_kv_heads=2),
     TypeError, r"Sub takes no num_kv_heads: it subclasses MultiHeadSelfAttention "
     r"\(subclass GroupedQueryAttention instead\)"),
])
def test_the_attention_layer_names_what_it_refuses(make, error, match):
    """The layer alone, as the model's check above does: the head size RoPE cannot
    rotate, and a grouped-query option given to a subclass of the handout's layer."""
    with pytest.raises(error, match=match):
        make()


def test_a_subclass_of_grouped_query_attention_takes_its_options():
    sub = type("Sub", (tlm.GroupedQueryAttention,), {})
    assert type(sub(16, 4, num_kv_heads=2)) is sub


def test_head_dim_lifts_the_divisibility_rule():
    model = tlm.TransformerLM(**{**BASE, "d_model": 66}, head_dim=16, num_kv_heads=2)
    assert model(torch.randint(0, 300, (1, 5))).shape == (1, 5, 300)


# --- Hugging Face ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_logits_match_hugging_face_within_2e_5(name, impl):
    model = randomize_gains(tlm.TransformerLM(**BASE, **OPTIONS[name]))
    hf = tlm.to_hf(model, attn_implementation=impl)
    expected = "Qwen3ForCausalLM" if model.config["qk_norm"] else "LlamaForCausalLM"
    assert type(hf).__name__ == expected
    assert hf.config.tie_word_embeddings == model.config["tie_embeddings"]
    ids = torch.randint(0, 300, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=2e-5)
    back = tlm.from_hf(hf)
    assert back.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


@pytest.mark.parametrize("kind,kv,head_dim,tied", [("llama", 2, None, False), ("llama", 1, 32, True),
                                                   ("qwen3", 2, 32, True), ("qwen3", 4, 8, False)])
def test_models_built_by_transformers_convert(kind, kv, head_dim, tied):
    prefix = {"llama": "Llama", "qwen3": "Qwen3"}[kind]
    config = getattr(transformers, f"{prefix}Config")(
        vocab_size=200, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv, head_dim=head_dim or 16, max_position_embeddings=20, rms_norm_eps=1e-6,
        rope_theta=1e6, tie_word_embeddings=tied)
    hf = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
    randomize_gains(hf)
    ours = tlm.from_hf(hf)
    c = ours.config
    assert (c["num_kv_heads"], c["head_dim"], c["qk_norm"], c["tie_embeddings"]) == (kv, head_dim or 16,
                                                                                   kind == "qwen3", tied)
    assert c["rope_theta"] == 1e6 and c["rms_norm_eps"] == 1e-6
    ids = torch.randint(0, 200, (3, 20))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=0, atol=2e-5)
        with tlm.KVCache(ours):  # the converted model generates with its cache of kv heads
            steps = torch.cat([ours(ids[:, :10])] + [ours(ids[:, t:t + 1]) for t in range(10, 20)], dim=1)
        torch.testing.assert_close(steps, hf(ids).logits, rtol=0, atol=2e-5)


# --- accounting -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(OPTIONS))
def test_accounting_takes_the_options(name):
    config = {**BASE, **OPTIONS[name]}
    model = tlm.TransformerLM(**config)
    assert tlm.count_params(**config) == sum(p.numel() for p in model.parameters())
    ids = torch.zeros(2, 24, dtype=torch.long)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(ids)
    assert tlm.forward_flops(**config, batch_size=2) == counter.get_total_flops()


def test_accounting_by_hand():
    llama3_8b = dict(vocab_size=128_256, d_model=4096, num_layers=32, num_heads=32, num_kv_heads=8, d_ff=14_336)
    # per layer: q and o 2*4096*4096, k and v 2*4096*1024, ffn 3*4096*14336, two norms
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14_336 + 2 * 4096
    assert tlm.count_params(**llama3_8b) == 32 * layer + 2 * 128_256 * 4096 + 4096 == 8_030_261_248
    # keys and values: 2 * 32 layers * 8 heads * 128 numbers * 2 bytes per token
    assert tlm.kv_cache_bytes(1, 1, **llama3_8b) == 131_072
    assert tlm.kv_cache_bytes(4, 8192, torch.float32, **llama3_8b) == 2 * 4 * 8192 * 131_072
    parts = tlm.param_breakdown(vocab_size=10, d_model=8, num_layers=1, d_ff=4, num_heads=2, head_dim=3,
                                qk_norm=True, tie_embeddings=True)
    assert parts == {"token embeddings": 80, "attention": 4 * 8 * 6, "feed-forward": 96, "norms": 3 * 8 + 6,
                     "lm head": 0}


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(batch_size=0, seq_len=5), ValueError, "batch_size"),
    (dict(batch_size=1, seq_len=2.5), TypeError, "seq_len"),
    (dict(batch_size=1, seq_len=5, dtype="bf16"), TypeError, "dtype"),
])
def test_kv_cache_bytes_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        tlm.kv_cache_bytes(**kwargs, **BASE)


REAL = {  # published configurations: config.json of each model on the Hugging Face hub
    "Llama-3-8B": dict(vocab_size=128_256, context_length=8192, d_model=4096, num_layers=32, num_heads=32,
                       num_kv_heads=8, d_ff=14_336, rope_theta=5e5),
    "Qwen3-8B": dict(vocab_size=151_936, context_length=40_960, d_model=4096, num_layers=36, num_heads=32,
                     num_kv_heads=8, head_dim=128, d_ff=12_288, qk_norm=True, rope_theta=1e6, rms_norm_eps=1e-6),
    "Qwen3-0.6B": dict(vocab_size=151_936, context_length=40_960, d_model=1024, num_layers=28, num_heads=16,
                       num_kv_heads=8, head_dim=128, d_ff=3072, qk_norm=True, tie_embeddings=True, rope_theta=1e6,
                       rms_norm_eps=1e-6),
}


@pytest.mark.parametrize("name", list(REAL))
def test_real_configs_match_transformers_on_the_meta_device(name):
    ours = tlm.TransformerLM(**REAL[name], device="meta")
    with torch.device("meta"):
        theirs = transformers.AutoModelForCausalLM.from_config(tlm.hf_config(ours.config))
    n = sum(p.numel() for p in theirs.parameters())
    assert tlm.count_params(**REAL[name]) == n == sum(p.numel() for p in ours.parameters())
    published = {"Llama-3-8B": 8.03e9, "Qwen3-8B": 8.19e9, "Qwen3-0.6B": 0.596e9}[name]
    assert n == pytest.approx(published, rel=2e-3)


def test_the_handouts_model_builds_the_handouts_layer_and_an_option_the_architectures_one(
        tmp_path):
    """The attention chapter's layer for the handout's model; any of the architectures
    chapter's options (given to the layer, the block or the model) makes its subclass, with
    the same state-dict keys. Both survive a deep copy and a whole-module save."""
    plain = tlm.TransformerLM(**BASE)
    assert {type(b.attn) for b in plain.layers} == {tlm.MultiHeadSelfAttention}
    assert not hasattr(plain.layers[0].attn, "num_kv_heads")
    rebuilt = tlm.TransformerLM(**plain.config)  # the config spells out the defaults
    assert {type(b.attn) for b in rebuilt.layers} == {tlm.MultiHeadSelfAttention}
    for options in OPTIONS.values():
        model = tlm.TransformerLM(**BASE, **options)
        grouped = any(k in options for k in ("num_kv_heads", "head_dim", "qk_norm"))
        kinds = {type(b.attn) for b in model.layers}
        assert kinds == {tlm.GroupedQueryAttention if grouped else tlm.MultiHeadSelfAttention}
    layer = tlm.MultiHeadSelfAttention(64, 4, qk_norm=True)
    assert type(layer) is tlm.GroupedQueryAttention
    assert isinstance(layer, tlm.MultiHeadSelfAttention)
    block = tlm.TransformerBlock(64, 4, 96, 24, 1e4, num_kv_heads=2, qk_norm=True,
                                 rms_norm_eps=1e-6)
    assert type(block.attn) is tlm.GroupedQueryAttention and block.attn.q_norm.eps == 1e-6
    with pytest.raises(TypeError, match="num_kv_heads"):
        tlm.TransformerBlock(64, 4, 96, 24, 1e4, num_kv_heads=2.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'kv_heads'"):
        tlm.MultiHeadSelfAttention(64, 4, kv_heads=2)
    import copy
    for module in (plain, tlm.TransformerLM(**BASE, **OPTIONS["qwen3"])):
        twin = copy.deepcopy(module)
        assert [type(b.attn) for b in twin.layers] == [type(b.attn) for b in module.layers]
        torch.save(module, tmp_path / "whole.pt")
        loaded = torch.load(tmp_path / "whole.pt", weights_only=False)
        ids = torch.randint(0, 300, (2, 10))
        assert torch.equal(loaded(ids), module(ids))
