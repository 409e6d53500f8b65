import math

import pytest
import torch
import torch.nn.functional as F

import tlm


def test_matches_f_linear_and_float64_reference():
    layer = tlm.Linear(64, 16)
    x = torch.randn(4, 10, 64)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=0, atol=1e-6)
    ref = (x.double() @ layer.weight.double().T).float()
    torch.testing.assert_close(layer(x), ref, rtol=1e-5, atol=1e-5)


def test_weight_shape_init_and_state_dict():
    layer = tlm.Linear(100, 300)
    assert layer.weight.shape == (300, 100)
    assert list(layer.state_dict()) == ["weight"]
    assert len(list(layer.parameters())) == 1  # no bias
    sigma = math.sqrt(2 / 400)
    assert layer.weight.abs().max() <= 3 * sigma + 1e-7


def test_loads_nn_linear_weights_without_transpose():
    ref = torch.nn.Linear(7, 5, bias=False)
    layer = tlm.Linear(7, 5)
    layer.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(3, 7)
    torch.testing.assert_close(layer(x), ref(x))


def test_gradcheck_float64():
    layer = tlm.Linear(5, 3, dtype=torch.float64)
    x = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: x @ w.T, (x, layer.weight))
    assert torch.autograd.gradcheck(layer, (x,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_device_and_dtype_kwargs(dtype):
    layer = tlm.Linear(8, 4, device="cpu", dtype=dtype)
    assert layer.weight.dtype == dtype and layer.weight.device.type == "cpu"
    assert layer(torch.randn(2, 8, dtype=dtype)).dtype == dtype
    meta = tlm.Linear(8, 4, device="meta")
    assert meta.weight.device.type == "meta"


def test_bad_inputs():
    layer = tlm.Linear(8, 4)
    with pytest.raises(ValueError, match=r"x must have last dimension in_features=8, got shape \(2, 7\)"):
        layer(torch.randn(2, 7))
    with pytest.raises(ValueError, match="in_features=8"):
        layer(torch.tensor(1.0))
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got dtype torch.int64"):
        layer(torch.ones(2, 8, dtype=torch.long))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        layer([[1.0] * 8])
    for args in [(0, 4), (8, -1)]:
        with pytest.raises(ValueError, match="must be a positive int"):
            tlm.Linear(*args)
    for args in [(8.0, 4), (8, True), ("8", 4)]:
        with pytest.raises(TypeError, match="must be a positive int"):
            tlm.Linear(*args)
