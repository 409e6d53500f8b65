import math

import pytest
import torch
import torch.nn.functional as F

import tlm


def test_silu_matches_f_silu_and_formula():
    x = torch.linspace(-20, 20, 1001)
    torch.testing.assert_close(tlm.silu(x), F.silu(x))
    xd = x.double()
    torch.testing.assert_close(tlm.silu(xd), xd / (1 + torch.exp(-xd)))
    assert tlm.silu(torch.tensor(0.0)) == 0


def test_silu_gradcheck():
    x = torch.randn(10, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(tlm.silu, (x,))


def test_swiglu_matches_float64_reference():
    ffn = tlm.SwiGLU(64, 128)
    x = torch.randn(4, 12, 64)
    w1, w2, w3 = (m.weight.double() for m in (ffn.w1, ffn.w2, ffn.w3))
    xd = x.double()
    ref = (F.silu(xd @ w1.T) * (xd @ w3.T)) @ w2.T
    torch.testing.assert_close(ffn(x).double(), ref, rtol=1e-5, atol=1e-6)


def test_state_dict_names_and_shapes():
    ffn = tlm.SwiGLU(64, 128)
    shapes = {k: tuple(v.shape) for k, v in ffn.state_dict().items()}
    assert shapes == {"w1.weight": (128, 64), "w2.weight": (64, 128), "w3.weight": (128, 64)}
    assert all(isinstance(m, tlm.Linear) for m in (ffn.w1, ffn.w2, ffn.w3))


@pytest.mark.parametrize("d_model,d_ff", [(64, 192), (256, 704), (512, 1344), (768, 2048), (1, 64), (4096, 10944)])
def test_d_ff_rule(d_model, d_ff):
    assert tlm.default_d_ff(d_model) == d_ff
    assert tlm.SwiGLU(d_model, device="meta").d_ff == d_ff
    assert d_ff % 64 == 0
    if d_model >= 24:  # below that, 8/3 d_model is under 64 and the minimum of one multiple applies
        assert abs(d_ff - 8 * d_model / 3) <= 32


def test_param_count_close_to_relu_ffn():
    for d_model in (256, 512, 768, 1600):
        n = sum(p.numel() for p in tlm.SwiGLU(d_model, device="meta").parameters())
        assert n == 3 * d_model * tlm.default_d_ff(d_model)
        assert abs(n / (8 * d_model**2) - 1) < 0.035


def test_gradcheck_float64():
    ffn = tlm.SwiGLU(6, 8, dtype=torch.float64)
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ffn, (x,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtype_round_trip(dtype):
    ffn = tlm.SwiGLU(32, 64, dtype=dtype)
    x = torch.randn(3, 32, dtype=dtype)
    out = ffn(x)
    assert out.dtype == dtype
    ref = ffn.to(torch.float64)(x.double())
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-5)
    assert (out.double() - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item())


def test_bad_inputs():
    ffn = tlm.SwiGLU(64, 128)
    with pytest.raises(ValueError, match=r"x must have last dimension d_model=64, got shape \(3, 65\)"):
        ffn(torch.randn(3, 65))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        ffn(torch.ones(3, 64, dtype=torch.int32))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        tlm.silu(1.0)
    with pytest.raises(ValueError, match="d_ff must be a positive int, got 0"):
        tlm.SwiGLU(64, d_ff=0)
    with pytest.raises(TypeError, match="d_ff must be a positive int"):
        tlm.SwiGLU(64, d_ff=128.0)
    with pytest.raises(ValueError, match="d_model must be a positive int"):
        tlm.SwiGLU(-64)


def test_silu_derivative_matches_closed_form():
    x = torch.linspace(-8, 8, 401, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(tlm.silu(x), x, torch.ones_like(x))
    s = torch.sigmoid(x.detach())
    torch.testing.assert_close(grad, s * (1 + x.detach() * (1 - s)))  # derived by hand


def test_silu_is_written_from_torch_sigmoid_not_f_silu(record_calls):
    x = torch.randn(5, 7)
    with record_calls() as record:
        y = tlm.silu(x)
    assert torch.sigmoid in record.called
    assert not [f for f in record.called if getattr(f, "__module__", "") == "torch.nn.functional"]
    assert torch.equal(y, x * torch.sigmoid(x))  # exactly the formula, bit for bit
