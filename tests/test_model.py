import argparse
import io
import pickle

import pytest
import torch
import torch.nn.functional as F

import tlm

REF = dict(vocab_size=10_000, context_length=16, d_model=64, num_layers=3, num_heads=4, d_ff=128, rope_theta=10_000.0)
LAYER_KEYS = ["attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "attn.output_proj.weight", "ln1.weight",
              "ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight", "ln2.weight"]


def reference_block(b, x, positions=None):
    """The block from PyTorch primitives (F.rms_norm, F.linear, F.scaled_dot_product_attention)."""
    B, T, D = x.shape
    a = b.attn
    split = lambda t: t.view(B, T, a.num_heads, a.d_k).transpose(1, 2)
    h = F.rms_norm(x, (D,), b.ln1.weight, eps=1e-5)
    q, k, v = (split(F.linear(h, p.weight)) for p in (a.q_proj, a.k_proj, a.v_proj))
    pos = torch.arange(T) if positions is None else positions[..., None, :]
    q, k = a.rope(q, pos), a.rope(k, pos)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
    y = x + F.linear(o, a.output_proj.weight)
    h = F.rms_norm(y, (D,), b.ln2.weight, eps=1e-5)
    f = b.ffn
    return y + F.linear(F.silu(F.linear(h, f.w1.weight)) * F.linear(h, f.w3.weight), f.w2.weight)


def randomize_gains(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "ln_final.weight" or name == "weight":
                p.uniform_(0.5, 1.5)


def test_block_matches_reference():
    block = tlm.TransformerBlock(64, 4, 128, 16, 10_000.0)
    randomize_gains(block)
    x = torch.randn(4, 12, 64)
    torch.testing.assert_close(block(x), reference_block(block, x), rtol=1e-5, atol=1e-5)
    assert set(block.state_dict()) == set(LAYER_KEYS)


@pytest.mark.parametrize("cls", [tlm.TransformerLM, tlm.HandoutTransformerLM])
def test_lm_matches_reference_composition(cls):
    """Both the exported model and the handout's (exported for the performance chapter)."""
    model = cls(**REF)
    randomize_gains(model)
    ids = torch.randint(0, 10_000, (4, 12))
    x = F.embedding(ids, model.token_embeddings.weight)
    for layer in model.layers:
        x = reference_block(layer, x)
    ref = F.linear(F.rms_norm(x, (64,), model.ln_final.weight, eps=1e-5), model.lm_head.weight)
    torch.testing.assert_close(model(ids), ref, rtol=1e-5, atol=1e-5)


def test_state_dict_keys_exactly():
    model = tlm.TransformerLM(**REF)
    expected = {"token_embeddings.weight": (10_000, 64), "ln_final.weight": (64,), "lm_head.weight": (10_000, 64)}
    shapes = {"attn.q_proj.weight": (64, 64), "attn.k_proj.weight": (64, 64), "attn.v_proj.weight": (64, 64),
              "attn.output_proj.weight": (64, 64), "ln1.weight": (64,), "ffn.w1.weight": (128, 64),
              "ffn.w2.weight": (64, 128), "ffn.w3.weight": (128, 64), "ln2.weight": (64,)}
    for i in range(3):
        expected.update({f"layers.{i}.{k}": v for k, v in shapes.items()})
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
    assert isinstance(model.layers, torch.nn.ModuleList)
    assert list(tlm.HandoutTransformerLM(**REF).state_dict()) == list(model.state_dict())


def test_strict_load_of_contract_state_dict_and_compile_prefix():
    src = tlm.TransformerLM(**REF)
    ids = torch.randint(0, 10_000, (2, 16))
    plain = {k: v.clone() for k, v in src.state_dict().items()}
    prefixed = {"_orig_mod." + k: v for k, v in plain.items()}
    for state in (plain, prefixed, torch.compile(src).state_dict()):
        dst = tlm.TransformerLM(**REF)
        dst.load_state_dict(state, strict=True)
        assert torch.equal(dst(ids), src(ids))


def test_save_load_round_trip_bit_exact(tmp_path):
    src = tlm.TransformerLM(**REF)
    ids = torch.randint(0, 10_000, (2, 16))
    path = tmp_path / "ckpt.pt"
    torch.save({"model": src.state_dict(), "optimizer": {}, "iteration": 7}, path)
    dst = tlm.load_model_weights(tlm.TransformerLM(**REF), path)
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))
    assert torch.equal(src(ids), dst(ids))
    buffer = io.BytesIO()
    torch.save({"_orig_mod." + k: v for k, v in src.state_dict().items()}, buffer)
    buffer.seek(0)
    assert torch.equal(tlm.load_model_weights(tlm.TransformerLM(**REF), buffer)(ids), src(ids))


def test_load_rejects_mismatch_and_pickled_objects(tmp_path):
    state = tlm.TransformerLM(**REF).state_dict()
    smaller = tlm.TransformerLM(**{**REF, "num_layers": 2})
    with pytest.raises(ValueError, match="unexpected keys"):
        tlm.load_model_weights(smaller, state)
    wider = tlm.TransformerLM(**{**REF, "d_ff": 192})
    with pytest.raises(ValueError, match=r"ffn.w1.weight: expected shape \(192, 64\), got \(128, 64\)"):
        tlm.load_model_weights(wider, state)
    missing = dict(state)
    del missing["ln_final.weight"]
    with pytest.raises(ValueError, match="missing keys"):
        tlm.load_model_weights(tlm.TransformerLM(**REF), missing)
    path = tmp_path / "evil.pt"
    torch.save({"model": state, "extra": argparse.Namespace(cmd="not a tensor")}, path)  # arbitrary pickled object
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        tlm.load_model_weights(tlm.TransformerLM(**REF), path)


def test_causal_no_leakage_through_the_model():
    model = tlm.TransformerLM(**REF)
    ids = torch.randint(0, 10_000, (2, 16))
    base = model(ids)
    for t in (0, 5, 15):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 1) % 10_000
        out = model(changed)
        assert torch.equal(out[:, :t], base[:, :t])
        assert not torch.allclose(out[:, t], base[:, t])


def test_truncated_inputs_use_a_prefix_of_the_context():
    model = tlm.TransformerLM(**REF)
    ids = torch.randint(0, 10_000, (3, 16))
    full = model(ids)
    for T in (1, 5, 12):
        torch.testing.assert_close(model(ids[:, :T]), full[:, :T], rtol=1e-5, atol=1e-5)
    assert model(ids[0]).shape == (16, 10_000)  # unbatched


def test_dtype_and_device_kwargs():
    model = tlm.TransformerLM(**REF, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model(torch.randint(0, 10_000, (1, 8))).dtype == torch.bfloat16
    meta = tlm.TransformerLM(**REF, device="meta")
    assert all(p.device.type == "meta" for p in meta.parameters())


def test_bad_inputs():
    model = tlm.TransformerLM(**REF)
    with pytest.raises(ValueError, match=r"token_ids must lie in \[0, vocab_size=10000\), got values from 1 to 10000"):
        model(torch.tensor([[1, 2, 10_000]]))
    with pytest.raises(ValueError, match="got values from -3 to 2"):
        model(torch.tensor([[-3, 2]]))
    with pytest.raises(TypeError, match="token_ids must be an integer tensor"):
        model(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match=r"seq <= context_length=16, got shape \(1, 17\)"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="d_model=64 must be divisible by num_heads=5"):
        tlm.TransformerLM(**{**REF, "num_heads": 5})
    with pytest.raises(ValueError, match="num_layers must be a positive int, got 0"):
        tlm.TransformerLM(**{**REF, "num_layers": 0})
    with pytest.raises(ValueError, match="d_k must be even"):
        tlm.TransformerLM(**{**REF, "d_model": 60, "num_heads": 4})
    with pytest.raises(TypeError, match="src must be a path, a file or a state dict"):
        tlm.load_model_weights(model, 42)


def test_default_model_uses_nothing_from_torch_nn_functional(record_calls):
    """The from-scratch path (attn_implementation="eager"), forward and backward."""
    model = tlm.TransformerLM(**REF)
    ids = torch.randint(0, 10_000, (2, 16))
    with record_calls() as record:
        tlm.cross_entropy(model(ids), ids).backward()
    functional = {getattr(f, "__name__", str(f)) for f in record.called
                  if getattr(f, "__module__", "") == "torch.nn.functional"}
    assert not functional, functional
    assert record.called  # the mode did see the model's calls


def test_buffers_grow_linearly_with_the_context():
    config = dict(vocab_size=1000, d_model=512, num_layers=8, num_heads=8, d_ff=1344,
                  rope_theta=1e4)
    nbytes = lambda m: sum(b.numel() * b.element_size() for b in m.buffers())
    long = tlm.TransformerLM(**config, context_length=16_384, device="meta")
    short = tlm.TransformerLM(**config, context_length=1024, device="meta")
    assert nbytes(long) <= 16 * 2**20  # no (context x context) mask per layer
    assert nbytes(long) == 16 * nbytes(short)  # linear in the context length
    # the RoPE tables: cos and sin, (context, d_k / 2) float32, one pair for all layers
    assert nbytes(long) == 2 * 16_384 * (512 // 8 // 2) * 4


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_an_empty_sequence_is_refused_naming_its_length(attn_implementation):
    model = tlm.TransformerLM(100, 16, 32, 1, 2, 64, 10000.0,
                              attn_implementation=attn_implementation)
    with pytest.raises(ValueError, match=r"1 <= seq <= context_length=16, got shape \(2, 0\)"):
        model(torch.zeros(2, 0, dtype=torch.long))
