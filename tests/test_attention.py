import math
import re

import pytest
import torch
import torch.nn.functional as F

import tlm


def float64_attention(Q, K, V, mask=None):
    s = Q.double() @ K.double().transpose(-1, -2) / math.sqrt(Q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ V.double()


def test_sdpa_matches_reference_sizes():
    Q, K, V = torch.randn(4, 12, 64), torch.randn(4, 16, 64), torch.randn(4, 16, 32)
    mask = torch.rand(4, 12, 16) > 0.3
    mask[..., 0] = True
    out = tlm.scaled_dot_product_attention(Q, K, V, mask)
    assert out.shape == (4, 12, 32)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(Q, K, V, attn_mask=mask), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), float64_attention(Q, K, V, mask), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tlm.scaled_dot_product_attention(Q, K, V), float64_attention(Q, K, V).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask_shape", [(12, 16), (1, 12, 16), (2, 1, 12, 16), (2, 3, 12, 16), (16,)])
def test_mask_broadcasting_4d(mask_shape):
    Q, K, V = torch.randn(2, 3, 12, 8), torch.randn(2, 3, 16, 8), torch.randn(2, 3, 16, 8)
    mask = torch.rand(mask_shape) > 0.4
    mask[..., 0] = True
    torch.testing.assert_close(tlm.scaled_dot_product_attention(Q, K, V, mask).double(), float64_attention(Q, K, V, mask), rtol=1e-5, atol=1e-5)


def test_fully_masked_row_returns_zeros():
    Q, K, V = torch.randn(1, 4, 8), torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2] = False
    out = tlm.scaled_dot_product_attention(Q, K, V, mask)
    assert torch.equal(out[0, 2], torch.zeros(8))
    torch.testing.assert_close(out[0, [0, 1, 3]], float64_attention(Q, K, V)[0, [0, 1, 3]].float())


def test_sdpa_gradcheck():
    Q, K, V = (torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    assert torch.autograd.gradcheck(lambda q, k, v: tlm.scaled_dot_product_attention(q, k, v, mask), (Q, K, V))


def reference_mha(m, x, positions=None):
    B, T, _ = x.shape
    h, dk = m.num_heads, m.d_k
    split = lambda t: t.view(B, T, h, dk).transpose(1, 2)
    q, k, v = (split(F.linear(x, p.weight)) for p in (m.q_proj, m.k_proj, m.v_proj))
    if m.rope is not None:
        pos = torch.arange(T) if positions is None else positions[:, None, :]
        q, k = m.rope(q, pos), m.rope(k, pos)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(out.transpose(1, 2).reshape(B, T, -1), m.output_proj.weight)


@pytest.mark.parametrize("theta", [None, 10_000.0])
def test_mha_matches_reference(theta):
    m = tlm.MultiHeadSelfAttention(64, 4, max_seq_len=16, theta=theta)
    x = torch.randn(4, 12, 64)
    torch.testing.assert_close(m(x), reference_mha(m, x), rtol=1e-5, atol=1e-5)


def test_mha_without_max_seq_len_and_heads_are_row_blocks():
    m = tlm.MultiHeadSelfAttention(32, 4)
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(m(x), reference_mha(m, x), rtol=1e-5, atol=1e-5)
    # zeroing the rows of head 2 in v_proj zeroes exactly the head-2 input columns of output_proj
    with torch.no_grad():
        m.v_proj.weight[16:24] = 0
        m.output_proj.weight[:, :16] = 0
        m.output_proj.weight[:, 24:] = 0
    assert m(x).abs().max() == 0


def test_mha_token_positions_per_batch_and_shared():
    m = tlm.MultiHeadSelfAttention(64, 4, max_seq_len=32, theta=10_000.0)
    x = torch.randn(3, 10, 64)
    pos = torch.stack([torch.arange(10), torch.arange(10) + 5, torch.arange(22, 32)])
    torch.testing.assert_close(m(x, pos), reference_mha(m, x, pos), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m(x, torch.arange(10)), m(x), rtol=0, atol=0)
    # shifting all positions by a constant leaves attention scores, hence outputs, unchanged
    torch.testing.assert_close(m(x, torch.arange(10) + 13), m(x), rtol=1e-4, atol=1e-5)


def test_mha_token_positions_with_several_batch_axes():
    """Positions (..., seq) line up with x's (..., seq) from the right, however many batch
    axes x has: (2, 12) serves x (3, 2, 12, d_model) as it would without the heads. Shapes
    that do not fit are refused naming the shapes the caller gave."""
    m = tlm.MultiHeadSelfAttention(32, 4, max_seq_len=16, theta=10_000.0)
    x = torch.randn(3, 2, 12, 32)
    pos = torch.stack([torch.arange(12), torch.arange(12) + 4])  # a row for each x[:, j]
    out = m(x, pos)
    for i in range(3):
        for j in range(2):
            torch.testing.assert_close(out[i, j], m(x[i, j], pos[j]), rtol=1e-5, atol=1e-6)
    for same in (pos.expand(3, 2, 12), pos[None]):
        torch.testing.assert_close(m(x, same), out, rtol=0, atol=0)
    torch.testing.assert_close(m(x, pos[:1]), m(x, torch.arange(12)), rtol=0, atol=0)
    block = tlm.TransformerBlock(32, 4, 64, 16, 10_000.0)
    torch.testing.assert_close(block(x, pos)[1, 1], block(x[1, 1], pos[1]),
                               rtol=1e-5, atol=1e-6)
    for bad in (torch.arange(12).expand(3, 12), torch.arange(12).expand(4, 3, 2, 12),
                torch.arange(11)):
        message = (r"token_positions must have shape \(\.\.\., seq=12\) fitting x's "
                   rf"leading axes \(3, 2, 12\).*; got {re.escape(str(tuple(bad.shape)))}")
        with pytest.raises(ValueError, match=message):
            m(x, bad)


def test_mha_causal_no_leakage():
    m = tlm.MultiHeadSelfAttention(32, 4, max_seq_len=16, theta=10_000.0)
    x = torch.randn(2, 9, 32)
    base = m(x)
    for t in range(9):
        x2 = x.clone()
        x2[:, t] += torch.randn(2, 32)
        out = m(x2)
        torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=1e-6)
        assert not torch.allclose(out[:, t], base[:, t])


def test_mha_state_dict_and_no_persistent_buffers():
    m = tlm.MultiHeadSelfAttention(64, 4, max_seq_len=16, theta=10_000.0)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {
        "q_proj.weight": (64, 64), "k_proj.weight": (64, 64), "v_proj.weight": (64, 64), "output_proj.weight": (64, 64)}


def test_mha_gradcheck():
    m = tlm.MultiHeadSelfAttention(8, 2, max_seq_len=5, theta=100.0, dtype=torch.float64)
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,))


def test_bad_inputs():
    with pytest.raises(ValueError, match="d_model=64 must be divisible by num_heads=5"):
        tlm.MultiHeadSelfAttention(64, 5)
    with pytest.raises(ValueError, match="max_seq_len must be given together with theta"):
        tlm.MultiHeadSelfAttention(64, 4, theta=1e4)
    Q, K, V = torch.randn(4, 12, 8), torch.randn(4, 16, 8), torch.randn(4, 16, 8)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        tlm.scaled_dot_product_attention(Q, K, V, torch.ones(12, 16))
    with pytest.raises(ValueError, match=r"mask of shape \(12, 15\) does not broadcast"):
        tlm.scaled_dot_product_attention(Q, K, V, torch.ones(12, 15, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask of shape \(5, 12, 16\) does not broadcast"):
        tlm.scaled_dot_product_attention(Q, K, V, torch.ones(5, 12, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="K must have last dimension d_k=8"):
        tlm.scaled_dot_product_attention(Q, torch.randn(4, 16, 9), V)
    with pytest.raises(ValueError, match="V must have as many rows as K"):
        tlm.scaled_dot_product_attention(Q, K, torch.randn(4, 15, 8))
    with pytest.raises(ValueError, match="do not broadcast"):
        tlm.scaled_dot_product_attention(torch.randn(3, 12, 8), K, V)
    m = tlm.MultiHeadSelfAttention(64, 4, max_seq_len=16, theta=1e4)
    with pytest.raises(ValueError, match="seq=17 positions, more than max_seq_len=16"):
        m(torch.randn(1, 17, 64))
    with pytest.raises(ValueError, match="x must have last dimension d_model=64"):
        m(torch.randn(1, 5, 63))
    with pytest.raises(ValueError, match=r"token_positions must lie in \[0, max_seq_len=16\)"):
        m(torch.randn(1, 5, 64), torch.arange(12, 17))
