import pytest
import torch

import tlm

DTYPE_RTOL = {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 1e-6, torch.float64: 1e-12}


def float64_rmsnorm(x, weight, eps=1e-5):
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def test_matches_nn_rmsnorm_and_float64():
    x = torch.randn(4, 12, 64) * 3 + 1
    norm = tlm.RMSNorm(64)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    ref = torch.nn.RMSNorm(64, eps=1e-5)
    ref.load_state_dict(norm.state_dict())
    torch.testing.assert_close(norm(x), ref(x), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(norm(x).double(), float64_rmsnorm(x, norm.weight), rtol=1e-6, atol=1e-6)


def test_hand_computed_value_and_eps_inside_sqrt():
    out = tlm.RMSNorm(2)(torch.tensor([3.0, 4.0]))
    expected = torch.tensor([3.0, 4.0]) / (12.5 + 1e-5) ** 0.5
    torch.testing.assert_close(out, expected)
    tiny = torch.full((1, 4), 1e-3)
    # eps inside the sqrt: 1e-3 / sqrt(1e-6 + 1e-5); eps outside would give 1e-3 / (1e-3 + 1e-5)
    torch.testing.assert_close(tlm.RMSNorm(4)(tiny), torch.full((1, 4), 1e-3 / (1.1e-5) ** 0.5))
    assert tlm.RMSNorm(4)(torch.zeros(2, 4)).abs().max() == 0


def test_init_and_state_dict():
    norm = tlm.RMSNorm(16, eps=1e-6)
    assert list(norm.state_dict()) == ["weight"]
    assert torch.equal(norm.weight, torch.ones(16))
    assert norm.eps == 1e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtype_round_trip(dtype):
    x = (torch.randn(8, 256) * 40).to(dtype)
    norm = tlm.RMSNorm(256)
    out = norm(x)
    assert out.dtype == dtype
    if dtype in (torch.float16, torch.bfloat16):
        assert torch.equal(out, norm(x.float()).to(dtype))  # upcast, compute, cast back once
    ref = float64_rmsnorm(x, torch.ones(256))
    rel = ((out.double() - ref).abs() / ref.abs().clamp_min(1e-3)).max().item()
    assert rel <= DTYPE_RTOL[dtype] * 1.01
    # float16 squares of 40-sized values overflow without the upcast
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_gain_keeps_dtype(dtype):
    norm = tlm.RMSNorm(32, dtype=dtype)
    assert norm.weight.dtype == dtype
    assert norm(torch.randn(3, 32, dtype=dtype)).dtype == dtype


def test_gradcheck_float64():
    norm = tlm.RMSNorm(6, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(norm, (x,))


def test_bad_inputs():
    norm = tlm.RMSNorm(64)
    with pytest.raises(ValueError, match=r"x must have last dimension d_model=64, got shape \(2, 64, 32\)"):
        norm(torch.randn(2, 64, 32))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        norm(torch.ones(2, 64, dtype=torch.long))
    with pytest.raises(ValueError, match="d_model must be a positive int, got 0"):
        tlm.RMSNorm(0)
    for eps in (0, -1e-5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="eps must be a positive finite number"):
            tlm.RMSNorm(8, eps=eps)
    for eps in ("1e-5", None, True):  # the wrong kind of value: a TypeError
        with pytest.raises(TypeError, match="eps must be a positive number, got (str|NoneType|bool)"):
            tlm.RMSNorm(8, eps=eps)


def test_hand_written_backward_matches_nn_rmsnorm():
    x = (torch.randn(3, 7, 32) * 2 + 0.5).requires_grad_()
    x_ref = x.detach().double().requires_grad_()
    ours = tlm.RMSNorm(32)
    ref = torch.nn.RMSNorm(32, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ref.weight.copy_(ours.weight)
    g = torch.randn(3, 7, 32)
    ours(x).backward(g)
    ref(x_ref).backward(g.double())
    torch.testing.assert_close(x.grad, x_ref.grad.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_backward_returns_input_dtype(dtype):
    x = torch.randn(4, 64).to(dtype).requires_grad_()
    norm = tlm.RMSNorm(64)
    norm(x).backward(torch.ones(4, 64, dtype=dtype))
    x32 = x.detach().float().requires_grad_()
    norm32 = tlm.RMSNorm(64)
    norm32(x32).backward(torch.ones(4, 64))
    assert x.grad.dtype == dtype and norm.weight.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad.float(), x32.grad, rtol=1e-2, atol=1e-2)  # one rounding of the result
