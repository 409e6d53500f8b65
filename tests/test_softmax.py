import pytest
import torch
import torch.nn.functional as F

import tlm


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_matches_f_softmax_along_any_dim(dim):
    x = torch.randn(3, 4, 5) * 10
    torch.testing.assert_close(tlm.softmax(x, dim), F.softmax(x, dim))


def test_hand_computed():
    import math
    e = [math.exp(1), math.exp(2), math.exp(3)]
    expected = torch.tensor([v / sum(e) for v in e])
    torch.testing.assert_close(tlm.softmax(torch.tensor([1.0, 2.0, 3.0]), 0), expected)


def test_huge_inputs_stay_finite():
    x = torch.tensor([[1e4, 1e4 - 1, -1e4], [1000.0, 1000.0, 1000.0]])
    out = tlm.softmax(x, -1)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, F.softmax(x.double(), -1).float())
    half = torch.tensor([5.0, 12.0, 20.0], dtype=torch.float16)
    assert torch.isfinite(tlm.softmax(half, 0)).all() and tlm.softmax(half, 0).dtype == torch.float16


def test_minus_inf_entries_and_fully_masked_slices():
    x = torch.tensor([[0.0, float("-inf"), 1.0], [float("-inf")] * 3])
    out = tlm.softmax(x, -1)
    e = torch.tensor(1.0).exp()
    torch.testing.assert_close(out[0], torch.stack([1 / (1 + e), torch.tensor(0.0), e / (1 + e)]))
    assert torch.equal(out[1], torch.zeros(3))  # documented: all -inf -> zeros, not NaN
    assert not torch.isnan(out).any()


def test_gradcheck():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: tlm.softmax(t, 1), (x,))
    assert torch.autograd.gradcheck(lambda t: tlm.softmax(t, 0), (x,))


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"dim must be an int in \[-2, 2\) for x of shape \(2, 3\), got 2"):
        tlm.softmax(torch.randn(2, 3), 2)
    with pytest.raises(ValueError, match="dim must be an int"):
        tlm.softmax(torch.randn(2, 3), 1.0)
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        tlm.softmax(torch.tensor([1, 2]), 0)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_hand_written_backward_matches_f_softmax_gradient(dim):
    x = (torch.randn(4, 5, 6) * 5).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    g = torch.randn(4, 5, 6)
    (ours,) = torch.autograd.grad(tlm.softmax(x, dim), x, g)
    (ref,) = torch.autograd.grad(F.softmax(x_ref.double(), dim), x_ref, g.double())
    torch.testing.assert_close(ours, ref.float(), rtol=1e-5, atol=1e-6)


def test_backward_through_masked_entries_is_zero_and_finite():
    scores = torch.randn(3, 4).masked_fill(torch.tensor([False, True, False, True]), float("-inf"))
    scores[2] = float("-inf")  # a fully masked row
    scores.requires_grad_()
    (grad,) = torch.autograd.grad(tlm.softmax(scores, -1), scores, torch.randn(3, 4))
    assert torch.isfinite(grad).all()
    assert torch.equal(grad[:, [1, 3]], torch.zeros(3, 2)) and torch.equal(grad[2], torch.zeros(4))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_are_computed_in_float32(dtype):
    """As autocast does for F.softmax on a GPU: float32 arithmetic, one rounding at the end."""
    x = torch.randn(4, 7, 300) * 4
    low = x.to(dtype).requires_grad_()
    out = tlm.softmax(low, -1)
    assert out.dtype == dtype
    exact = F.softmax(low.detach().double(), -1)  # float64 oracle on the same inputs
    # one rounding of the float32 result: within half a step of the 16-bit format (relative
    # for normal numbers, half the subnormal spacing below them), with slack for float32
    info = torch.finfo(dtype)
    step = info.eps
    half_step = 1.01 * (exact * step / 2 + info.smallest_normal * step / 2)
    assert ((out.double() - exact).abs() <= half_step).all()
    torch.testing.assert_close(out, F.softmax(low.detach().float(), -1).to(dtype), rtol=0, atol=0)
    g = torch.randn(out.shape)
    (grad,) = torch.autograd.grad(out, low, g.to(dtype))
    (ref,) = torch.autograd.grad(F.softmax(low.double(), -1), low, g.double())
    assert grad.dtype == dtype
    torch.testing.assert_close(grad.float(), ref.float(), rtol=2 * step, atol=1e-3)


def test_an_empty_dimension_gives_an_empty_result_as_torch_does():
    for shape, dim in (((2, 0), -1), ((0, 5), -1), ((3, 0, 4), 1)):
        x = torch.zeros(shape, requires_grad=True)
        y = tlm.softmax(x, dim)
        assert y.shape == torch.softmax(x, dim).shape == shape
