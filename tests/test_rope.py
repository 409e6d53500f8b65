import math

import pytest
import torch

import tlm


def rotation_matrix(i, d, theta):
    R = torch.zeros(d, d, dtype=torch.float64)
    for k in range(1, d // 2 + 1):
        a = i / theta ** ((2 * k - 2) / d)
        R[2 * k - 2 : 2 * k, 2 * k - 2 : 2 * k] = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    return R


def rope_half_split(x, positions, theta):
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions.double()[..., None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin


@pytest.mark.parametrize("theta", [10_000.0, 500.0])
def test_matches_rotation_matrices(theta):
    rope = tlm.RotaryPositionalEmbedding(theta, 16, 32)
    x = torch.randn(3, 12, 16)
    ref = torch.stack([x[:, i].double() @ rotation_matrix(i, 16, theta).T for i in range(12)], 1)
    torch.testing.assert_close(rope(x).double(), ref, rtol=0, atol=1e-5)


def test_explicit_positions_and_broadcasting():
    rope = tlm.RotaryPositionalEmbedding(10_000.0, 8, 64)
    x = torch.randn(2, 3, 5, 8)  # (batch, heads, seq, d_k)
    pos = torch.tensor([[7, 9, 11, 40, 63], [0, 1, 2, 3, 4]])
    out = rope(x, pos[:, None, :])
    for b in range(2):
        for t in range(5):
            R = rotation_matrix(int(pos[b, t]), 8, 10_000.0)
            torch.testing.assert_close(out[b, :, t].double(), x[b, :, t].double() @ R.T, rtol=0, atol=1e-5)
    shared = rope(x, torch.arange(5))
    torch.testing.assert_close(shared, rope(x))



def test_positions_per_sequence_must_keep_the_head_axis():
    """(batch, seq) positions on a (batch, heads, seq, d_k) input would be lined up with the
    heads: an error when batch != heads, and head b given sequence b's positions when they
    are equal. Refused, naming the argument, the expected shape and the one given."""
    rope = tlm.RotaryPositionalEmbedding(10_000.0, 8, 64)
    pos = torch.tensor([[7, 9, 11, 40, 63], [0, 1, 2, 3, 4]])
    for heads in (3, 2):  # batch != heads, batch == heads
        x = torch.randn(2, heads, 5, 8)
        message = (rf"token_positions must have shape \(seq,\) or one axis per leading axis "
                   rf"of x \(2, {heads}, 5, 8\), each of its size or 1, e.g. \(2, 1, 5\) "
                   rf".*; got \(2, 5\)")
        with pytest.raises(ValueError, match=message):
            rope(x, pos)
        right = rope(x, pos[:, None, :])
        for b in range(2):
            torch.testing.assert_close(right[b], rope(x[b], pos[b]))
    x = torch.randn(2, 3, 5, 8)
    for bad in (pos[:, None, None, :], torch.arange(5).expand(3, 1, 5)):  # too many, 3 != 2
        with pytest.raises(ValueError, match="token_positions must have shape"):
            rope(x, bad)
    for fine in (torch.arange(5), torch.arange(5)[None, None], pos[:, None].expand(2, 3, 5)):
        assert rope(x, fine).shape == x.shape
    assert rope(torch.randn(2, 5, 8), pos).shape == (2, 5, 8)  # (batch, seq, d_k)

def test_relative_position_property():
    rope = tlm.RotaryPositionalEmbedding(10_000.0, 32, 512)
    q, k = torch.randn(32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    def score(m, n):
        return (rope(q[None], torch.tensor([m])) @ rope(k[None], torch.tensor([n])).T).item()
    for m, n, s in [(5, 2, 100), (0, 30, 77), (200, 199, 300)]:
        assert score(m, n) == pytest.approx(score(m + s, n + s), abs=1e-4)
    assert abs(score(5, 2) - score(5, 3)) > 1e-3  # and it does depend on the offset


def test_preserves_norms_and_dtype():
    rope = tlm.RotaryPositionalEmbedding(10_000.0, 64, 128)
    x = torch.randn(4, 100, 64)
    torch.testing.assert_close(rope(x).norm(dim=-1), x.norm(dim=-1))
    assert torch.equal(rope(x)[:, 0], x[:, 0])
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        assert rope(x.to(dtype)).dtype == dtype


def test_half_split_permutation_equivalence():
    d, T = 16, 10
    rope = tlm.RotaryPositionalEmbedding(10_000.0, d, T)
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    q, k = torch.randn(3, T, d, dtype=torch.float64), torch.randn(3, T, d, dtype=torch.float64)
    pos = torch.arange(T)
    torch.testing.assert_close(rope(q)[..., perm], rope_half_split(q[..., perm], pos, 1e4), rtol=0, atol=1e-6)
    s_adj = rope(q) @ rope(k).transpose(-1, -2)
    s_half = rope_half_split(q[..., perm], pos, 1e4) @ rope_half_split(k[..., perm], pos, 1e4).transpose(-1, -2)
    torch.testing.assert_close(s_adj, s_half, rtol=0, atol=1e-5)


def test_caches_are_non_persistent_buffers():
    rope = tlm.RotaryPositionalEmbedding(10_000.0, 8, 16)
    assert list(rope.parameters()) == [] and rope.state_dict() == {}
    assert {n for n, _ in rope.named_buffers()} == {"cos", "sin"}
    assert rope.cos.shape == (16, 4) and rope.cos.dtype == torch.float32
    # no d x d matrix anywhere
    assert all(b.numel() <= 16 * 4 for b in rope.buffers())


def test_gradcheck():
    rope = tlm.RotaryPositionalEmbedding(10_000.0, 6, 8)
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(rope, (x,))


def test_bad_inputs():
    with pytest.raises(ValueError, match="d_k must be even"):
        tlm.RotaryPositionalEmbedding(10_000.0, 15, 32)
    with pytest.raises(ValueError, match="theta must be a positive finite number, got 0"):
        tlm.RotaryPositionalEmbedding(0, 16, 32)
    with pytest.raises(TypeError, match="theta must be a positive number, got str"):
        tlm.RotaryPositionalEmbedding("1e4", 16, 32)
    with pytest.raises(ValueError, match="max_seq_len must be a positive int"):
        tlm.RotaryPositionalEmbedding(1e4, 16, 0)
    rope = tlm.RotaryPositionalEmbedding(10_000.0, 16, 32)
    with pytest.raises(ValueError, match=r"token_positions must lie in \[0, max_seq_len=32\), got values from 21 to 32"):
        rope(torch.randn(12, 16), torch.arange(21, 33))
    with pytest.raises(ValueError, match="seq=40 positions, more than max_seq_len=32"):
        rope(torch.randn(40, 16))
    with pytest.raises(ValueError, match=r"token_positions must have shape \(..., seq=12\)"):
        rope(torch.randn(12, 16), torch.arange(10))
    with pytest.raises(TypeError, match="token_positions must be an integer tensor"):
        rope(torch.randn(12, 16), torch.arange(12.0))
    with pytest.raises(ValueError, match="x must have last dimension d_k=16"):
        rope(torch.randn(12, 8))


def test_strided_and_unaligned_layouts():
    rope = tlm.RotaryPositionalEmbedding(10_000.0, 8, 16)
    big = torch.randn(3, 16, 9)
    odd = big[..., 1:]  # odd storage offset and odd strides: pairs are not aligned in memory
    torch.testing.assert_close(rope(odd), rope(odd.contiguous()), rtol=0, atol=0)
    transposed = torch.randn(8, 16).T  # last axis not contiguous
    torch.testing.assert_close(rope(transposed), rope(transposed.contiguous()), rtol=0, atol=0)


def test_low_precision_rotates_in_float32():
    rope = tlm.RotaryPositionalEmbedding(10_000.0, 64, 128)
    x = torch.randn(2, 100, 64).to(torch.bfloat16)
    expected = rope(x.float()).to(torch.bfloat16)  # one rounding, after a float32 rotation
    assert torch.equal(rope(x), expected)


def test_a_cast_to_16_bits_keeps_the_tables_float32():
    """model.to(bfloat16) would round cos/sin to 8 bits (errors ~4e-3 in every angle);
    they stay float32, computed independently here in float64."""
    model = tlm.TransformerLM(vocab_size=50, context_length=512, d_model=32, num_layers=2,
                              num_heads=2, d_ff=64, rope_theta=10_000.0)
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half()):
        cast(model)
        rope = model.layers[0].attn.rope
        assert model.lm_head.weight.dtype != torch.float32  # the weights were cast
        angles = torch.outer(torch.arange(512, dtype=torch.float64),
                             10_000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16))
        for table, exact in ((rope.cos, angles.cos()), (rope.sin, angles.sin())):
            assert table.dtype == torch.float32
            assert (table.double() - exact).abs().max() < 1e-4  # float32's, not 16-bit
    model.double()  # a wider dtype still widens them
    assert model.layers[0].attn.rope.cos.dtype == torch.float64
