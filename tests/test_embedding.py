import pytest
import torch
import torch.nn.functional as F

import tlm


def test_matches_f_embedding_and_one_hot():
    emb = tlm.Embedding(50, 8)
    ids = torch.randint(0, 50, (3, 7))
    out = emb(ids)
    assert out.shape == (3, 7, 8)
    assert torch.equal(out, F.embedding(ids, emb.weight))
    torch.testing.assert_close(out, F.one_hot(ids, 50).float() @ emb.weight, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.int16])
def test_integer_dtypes_accepted(dtype):
    emb = tlm.Embedding(50, 4)
    ids = torch.tensor([0, 7, 49], dtype=dtype)
    assert torch.equal(emb(ids), emb.weight[[0, 7, 49]])


def test_init_and_state_dict():
    emb = tlm.Embedding(2000, 500)
    assert list(emb.state_dict()) == ["weight"]
    assert emb.weight.shape == (2000, 500)
    assert emb.weight.min() >= -3 and emb.weight.max() <= 3
    assert emb.weight.std().item() == pytest.approx(0.9866, abs=0.01)


def test_gradient_touches_only_used_rows_and_gradcheck():
    emb = tlm.Embedding(10, 3, dtype=torch.float64)
    ids = torch.tensor([[1, 4, 4]])
    emb(ids).sum().backward()
    expected = torch.zeros(10, 3, dtype=torch.float64)
    expected[1] = 1
    expected[4] = 2
    assert torch.equal(emb.weight.grad, expected)
    assert torch.autograd.gradcheck(lambda w: w[ids], (emb.weight.detach().requires_grad_(),))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_device_and_dtype_kwargs(dtype):
    emb = tlm.Embedding(10, 4, device="cpu", dtype=dtype)
    assert emb.weight.dtype == dtype
    assert emb(torch.tensor([1, 2])).dtype == dtype


def test_bad_inputs():
    emb = tlm.Embedding(10, 4)
    with pytest.raises(ValueError, match=r"token_ids must lie in \[0, num_embeddings=10\), got values from 0 to 10"):
        emb(torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="got values from -1 to 2"):
        emb(torch.tensor([-1, 2]))
    with pytest.raises(TypeError, match="token_ids must be an integer tensor.*float32"):
        emb(torch.tensor([1.0]))
    with pytest.raises(TypeError, match="token_ids must be an integer tensor.*bool"):
        emb(torch.tensor([True]))
    with pytest.raises(TypeError, match="token_ids must be an integer torch.Tensor"):
        emb([1, 2])
    assert emb(torch.empty(0, dtype=torch.long)).shape == (0, 4)
    with pytest.raises(ValueError, match="num_embeddings must be a positive int, got 0"):
        tlm.Embedding(0, 4)
    with pytest.raises(TypeError, match="embedding_dim must be a positive int"):
        tlm.Embedding(10, 4.0)
