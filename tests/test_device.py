"""The same model on a GPU and on the CPU: logits, loss, gradients and greedy tokens.

Skipped where CUDA is absent (CI has no GPU); run on a GPU machine with the rest of the tests.
The model is built on the CPU and copied, so both devices start from the same weights; what
remains is the GPU's own rounding (other kernels, other orders of summation), in float32 with
TF32 off. Measured on an H100 (torch 2.11): logits within 5e-7 and every gradient within 1e-6,
relative; the tolerance below leaves a factor of 10.
"""

import copy

import pytest
import torch

import tlm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CONFIG = dict(vocab_size=10_000, context_length=16, d_model=64, num_layers=3, num_heads=4,
              d_ff=128, rope_theta=10_000.0)  # the contract's reference sizes
TOLERANCE = 1e-5  # ||cuda - cpu|| / ||cpu||, float32


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.detach().cpu() - b.detach().cpu()).norm() / b.detach().cpu().norm()).item()


def _models():
    torch.manual_seed(0)
    yield "TransformerLM eager", tlm.TransformerLM(**CONFIG)
    yield "TransformerLM sdpa", tlm.TransformerLM(**CONFIG, attn_implementation="sdpa")
    yield "HandoutTransformerLM", tlm.HandoutTransformerLM(**CONFIG)


@pytest.fixture(autouse=True)
def _no_tf32():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("name", [name for name, _ in _models()])
def test_logits_loss_and_gradients_on_cuda_equal_the_cpu(name):
    cpu = dict(_models())[name]
    gpu = copy.deepcopy(cpu).cuda()
    ids = torch.randint(0, CONFIG["vocab_size"], (4, 17),
                        generator=torch.Generator().manual_seed(1))
    results = {}
    for device, model in (("cpu", cpu), ("cuda", gpu)):
        x = ids.to(device)
        logits = model(x[:, :-1])
        loss = tlm.cross_entropy(logits, x[:, 1:])
        loss.backward()
        results[device] = (logits, loss, {n: p.grad for n, p in model.named_parameters()})
    (l_cpu, loss_cpu, g_cpu), (l_gpu, loss_gpu, g_gpu) = results["cpu"], results["cuda"]
    assert _relative(l_gpu, l_cpu) < TOLERANCE
    assert abs(loss_gpu.item() - loss_cpu.item()) < TOLERANCE * loss_cpu.item()
    worst = max(g_cpu, key=lambda n: _relative(g_gpu[n], g_cpu[n]))
    assert _relative(g_gpu[worst], g_cpu[worst]) < TOLERANCE, worst


def test_greedy_tokens_on_cuda_equal_the_cpu():
    torch.manual_seed(0)
    cpu = tlm.TransformerLM(**CONFIG)
    gpu = copy.deepcopy(cpu).cuda()
    prompt = torch.randint(0, CONFIG["vocab_size"], (2, 5),
                           generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = tlm.generate(cpu, prompt, 12, temperature=0)
        b = tlm.generate(gpu, prompt.cuda(), 12, temperature=0)
    assert torch.equal(a, b.cpu())
