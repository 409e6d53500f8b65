"""Equivalence with Hugging Face's LlamaForCausalLM, an independent implementation of the same architecture."""

import pytest
import torch

import tlm

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")


@pytest.mark.parametrize(
    "config",
    [
        dict(vocab_size=10_000, context_length=16, d_model=64, num_layers=3, num_heads=4, d_ff=128, rope_theta=10_000.0),
        dict(vocab_size=500, context_length=40, d_model=96, num_layers=2, num_heads=3, d_ff=256, rope_theta=500.0),
        dict(vocab_size=300, context_length=32, d_model=128, num_layers=1, num_heads=8, d_ff=352, rope_theta=1_000_000.0),
    ],
)
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_logits_match_llama(config, impl):
    model = tlm.TransformerLM(**config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name:
                p.uniform_(0.5, 1.5)
    hf = tlm.to_hf_llama(model, attn_implementation=impl)
    ids = torch.randint(0, config["vocab_size"], (2, config["context_length"]))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=1e-4, atol=1e-4)


def test_round_trip_is_bit_exact_and_independent_llama_loads():
    config = dict(vocab_size=200, context_length=24, d_model=64, num_layers=2, num_heads=4, d_ff=160, rope_theta=10_000.0)
    model = tlm.TransformerLM(**config)
    back = tlm.from_hf_llama(tlm.to_hf_llama(model))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
    # a randomly initialised Llama built by transformers itself converts to the same function
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=200, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=24, rms_norm_eps=1e-6, rope_theta=2_000.0,
        tie_word_embeddings=False)).eval()
    ours = tlm.from_hf_llama(hf)
    assert ours.ln_final.eps == 1e-6 and ours.config["rope_theta"] == 2_000.0
    ids = torch.randint(0, 200, (3, 24))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-4, atol=1e-4)


def test_permutation_is_needed_and_correct():
    perm = tlm.qk_row_permutation(2, 4)
    assert perm.tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_unsupported_configs_are_refused():
    base = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, tie_word_embeddings=False)
    llama3_rope = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    for change, match in [({"attention_bias": True}, "attention_bias"), ({"mlp_bias": True}, "mlp_bias"),
                          ({"hidden_act": "gelu"}, "hidden_act"), ({"rope_parameters": llama3_rope}, "rope_type")]:
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**base, **change}))
        with pytest.raises(ValueError, match=match):
            tlm.from_hf(hf)
        with pytest.raises(ValueError, match=match):
            tlm.from_hf_llama(hf)
    qwen = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**base, head_dim=16, use_sliding_window=True))
    with pytest.raises(ValueError, match="use_sliding_window"):
        tlm.from_hf(qwen)
    qwen = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**base, head_dim=16))
    with pytest.raises(TypeError, match="LlamaForCausalLM.*Qwen3ForCausalLM"):
        tlm.from_hf_llama(qwen)
    with pytest.raises(TypeError, match="LlamaForCausalLM or Qwen3ForCausalLM"):
        tlm.from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="tlm.TransformerLM"):
        tlm.to_hf(qwen)
    with pytest.raises(ValueError, match="qk_norm"):
        tlm.to_hf_llama(tlm.TransformerLM(10, 4, 8, 1, 2, 16, 1e4, qk_norm=True))


def test_tlm_imports_without_transformers():
    import subprocess
    import sys
    code = "import sys; sys.modules['transformers'] = None; import tlm; m = tlm.TransformerLM(10, 4, 8, 1, 2, 16, 1e4); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
    code = "import sys; sys.modules['transformers'] = None; import tlm; tlm.to_hf_llama(tlm.TransformerLM(10, 4, 8, 1, 2, 16, 1e4))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "needs the transformers package" in out.stderr


class _Transformers4Layout:
    """A converted model seen through a transformers-4.x-shaped configuration: rope_theta and
    rope_scaling as attributes, no rope_parameters (what many notebook runtimes still have)."""

    def __init__(self, hf, rope_scaling):
        self._hf = hf
        c = hf.config
        fields = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                  "rms_norm_eps", "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act")
        self.config = type("Config", (), {f: getattr(c, f) for f in fields})()
        self.config.rope_theta = c.rope_parameters["rope_theta"]
        self.config.rope_scaling = rope_scaling
        self.lm_head = hf.lm_head

    def state_dict(self):
        return self._hf.state_dict()


def test_transformers_4_configurations_convert_and_scaled_rope_is_refused():
    config = dict(vocab_size=200, context_length=24, d_model=64, num_layers=2, num_heads=4, d_ff=160,
                  rope_theta=500_000.0)
    model = tlm.TransformerLM(**config)
    hf = tlm.to_hf_llama(model)
    assert not hasattr(_Transformers4Layout(hf, None).config, "rope_parameters")
    back = tlm.from_hf(_Transformers4Layout(hf, None))  # rope_scaling None: plain RoPE
    assert back.config["rope_theta"] == 500_000.0
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
    llama31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    for scaling, name in ((llama31, "llama3"), ({"type": "linear", "factor": 2.0}, "linear")):
        with pytest.raises(ValueError, match=f"rope_type='default' only, got '{name}'"):
            tlm.from_hf(_Transformers4Layout(hf, scaling))
