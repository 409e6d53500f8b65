import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import tlm

CONFIGS = [
    dict(vocab_size=10_000, context_length=16, d_model=64, num_layers=3, num_heads=4, d_ff=128, rope_theta=1e4),
    dict(vocab_size=777, context_length=33, d_model=96, num_layers=2, num_heads=6, d_ff=200, rope_theta=1e4),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_params_match_the_module(config):
    model = tlm.TransformerLM(**config, device="meta")
    assert tlm.count_params(**config) == sum(p.numel() for p in model.parameters())
    assert tlm.param_breakdown(**config)["feed-forward"] == sum(
        p.numel() for n, p in model.named_parameters() if ".ffn." in n)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("batch", [1, 3])
def test_flops_match_pytorch_flop_counter(config, batch):
    model = tlm.TransformerLM(**config)
    ids = torch.zeros(batch, config["context_length"], dtype=torch.long)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(ids)
    assert tlm.forward_flops(**config, batch_size=batch) == counter.get_total_flops()


def test_gpt2_xl_hand_computed():
    c = dict(vocab_size=50_257, context_length=1024, d_model=1600, num_layers=48, d_ff=6400)
    # 48 * (4*1600^2 + 3*1600*6400 + 2*1600) + 2*50257*1600 + 1600
    assert tlm.count_params(**c) == 48 * (10_240_000 + 30_720_000 + 3_200) + 160_822_400 + 1_600 == 2_127_057_600
    flops = tlm.flops_breakdown(**c)
    assert flops["feed-forward"] == 48 * 6 * 1024 * 1600 * 6400
    assert flops["attention scores and weighted sum"] == 48 * 4 * 1024**2 * 1600
    assert tlm.forward_flops(**c) == pytest.approx(4.513e12, rel=1e-3)
    assert tlm.param_memory_bytes(2_127_057_600) == 8_508_230_400
    assert tlm.param_memory_bytes(10, torch.bfloat16) == 20


def test_long_context_shifts_flops_to_attention():
    c = dict(vocab_size=50_257, d_model=1600, num_layers=48, d_ff=6400)
    short, long = tlm.flops_breakdown(**c, context_length=1024), tlm.flops_breakdown(**c, context_length=16_384)
    share = lambda f: f["attention scores and weighted sum"] / sum(f.values())
    assert share(short) < 0.1 < 0.5 < share(long)


@pytest.mark.parametrize("fn, kwargs, error, match", [
    (tlm.count_params, dict(vocab_size=-5, d_model=64, num_layers=1, d_ff=4), ValueError, "vocab_size"),
    (tlm.count_params, dict(vocab_size=100, d_model=2.5, num_layers=1, d_ff=4), TypeError, "d_model"),
    (tlm.count_params, dict(vocab_size=100, d_model=64, num_layers=2, d_ff=128, num_heads=3),
     ValueError, "divisible by num_heads=3"),
    (tlm.count_params, dict(vocab_size=100, d_model=64, num_layers=2, d_ff=128, num_heads=4,
                            num_kv_heads=3), ValueError, "num_kv_heads=3 must divide"),
    (tlm.forward_flops, dict(vocab_size=10, context_length=-3, d_model=4, num_layers=1, d_ff=4),
     ValueError, "context_length"),
    (tlm.forward_flops, dict(vocab_size=10, context_length=8, d_model=4, num_layers=1, d_ff=4,
                             batch_size=0), ValueError, "batch_size"),
    (tlm.param_memory_bytes, dict(num_params=-3), ValueError, "num_params"),
    (tlm.param_memory_bytes, dict(num_params=3, dtype="float32"), TypeError, "dtype"),
])
def test_bad_sizes_are_named(fn, kwargs, error, match):
    with pytest.raises(error, match=match):
        fn(**kwargs)


def test_sizes_the_model_refuses_are_refused_by_the_accounting_too():
    config = dict(vocab_size=100, context_length=16, d_model=64, num_layers=2, d_ff=128,
                  num_heads=3, rope_theta=1e4)
    with pytest.raises(ValueError, match="divisible"):
        tlm.TransformerLM(**config)
    with pytest.raises(ValueError, match="divisible"):
        tlm.count_params(**config)
    assert tlm.param_memory_bytes(0) == 0
