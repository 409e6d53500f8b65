import contextlib
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


@contextlib.contextmanager
def _threads(n):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_training_learns_to_add():
    """Learns to add; and the training chapter's claim about CPU threads: 8 threads split
    SiLU's sigmoid differently from 1, a last-bit difference that the sudden drop of the
    loss (steps 200 to 400) turns into a visible one."""
    with _threads(1):
        model, history = tlm.train_addition_model(steps=400, eval_every=100,
                                                  deterministic=False)
    assert not torch.are_deterministic_algorithms_enabled()  # the global setting is restored
    assert history["loss"][-1] < 0.1
    assert history["test_acc"][-1] > 0.9  # on problems never seen in training
    with _threads(8):
        _, eight = tlm.train_addition_model(steps=300, eval_every=100, deterministic=False)
    assert eight["step"] == history["step"][:3] == [100, 200, 300]
    assert abs(eight["loss"][0] - history["loss"][0]) < 1e-4  # still only the last bits
    assert abs(eight["loss"][2] - history["loss"][2]) > 1e-3  # at step 300: visible


def test_the_same_threads_give_the_same_run_with_or_without_deterministic_algorithms():
    runs = []
    for deterministic in (True, False, False):
        with _threads(2):
            model, _ = tlm.train_addition_model(steps=10, eval_every=10,
                                                deterministic=deterministic)
        runs.append([p.detach().clone() for p in model.parameters()])
        assert torch.are_deterministic_algorithms_enabled() is False
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(run, runs[0]))


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


# ---- AdamW, the schedule and clipping, against PyTorch's and by hand ----

def _twin_models():
    torch.manual_seed(0)
    a = tlm.TransformerLM(vocab_size=40, context_length=8, d_model=32, num_layers=2,
                          num_heads=4, d_ff=64, rope_theta=1e4)
    b = tlm.TransformerLM(**a.config)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("kwargs", [dict(lr=1e-3), dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1),
                                    dict(lr=1e-2, eps=1e-6, weight_decay=0.0)])
def test_adamw_equals_torch_adamw_over_many_steps(kwargs):
    a, b = _twin_models()
    opt_a = tlm.AdamW(a.parameters(), **kwargs)
    opt_b = torch.optim.AdamW(b.parameters(), **kwargs, foreach=False)
    gen = torch.Generator().manual_seed(1)
    for _ in range(100):
        ids = torch.randint(0, 40, (4, 9), generator=gen)
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            tlm.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_adamw_state_resumes_exactly(tmp_path):
    a, b = _twin_models()
    opt_a, opt_b = tlm.AdamW(a.parameters(), lr=1e-2), tlm.AdamW(b.parameters(), lr=1e-2)
    ids = torch.randint(0, 40, (4, 9))

    def step(model, opt):
        opt.zero_grad()
        tlm.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).backward()
        opt.step()
    for _ in range(3):
        step(a, opt_a), step(b, opt_b)
    tlm.save_checkpoint(b, opt_b, 3, tmp_path / "c.pt")
    c = tlm.TransformerLM(**a.config)
    opt_c = tlm.AdamW(c.parameters(), lr=1e-2)
    assert tlm.load_checkpoint(tmp_path / "c.pt", c, opt_c) == 3
    for _ in range(3):
        step(a, opt_a), step(c, opt_c)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_adamw_first_step_is_lr_against_the_gradient_sign():
    w = torch.zeros(5, requires_grad=True)
    w.grad = torch.tensor([1e-4, -3.0, 50.0, -1e3, 2.0])
    tlm.AdamW([w], lr=0.1, weight_decay=0.0).step()
    torch.testing.assert_close(w.detach(), -0.1 * torch.sign(w.grad), rtol=1e-3, atol=0)
    w = torch.ones(3, requires_grad=True)
    w.grad = torch.zeros(3)
    tlm.AdamW([w], lr=0.1, weight_decay=0.5).step()  # decay only: 1 - lr * lambda
    torch.testing.assert_close(w.detach(), torch.full((3,), 0.95))


def test_adamw_bad_arguments():
    w = [torch.zeros(2, requires_grad=True)]
    for kwargs, name in ((dict(lr=-1), "lr"), (dict(eps=float("nan")), "eps"),
                         (dict(weight_decay="0.1"), "weight_decay"), (dict(betas=(0.9, 1.0)), "betas"),
                         (dict(betas=0.9), "betas")):
        with pytest.raises(ValueError, match=name):
            tlm.AdamW(w, **kwargs)


def test_cosine_schedule_by_hand():
    lr = lambda t: tlm.get_lr_cosine_schedule(t, 1.0, 0.1, 7, 21)  # noqa: E731
    assert [lr(t) for t in (0, 1, 7)] == [0.0, 1 / 7, 1.0]
    assert lr(14) == pytest.approx(0.1 + 0.5 * 0.9)  # half-way through the cosine
    assert lr(21) == pytest.approx(0.1) and lr(22) == 0.1 and lr(1000) == 0.1
    values = [lr(t) for t in range(7, 22)]
    assert all(x > y for x, y in zip(values, values[1:]))  # decreasing on the cosine part
    assert tlm.get_lr_cosine_schedule(5, 1.0, 0.0, 0, 0) == 0.0
    with pytest.raises(ValueError, match="warmup_iters <= cosine_cycle_iters"):
        tlm.get_lr_cosine_schedule(0, 1.0, 0.1, 10, 5)


def test_gradient_clipping_equals_clip_grad_norm():
    a, b = _twin_models()
    ids = torch.randint(0, 40, (4, 9))
    for model in (a, b):
        (100 * tlm.cross_entropy(model(ids[:, :-1]), ids[:, 1:])).backward()
    a.lm_head.weight.grad = None  # a parameter without a gradient is skipped
    b.lm_head.weight.grad = None
    before = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in a.parameters()
                                                   if p.grad is not None]))
    assert before > 1.0
    tlm.gradient_clipping(a.parameters(), 1.0)
    torch.nn.utils.clip_grad_norm_(b.parameters(), 1.0)
    for p, q in zip(a.parameters(), b.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
    after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in a.parameters()
                                                  if p.grad is not None]))
    assert after == pytest.approx(1.0, rel=1e-5)
    small = [g.clone() for g in (p.grad for p in a.parameters()) if g is not None]
    tlm.gradient_clipping(a.parameters(), 10.0)  # below the maximum: unchanged
    assert all(torch.equal(g, p.grad) for g, p in zip(small, [p for p in a.parameters()
                                                              if p.grad is not None]))
    with pytest.raises(ValueError, match="max_l2_norm must be a number > 0"):
        tlm.gradient_clipping(a.parameters(), 0)


# ---- CS336's Algorithm 1 (HandoutAdamW) against float64 references and PyTorch ----

def _algorithm_1(theta, grads, lr, betas, eps, weight_decay):
    """CS336's Algorithm 1 in float64, on plain Python lists of numbers."""
    b1, b2 = betas
    theta, m, v = list(theta), [0.0] * len(theta), [0.0] * len(theta)
    for t, g in enumerate(grads, start=1):
        alpha_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        for i, gi in enumerate(g):
            m[i] = b1 * m[i] + (1 - b1) * gi
            v[i] = b2 * v[i] + (1 - b2) * gi * gi
            theta[i] -= alpha_t * m[i] / (math.sqrt(v[i]) + eps)
            theta[i] -= lr * weight_decay * theta[i]
    return theta


@pytest.mark.parametrize("kwargs", [dict(lr=1e-2), dict(lr=0.1, betas=(0.8, 0.95), eps=1e-3,
                                                        weight_decay=0.5)])
def test_handout_adamw_is_algorithm_1(kwargs):
    gen = torch.Generator().manual_seed(3)
    start = torch.randn(7, generator=gen, dtype=torch.float64)
    grads = [torch.randn(7, generator=gen, dtype=torch.float64) * 10.0**k for k in (-6, 0, 2)]
    w = torch.nn.Parameter(start.clone())
    opt = tlm.HandoutAdamW([w], **kwargs)
    for g in grads:
        w.grad = g.clone()
        opt.step()
    full = dict(dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01), **kwargs)
    ref = _algorithm_1(start.tolist(), [g.tolist() for g in grads], **full)
    torch.testing.assert_close(w.detach(), torch.tensor(ref, dtype=torch.float64),
                               rtol=1e-12, atol=1e-15)


def test_handout_adamw_differs_from_pytorch_only_where_the_chapter_says():
    """eps = 0 and no decay: Adam itself; with decay, one step differs by lr * lambda * u."""
    gen = torch.Generator().manual_seed(4)
    start = torch.randn(50, generator=gen, dtype=torch.float64)
    grads = [torch.randn(50, generator=gen, dtype=torch.float64) for _ in range(5)]
    a, b = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    opt_a = tlm.HandoutAdamW([a], lr=1e-2, eps=0.0, weight_decay=0.0)
    opt_b = torch.optim.Adam([b], lr=1e-2, eps=0.0)
    for g in grads:
        a.grad, b.grad = g.clone(), g.clone()
        opt_a.step(), opt_b.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-14)
    lr, lam = 1e-2, 0.3
    a, b = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    a.grad, b.grad = grads[0].clone(), grads[0].clone()
    tlm.HandoutAdamW([a], lr=lr, eps=0.0, weight_decay=lam).step()
    torch.optim.AdamW([b], lr=lr, eps=0.0, weight_decay=lam).step()
    u = lr * torch.sign(grads[0])  # Adam's first step without eps
    torch.testing.assert_close(a.detach() - b.detach(), lr * lam * u, rtol=1e-9, atol=1e-15)


def test_handout_adamw_bad_arguments():
    w = [torch.zeros(2, requires_grad=True)]
    for kwargs, name in ((dict(lr=-1), "lr"), (dict(eps=float("inf")), "eps"),
                         (dict(weight_decay=None), "weight_decay"), (dict(betas=(1.0, 0.9)), "betas")):
        with pytest.raises(ValueError, match=name):
            tlm.HandoutAdamW(w, **kwargs)


# ---- adamwAccounting: memory by component and the FLOPs of one AdamW step ----

SMALL = dict(vocab_size=97, context_length=12, num_layers=3, d_model=32, num_heads=4,
             rope_theta=1e4)


def test_adamw_memory_of_weights_gradients_and_state_is_what_a_real_model_holds():
    config = dict(SMALL, d_ff=4 * 32)
    model = tlm.TransformerLM(**config)
    ids = torch.randint(0, 97, (2, 12))
    tlm.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).backward()
    opt = tlm.AdamW(model.parameters())
    opt.step()
    nbytes = lambda tensors: sum(t.numel() * t.element_size() for t in tensors)  # noqa: E731
    memory = tlm.adamw_memory_bytes(2, **SMALL)  # d_ff = 4 d_model by default
    assert memory == tlm.adamw_memory_bytes(2, **config)
    assert memory["parameters"] == nbytes(model.parameters())
    assert memory["gradients"] == nbytes(p.grad for p in model.parameters())
    assert memory["optimizer state"] == nbytes(
        t for state in opt.state.values() for t in state.values() if torch.is_tensor(t))
    half = tlm.adamw_memory_bytes(2, **config, dtype=torch.bfloat16)
    assert all(2 * half[k] == memory[k] for k in memory)


def test_adamw_activation_memory_counts_the_handouts_list():
    B, T, L, d, h, V, d_ff = 3, 12, 3, 32, 4, 97, 128
    per_layer = [(B, T, d), (B, T, d),  # the two RMSNorms
                 (B, T, d), (B, T, d), (B, T, d),  # Q, K, V projections
                 (B, h, T, T), (B, h, T, T),  # Q^T K, softmax
                 (B, T, d), (B, T, d),  # weighted sum of values, output projection
                 (B, T, d_ff), (B, T, d_ff), (B, T, d)]  # W1, SiLU, W2
    final = [(B, T, d), (B, T, V), (B, T, V)]  # final RMSNorm, logits, cross-entropy
    numbers = L * sum(math.prod(s) for s in per_layer) + sum(math.prod(s) for s in final)
    assert tlm.adamw_memory_bytes(B, **SMALL)["activations"] == 4 * numbers
    assert (tlm.adamw_memory_bytes(6, **SMALL)["activations"]
            == 2 * tlm.adamw_memory_bytes(3, **SMALL)["activations"])


def test_adamw_memory_bytes_bad_input():
    with pytest.raises(ValueError, match="batch_size"):
        tlm.adamw_memory_bytes(0, **SMALL)
    with pytest.raises((ValueError, TypeError), match="num_heads"):
        tlm.adamw_memory_bytes(1, **{**SMALL, "num_heads": 2.5})
    with pytest.raises((ValueError, TypeError), match="num_params"):
        tlm.adamw_step_flops(-3)


def test_adamw_step_flops_counts_the_elementwise_operations_of_algorithm_1():
    """One floating-point operation per element for each elementwise op of a step."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    n = 1001

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            Count.ops += any(isinstance(t, torch.Tensor) and t.numel() == n
                             for t in tree_flatten(out)[0])
            return out

    w = torch.nn.Parameter(torch.randn(n))
    opt = tlm.HandoutAdamW([w], lr=1e-2)
    for _ in range(2):  # the second step: m and v are tensors by then
        w.grad = torch.randn(n)
        Count.ops = 0
        with Count():
            opt.step()
    assert tlm.adamw_step_flops(n) == Count.ops * n == 14 * n


def _per_parameter_adamw_step(opt):
    """tlm.AdamW's update written one parameter at a time (the oracle of the foreach one)."""
    with torch.no_grad():
        for group in opt.param_groups:
            lr, (beta1, beta2) = group["lr"], group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = opt.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                p.mul_(1 - lr * group["weight_decay"])
                m.lerp_(p.grad, 1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(group["eps"])
                p.addcdiv_(m, denom, value=-lr / (1 - beta1**t))


def test_foreach_adamw_equals_the_per_parameter_update_with_groups_and_missing_grads():
    """Two groups (own lr, decay, betas); some parameters get no gradient on some steps,
    so their step counts differ; the state keeps its per-parameter layout."""
    a, b = _twin_models()
    c = tlm.TransformerLM(**a.config)
    c.load_state_dict(a.state_dict())

    def groups(model):
        params = list(model.parameters())
        return [dict(params=params[::2]), dict(params=params[1::2], lr=3e-3, weight_decay=0.0, betas=(0.8, 0.95))]
    opt_a = tlm.AdamW(groups(a), lr=1e-2, weight_decay=0.1)
    opt_b = tlm.AdamW(groups(b), lr=1e-2, weight_decay=0.1)  # stepped by the oracle
    opt_c = torch.optim.AdamW(groups(c), lr=1e-2, weight_decay=0.1, foreach=False)
    gen = torch.Generator().manual_seed(2)
    for i in range(12):
        ids = torch.randint(0, 40, (4, 9), generator=gen)
        for model, opt, step in ((a, opt_a, opt_a.step), (b, opt_b, lambda: _per_parameter_adamw_step(opt_b)),
                                 (c, opt_c, opt_c.step)):
            opt.zero_grad(set_to_none=True)
            tlm.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).backward()
            for k, p in enumerate(model.parameters()):
                if k % 3 == 0 and i % 2 == 0:
                    p.grad = None  # no gradient this step
            step()
    for p, q, r in zip(a.parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q)
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)
    steps = {opt_a.state[p]["step"] for p in a.parameters()}
    assert len(steps) > 1  # the parameters did not all step together
    for p, q in zip(a.parameters(), b.parameters()):
        assert set(opt_a.state[p]) == {"step", "exp_avg", "exp_avg_sq"} and isinstance(opt_a.state[p]["step"], int)
        assert opt_a.state[p]["step"] == opt_b.state[q]["step"]
    # a state dict of the per-parameter optimizer loads, and both go on alike
    opt_d = tlm.AdamW(groups(b), lr=1e-2, weight_decay=0.1)
    opt_d.load_state_dict(opt_b.state_dict())
    ids = torch.randint(0, 40, (4, 9), generator=gen)
    for model, step in ((a, opt_a.step), (b, opt_d.step)):
        model.zero_grad(set_to_none=True)
        tlm.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).backward()
        step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_adamw_equals_the_handout_algorithm_without_decay_and_eps():
    """With weight_decay 0 and eps 0 both compute p - lr sqrt(1 - b2^t) / (1 - b1^t) m / sqrt(v)."""
    torch.manual_seed(3)
    w0 = [torch.randn(5, 3), torch.randn(7)]
    ours = [w.clone().requires_grad_() for w in w0]
    theirs = [w.clone().requires_grad_() for w in w0]
    opt_a = tlm.AdamW(ours, lr=1e-2, eps=0.0, weight_decay=0.0)
    opt_b = tlm.HandoutAdamW(theirs, lr=1e-2, eps=0.0, weight_decay=0.0)
    for step in range(10):
        for ws, opt in ((ours, opt_a), (theirs, opt_b)):
            opt.zero_grad()
            sum(((w - 0.1 * step) ** 3).sum() for w in ws).backward()
            opt.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
