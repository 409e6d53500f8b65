import math

import pytest
import torch

import tlm


def truncated_normal_std(c: float) -> float:
    """Std of N(0, 1) truncated to [-c, c], from the closed form (independent of torch)."""
    pdf = math.exp(-c * c / 2) / math.sqrt(2 * math.pi)
    return math.sqrt(1 - 2 * c * pdf / math.erf(c / math.sqrt(2)))


def test_linear_std_formula():
    assert tlm.linear_init_std(256, 512) == pytest.approx(math.sqrt(2 / 768))


@pytest.mark.parametrize("d_out,d_in", [(3000, 1000), (1000, 3000)])
def test_linear_init_statistics_and_bounds(d_out, d_in):
    w = tlm.init_linear_weight_(torch.empty(d_out, d_in))
    sigma = math.sqrt(2 / (d_in + d_out))
    assert w.abs().max() <= 3 * sigma + 1e-7
    assert w.abs().max() > 2.9 * sigma  # the tails are really used, not clipped early
    assert w.std().item() == pytest.approx(sigma * truncated_normal_std(3.0), rel=0.01)
    assert abs(w.mean().item()) < 0.01 * sigma
    # mass beyond 2 sigma of a N(0,1) truncated at 3: (P(|Z|>2) - P(|Z|>3)) / P(|Z|<3)
    expected = (math.erfc(2 / math.sqrt(2)) - math.erfc(3 / math.sqrt(2))) / math.erf(3 / math.sqrt(2))
    assert (w.abs() > 2 * sigma).float().mean().item() == pytest.approx(expected, rel=0.05)


def test_embedding_init_statistics_and_bounds():
    w = tlm.init_embedding_weight_(torch.empty(2000, 1000))
    assert w.min() >= -3 and w.max() <= 3
    assert w.abs().max() > 2.9
    assert w.std().item() == pytest.approx(truncated_normal_std(3.0), rel=0.01)
    assert abs(w.mean().item()) < 0.01


@pytest.mark.parametrize("bad", [torch.empty(4), torch.empty(2, 3, 4), "weight"])
def test_init_rejects_non_matrices(bad):
    with pytest.raises(ValueError, match="weight must be a 2-D tensor"):
        tlm.init_linear_weight_(bad)
    with pytest.raises(ValueError, match="weight must be a 2-D tensor"):
        tlm.init_embedding_weight_(bad)


def test_get_device(monkeypatch):
    monkeypatch.setenv("TLM_DEVICE", "cpu")
    assert tlm.get_device() == torch.device("cpu")
    monkeypatch.delenv("TLM_DEVICE")
    assert tlm.get_device("meta") == torch.device("meta")
    expected = "cuda" if torch.cuda.is_available() else None
    if expected:
        assert tlm.get_device().type == "cuda"
    else:
        assert tlm.get_device().type in {"cpu", "mps"}
