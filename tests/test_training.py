import math
import os
import re

import pytest
import torch
import torch.nn.functional as F

import tlm


@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_cross_entropy_matches_pytorch(scale):
    logits = torch.randn(4, 12, 50) * scale
    targets = torch.randint(0, 50, (4, 12))
    ours = tlm.cross_entropy(logits, targets)
    assert torch.isfinite(ours)
    torch.testing.assert_close(ours, F.cross_entropy(logits.reshape(-1, 50), targets.reshape(-1)), rtol=1e-5, atol=1e-5)
    ref64 = F.cross_entropy(logits.double().reshape(-1, 50), targets.reshape(-1))
    assert ours.item() == pytest.approx(ref64.item(), rel=1e-5)


def test_cross_entropy_hand_values_and_shapes():
    assert tlm.cross_entropy(torch.zeros(2, 7), torch.tensor([0, 6])).item() == pytest.approx(math.log(7))
    # log(e^0 + e^1) - 1
    assert tlm.cross_entropy(torch.tensor([[0.0, 1.0]]), torch.tensor([1])).item() == pytest.approx(math.log(1 + math.e) - 1)
    assert tlm.cross_entropy(torch.randn(10), torch.tensor(3)).ndim == 0  # a single position


def test_cross_entropy_gradcheck():
    logits = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 4, 2])
    assert torch.autograd.gradcheck(lambda o: tlm.cross_entropy(o, targets), (logits,))


def test_cross_entropy_bad_inputs():
    logits = torch.randn(4, 10)
    with pytest.raises(ValueError, match=r"targets must have shape \(4,\)"):
        tlm.cross_entropy(logits, torch.zeros(4, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"targets must lie in \[0, vocab_size=10\)"):
        tlm.cross_entropy(logits, torch.tensor([0, 1, 2, 10]))
    with pytest.raises(TypeError, match="targets must be an integer tensor"):
        tlm.cross_entropy(logits, torch.zeros(4))
    with pytest.raises(TypeError, match="logits must be a floating-point tensor"):
        tlm.cross_entropy(torch.zeros(4, 10, dtype=torch.long), torch.zeros(4, dtype=torch.long))


def test_addition_encoding():
    assert tlm.decode_addition(tlm.encode_addition(3, 58)) == "03+58=160$"
    assert tlm.decode_addition(tlm.encode_addition(99, 99)) == "99+99=891$"
    train, test = tlm.addition_splits()
    assert train.shape == (8000, 10) and test.shape == (2000, 10)
    seen = {tuple(r) for r in train.tolist()}
    assert not any(tuple(r) in seen for r in test.tolist())
    with pytest.raises(ValueError, match="operands must lie in"):
        tlm.encode_addition(100, 1)


def test_checkpoint_round_trip(tmp_path):
    model = tlm.TransformerLM(13, 16, 32, 1, 2, 64, 1e4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    tlm.save_checkpoint(model, opt, 42, tmp_path / "c.pt")
    other = tlm.TransformerLM(13, 16, 32, 1, 2, 64, 1e4)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-3)
    assert tlm.load_checkpoint(tmp_path / "c.pt", other, other_opt) == 42
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], other_opt.state_dict()["state"][0]["exp_avg"])


def test_training_learns_to_add():
    model, history = tlm.train_addition_model(steps=400, eval_every=400)
    assert not torch.are_deterministic_algorithms_enabled()  # the global setting is restored
    assert history["loss"][-1] < 0.1
    assert history["test_acc"][-1] > 0.9  # on problems never seen in training


def _small_model_and_optimizer():
    model = tlm.TransformerLM(13, 16, 32, 1, 2, 64, 1e4)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, opt = _small_model_and_optimizer()
    target = tmp_path / "c.pt"
    tlm.save_checkpoint(model, opt, 1, target)
    before = target.read_bytes()

    def save_half_then_fail(obj, f):
        f.write(before[: len(before) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", save_half_then_fail)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    with pytest.raises(OSError, match="No space left"):
        tlm.save_checkpoint(model, opt, 2, target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left


def test_save_replaces_the_target_with_a_complete_file(tmp_path):
    model, opt = _small_model_and_optimizer()
    target = tmp_path / "c.pt"
    target.write_bytes(b"an older file")
    tlm.save_checkpoint(model, opt, 7, target)
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert torch.load(target, weights_only=True)["iteration"] == 7


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("content", ["half", "header", "empty", "text", "json"])
def test_truncated_or_foreign_files_are_named(tmp_path, content):
    model, opt = _small_model_and_optimizer()
    whole = tmp_path / "whole.pt"
    tlm.save_checkpoint(model, opt, 3, whole)
    data = whole.read_bytes()
    bad = tmp_path / "bad.pt"
    bad.write_bytes({"half": data[: len(data) // 2], "header": data[:100], "empty": b"",
                     "text": b"step 3, loss 0.1\n" * 20, "json": b'{"iteration": 3}'}[content])
    with pytest.raises(ValueError, match=re.escape(f"{bad} is not a complete checkpoint")):
        tlm.load_checkpoint(bad, model, opt)
    with pytest.raises(ValueError, match="is not a complete checkpoint"):
        tlm.load_model_weights(model, bad)
    with open(bad, "rb") as f, pytest.raises(ValueError, match="bad.pt is not a complete"):
        tlm.load_model_weights(model, f)


def test_load_checkpoint_names_a_bare_state_dict(tmp_path):
    model, opt = _small_model_and_optimizer()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    with pytest.raises(ValueError, match=r"weights\.pt is not a checkpoint of save_checkpoint"):
        tlm.load_checkpoint(tmp_path / "weights.pt", model, opt)
    assert tlm.load_model_weights(model, tmp_path / "weights.pt") is model  # loads weights


def test_cross_entropy_of_16_bit_logits_is_float32():
    """The loss is computed in float32 from 16-bit logits, as autocast does for F.cross_entropy."""
    logits = (torch.randn(4, 12, 1000) * 3).to(torch.bfloat16)
    targets = torch.randint(0, 1000, (4, 12))
    ours = tlm.cross_entropy(logits, targets)
    assert ours.dtype == torch.float32
    ref = F.cross_entropy(logits.double().flatten(0, 1), targets.flatten())
    assert abs(ours.item() - ref.item()) < 1e-5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert tlm.cross_entropy(logits, targets).dtype == torch.float32
