"""attn_implementation, torch.compile, and the measuring tools of tlm.benchmark."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import tlm

CONFIG = dict(vocab_size=64, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64, rope_theta=10_000.0)
TOL = dict(rtol=1e-5, atol=1e-5)  # the stated tolerance between the "eager" and "sdpa" paths (float32)


def _pair(make):
    eager, sdpa = make("eager"), make("sdpa")
    sdpa.load_state_dict(eager.state_dict())
    return eager, sdpa


def _grads(module):
    return [p.grad for p in module.parameters()]


@pytest.mark.parametrize("kind", ["mha", "block"])
def test_eager_and_sdpa_agree_forward_and_backward(kind):
    if kind == "mha":
        eager, sdpa = _pair(lambda impl: tlm.MultiHeadSelfAttention(32, 4, 16, 10_000.0, attn_implementation=impl))
    else:
        eager, sdpa = _pair(lambda impl: tlm.TransformerBlock(32, 4, 64, 16, 10_000.0, attn_implementation=impl))
    x = torch.randn(3, 16, 32)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = eager(xa), sdpa(xb)
    torch.testing.assert_close(ya, yb, **TOL)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    torch.testing.assert_close(xa.grad, xb.grad, **TOL)
    for ga, gb in zip(_grads(eager), _grads(sdpa)):
        torch.testing.assert_close(ga, gb, **TOL)


def test_eager_matches_float64_sdpa_reference():
    # an independent oracle for the book's path: PyTorch's kernel in float64
    eager = tlm.TransformerLM(**CONFIG)
    ref = tlm.TransformerLM(**CONFIG, attn_implementation="sdpa", dtype=torch.float64)
    ref.load_state_dict({k: v.double() for k, v in eager.state_dict().items()})
    ids = torch.randint(0, 64, (2, 16))
    torch.testing.assert_close(eager(ids).double(), ref(ids), rtol=1e-5, atol=1e-5)


def test_lm_logits_and_kv_cache_generation_agree():
    eager, sdpa = _pair(lambda impl: tlm.TransformerLM(**CONFIG, attn_implementation=impl))
    ids = torch.randint(0, 64, (2, 16))
    torch.testing.assert_close(eager(ids), sdpa(ids), **TOL)
    prompt = torch.randint(0, 64, (2, 4))
    # with a cache, "sdpa" gets the causal bias slice (queries offset by the cached positions)
    assert torch.equal(tlm.generate(eager, prompt, 10, temperature=0), tlm.generate(sdpa, prompt, 10, temperature=0))
    with tlm.KVCache(sdpa):
        sdpa(ids[:, :9])
        step = sdpa(ids[:, 9:12])
    torch.testing.assert_close(step, sdpa(ids[:, :12])[:, 9:], **TOL)


def test_attn_implementation_in_config_and_validated():
    model = tlm.TransformerLM(**CONFIG, attn_implementation="sdpa")
    assert model.config["attn_implementation"] == "sdpa"
    again = tlm.TransformerLM(**model.config)
    assert all(layer.attn.attn_implementation == "sdpa" for layer in again.layers)
    assert list(again.state_dict()) == list(tlm.TransformerLM(**CONFIG).state_dict())  # same keys either way
    with pytest.raises(ValueError, match="attn_implementation must be one of .*'sdpa'"):
        tlm.TransformerLM(**CONFIG, attn_implementation="flash3")
    with pytest.raises(ValueError, match="attn_implementation"):
        tlm.MultiHeadSelfAttention(32, 4, attn_implementation=None)


def test_causal_bias_by_hand_and_no_mask_buffers():
    from tlm.attention import _causal_bias
    inf = float("-inf")
    # 2 new queries (positions 2, 3) over 4 keys: query 2 sees keys 0..2, query 3 all
    assert torch.equal(_causal_bias(2, 4), torch.tensor([[0, 0, 0, inf], [0, 0, 0, 0]]))
    assert torch.equal(_causal_bias(3, 3), torch.tensor([[0, inf, inf], [0, 0, inf], [0, 0, 0]]))
    model = tlm.TransformerLM(**CONFIG)
    # the only buffers are the shared RoPE tables: no (context x context) mask per layer
    assert {name.split(".")[-1] for name, _ in model.named_buffers()} == {"cos", "sin"}


@pytest.mark.parametrize("impl", ["eager", "sdpa"])  # sdpa: what `tlm train --compile` compiles
def test_torch_compile_fullgraph_matches_eager(impl):
    torch._dynamo.reset()
    model = tlm.TransformerLM(**CONFIG, attn_implementation=impl)
    compiled = torch.compile(model, fullgraph=True)  # fails on any graph break
    ids = torch.randint(0, 64, (2, 16))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(ids)
        F.cross_entropy(out.flatten(0, 1), ids.flatten()).backward()
    fallbacks = [str(w.message) for w in caught if "does not support" in str(w.message)
                 or "fallback" in str(w.message).lower()]
    assert not fallbacks  # e.g. Inductor's "does not support code generation for complex"
    torch.testing.assert_close(out, model(ids), **TOL)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
    for a, b in zip(grads, _grads(model)):
        torch.testing.assert_close(a, b, **TOL)
    fresh = tlm.TransformerLM(**CONFIG, attn_implementation=impl)
    fresh.load_state_dict(compiled.state_dict())  # `_orig_mod.` keys
    assert torch.equal(fresh(ids), model(ids))


def test_time_alternating_takes_turns_and_counts():
    calls = []
    times = tlm.time_alternating({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3} and all(t >= 0 for v in times.values() for t in v)
    with pytest.raises(ValueError, match="repeats must be a positive int, got 0"):
        tlm.time_alternating({"a": lambda: None}, repeats=0)
    with pytest.raises(TypeError, match="warmup must be an int >= 0, got str"):
        tlm.time_alternating({"a": lambda: None}, warmup="1")


def test_summarize_ratios_by_hand():
    rows = tlm.summarize({"x": [2.0, 4.0, 9.0], "base": [1.0, 2.0, 3.0]}, baseline="base")
    x = rows[0]
    assert x["name"] == "x" and x["median_ms"] == 4000.0 and x["ratio"] == 2.0 and x["paired_ratio"] == 2.0
    with pytest.raises(ValueError, match="baseline"):
        tlm.summarize({"x": [1.0]}, baseline="y")


def test_saved_tensor_bytes_by_hand():
    a, b = torch.randn(1000, requires_grad=True), torch.randn(1000, requires_grad=True)
    assert tlm.saved_tensor_bytes(lambda: (a * b).sum()) == 2 * 1000 * 4  # mul keeps both factors
    assert tlm.saved_tensor_bytes(lambda: (a * a).sum()) == 1000 * 4  # the same tensor counts once
    w = torch.nn.Parameter(torch.randn(1000))
    assert tlm.saved_tensor_bytes(lambda: (a * w).sum()) == 1000 * 4  # parameters are not counted
    assert tlm.saved_tensor_bytes(lambda: torch.exp(a)) == 1000 * 4  # exp keeps its output


def test_training_and_inference_steps_match_direct_computation():
    model = tlm.TransformerLM(**CONFIG)
    ids = torch.randint(0, 64, (2, 17))
    loss = tlm.training_step(model, ids)()
    expected = tlm.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
    torch.testing.assert_close(loss, expected.detach())
    assert all(p.grad is not None for p in model.parameters())
    torch.testing.assert_close(tlm.inference_step(model, ids[:, :16])(), model(ids[:, :16]))


def test_attention_sweep_memory_grows_quadratically_for_eager_only():
    rows = {(r["seq_len"], r["impl"]): r for r in tlm.attention_sweep([64, 128], heads=2, d_k=8, repeats=1)}
    for T in (64, 128):  # eager keeps the (1, 2, T, T) float32 softmax output
        assert rows[T, "eager"]["saved_bytes"] >= 2 * T * T * 4
        assert rows[T, "sdpa"]["saved_bytes"] < rows[T, "eager"]["saved_bytes"]
    assert rows[128, "eager"]["saved_bytes"] / rows[64, "eager"]["saved_bytes"] > 3
