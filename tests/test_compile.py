"""Compiled equals eager: output and every gradient of each component, the model and the loss.

torch 2.11's `torch.compile` routed the gradient of a hand-written `autograd.Function` to the
wrong output when `forward` returned a tensor it had changed in place or passed through a
`.to()` with nothing to convert (PyTorch issue 180642): `tlm.softmax`'s input gradient came back
all zeros. The fault is in the graph capture (Dynamo and AOTAutograd), so the components are
compiled with `backend="aot_eager"`, which runs that capture without generating kernels and
takes about a second; the model and the loss are also compiled with Inductor, as `tlm train
--compile` does. Each case runs in float32 and under bfloat16 autocast, on every torch the project tests.
"""

import pytest
import torch

import tlm

D, HEADS, T = 32, 4, 12
# Largest relative error ||compiled - eager|| / ||eager|| allowed, for the output and for every
# gradient. Measured on torch 2.13 and 2.11 with these seeds: float32 at most 5e-6 (aot_eager)
# and 8e-7 (Inductor); bfloat16 autocast at most 7e-3 (aot_eager) and 1e-2 (Inductor), where a
# cast placed or a sum ordered differently moves a rounding of 2**-8. The fault these tests
# guard against gave errors of order 1 (a gradient of zeros is an error of exactly 1).
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}
MODES = ["float32", "bfloat16"]


def _softmax():
    return lambda x: tlm.softmax(x * 3, -1), torch.randn(2, HEADS, T, T)


def _rmsnorm():
    norm = tlm.RMSNorm(D)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    return norm, torch.randn(2, T, D) * 3 + 1


def _rope():
    rope = tlm.RotaryPositionalEmbedding(10_000.0, D // HEADS, T)
    positions = torch.arange(T)
    return lambda x: rope(x, positions), torch.randn(2, HEADS, T, D // HEADS)


def _swiglu():
    return tlm.SwiGLU(D, 64), torch.randn(2, T, D)


def _attention(impl):
    return lambda: (tlm.MultiHeadSelfAttention(D, HEADS, T, 10_000.0,
                                               attn_implementation=impl),
                    torch.randn(2, T, D))


COMPONENTS = {"softmax": _softmax, "RMSNorm": _rmsnorm, "RoPE": _rope, "SwiGLU": _swiglu,
              "attention, eager": _attention("eager"), "attention, sdpa": _attention("sdpa")}


def _run(fn, params, x, mode):
    """fn's output on x and the gradients of x and of params, for a fixed upstream gradient."""
    for p in params:
        p.grad = None
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bfloat16"):
        y = fn(x)
    upstream = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
    (y.float() * upstream).sum().backward()
    return [y.detach().float(), x.grad.float()] + [p.grad.float() for p in params]


def _relative_errors(eager, compiled):
    return [((c - e).norm() / e.norm().clamp_min(1e-30)).item()
            for e, c in zip(eager, compiled, strict=True)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(COMPONENTS))
def test_component_compiled_equals_eager(name, mode):
    torch._dynamo.reset()
    torch.manual_seed(0)
    fn, x = COMPONENTS[name]()
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    eager = _run(fn, params, x, mode)
    compiled = _run(torch.compile(fn, backend="aot_eager"), params, x, mode)
    assert all(g.abs().max() > 0 for g in eager[1:])  # every gradient is a real test
    errors = _relative_errors(eager, compiled)
    assert max(errors) < TOLERANCE[mode], errors


def _model_and_loss():
    model = tlm.TransformerLM(vocab_size=64, context_length=T, d_model=D, num_layers=2,
                              num_heads=HEADS, d_ff=64, rope_theta=10_000.0,
                              attn_implementation="sdpa")
    ids = torch.randint(0, 64, (3, T + 1), generator=torch.Generator().manual_seed(1))

    def loss(embedded):  # the loss as a function of the embeddings, so x has a gradient
        x = embedded
        for block in model.layers:
            x = block(x)
        return tlm.cross_entropy(model.lm_head(model.ln_final(x)), ids[:, 1:])

    return model, loss, model.token_embeddings(ids[:, :-1]).detach()


# Inductor in float32 is tests/test_performance.py's fullgraph test (both attentions)
@pytest.mark.parametrize("backend, mode", [("aot_eager", "float32"), ("aot_eager", "bfloat16"),
                                           ("inductor", "bfloat16")])
def test_model_and_loss_compiled_equal_eager(backend, mode):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, loss, x = _model_and_loss()
    params = [p for name, p in model.named_parameters() if "token_embeddings" not in name]
    eager = _run(loss, params, x, mode)
    compiled = _run(torch.compile(loss, backend=backend), params, x, mode)
    assert all(g.abs().max() > 0 for g in eager[1:])
    errors = _relative_errors(eager, compiled)
    assert max(errors) < TOLERANCE[mode], errors
