"""The GPU table: training steps of tlm and Hugging Face, eager and compiled; decoding.

Usage: python benchmarks/gpu.py [--repeats 10] [--check-steps 8] [--batch-size 16]
Needs CUDA: without it the script prints "needs CUDA" and exits with status 2 (nothing
was measured). Meant to take under 3 minutes on one H100, most of it compiling.

Shape: GPT-2-small (vocabulary 50,304, context 1,024, d_model 768, 12 layers, 12 heads,
d_ff 2,048), batch 16 x 1,024, bfloat16 autocast over float32 weights, sdpa attention.
Contenders, from the same initial weights (HF: LlamaForCausalLM via tlm.to_hf_llama):
tlm and HF, eager and torch.compile'd, with torch.optim.AdamW(fused=True); tlm eager
with tlm.AdamW and tlm.gradient_clipping (what `tlm train` runs). For each: median step
time, tokens/s, MFU (matmul FLOPs of tlm.accounting, 3 x forward, over the peak of
tlm.peak_flops), and the peak memory of a step above what was allocated before it.
Before timing, each contender takes --check-steps steps on one repeated batch (which
can be learnt, unlike fresh random ones) with its eager twin: the gradients of the
first step (cosine similarity, every tensor) must agree with eager's, and the loss after
the last step must agree to 5% of what the twin's fell, so that a fast but wrong step
cannot hide (torch 2.11 compiles tlm's softmax and RMSNorm into wrong gradients); HF's
first loss must equal tlm's (the same weights). The exit status is 1 if one does not. Then benchmarks/decode.py's decoding table, at the same shape in
bfloat16.
"""

import argparse
import copy
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import tlm
from decode import SHAPES, measure

NEEDS_CUDA = 2  # the exit status without CUDA


def contenders(base: tlm.TransformerLM, fused_lr: float):
    """{name: (eager twin's name, model, forward, optimizer, clip or None)}."""
    def tlm_model():
        return copy.deepcopy(base)

    def hf_model():
        hf = tlm.to_hf_llama(base, "sdpa").to(next(base.parameters()).device).train()
        hf.config.use_cache = False  # training: no key/value cache to build
        return hf

    def fused(model):
        return torch.optim.AdamW(model.parameters(), lr=fused_lr, fused=True)
    out = {}
    for name, make, compiled in (("tlm eager", tlm_model, False),
                                 ("HF eager", hf_model, False),
                                 ("tlm compiled", tlm_model, True),
                                 ("HF compiled", hf_model, True)):
        model = make()
        forward = torch.compile(model) if compiled else model
        out[name] = (name.split()[0] + " eager", model, forward, fused(model), None)
    model = tlm_model()
    out["tlm eager, tlm.AdamW + clipping"] = (
        "tlm eager", model, model, tlm.AdamW(model.parameters(), lr=fused_lr),
        lambda m=model: tlm.gradient_clipping(m.parameters(), 1.0))
    return out


def make_step(model, forward, optimizer, clip, batch):
    x, y = batch[:, :-1], batch[:, 1:]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = forward(x)
            logits = getattr(logits, "logits", logits)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            clip()
        optimizer.step()
        return loss.detach()
    return step


def first_grads(model, forward, batch) -> tuple[list[torch.Tensor], float]:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = forward(batch[:, :-1])
        logits = getattr(logits, "logits", logits)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad.detach().flatten().float().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads, float(loss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--check-steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--no-decode", action="store_true")
    args = parser.parse_args()
    if args.check_steps < 1:
        parser.error(f"--check-steps must be at least 1, got {args.check_steps}")
    sys.stdout.reconfigure(line_buffering=True)  # each line out at once, if killed
    if not torch.cuda.is_available():
        print("needs CUDA: this machine has no CUDA device (nothing measured)")
        return NEEDS_CUDA
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    start = time.perf_counter()
    config = SHAPES["cuda"]
    torch.manual_seed(0)
    base = tlm.TransformerLM(**config, device=device,
                             attn_implementation="sdpa").train()
    gen = torch.Generator(device=device).manual_seed(0)
    batches = [torch.randint(0, config["vocab_size"], (args.batch_size, 1025),
                             device=device, generator=gen)] * args.check_steps
    runs = contenders(base, args.lr)
    # the check: the first gradients and the loss after check_steps, against eager
    grads, first, losses, verdicts = {}, {}, {}, {}
    for name, (twin, model, forward, opt, clip) in runs.items():
        grads[name], first[name] = first_grads(model, forward, batches[0])
        for batch in batches:
            loss = make_step(model, forward, opt, clip, batch)()
        losses[name] = float(loss)
        print(f"{name}: checked, {time.perf_counter() - start:.0f} s")
    for name, (twin, *_ ) in runs.items():
        cos = min(F.cosine_similarity(a, b, dim=0).item()
                  for a, b in zip(grads[name], grads[twin]))
        drop = first[twin] - losses[twin]  # what the twin learnt
        ok = (cos > 0.99 and drop > 0.1
              and abs(losses[name] - losses[twin]) < 0.05 * drop)
        if name.startswith("HF"):
            ok = ok and abs(first[name] - first["tlm eager"]) < 1e-2
        verdicts[name] = (ok, cos)
    # the timing: every contender on the last batch, in turns
    steps = {name: make_step(model, fwd, opt, clip, batches[-1])
             for name, (_, model, fwd, opt, clip) in runs.items()}
    times = tlm.time_alternating(steps, repeats=args.repeats, warmup=2, device=device)
    peaks = {}
    for name, step in steps.items():
        runs[name][3].zero_grad(set_to_none=True)  # the step frees the last gradients
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() - before
    tokens = args.batch_size * 1024
    flops = 3 * tlm.forward_flops(**config, batch_size=args.batch_size)
    peak = tlm.peak_flops(device)
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
          f"batch {args.batch_size} x 1,024, GPT-2-small shape, bf16 autocast, sdpa; "
          f"median of {args.repeats} steps in turns"
          + (f"; MFU of {peak / 1e12:.0f} TFLOP/s" if peak else ""))
    print(f"{'':34s} {'step':>9s} {'tokens/s':>10s} {'MFU':>6s} {'peak mem':>9s} "
          f"{'first loss':>10s} {'after ' + str(args.check_steps):>9s} {'grad cos':>9s}"
          "  agrees")
    for name, t in times.items():
        s = statistics.median(t)
        mfu = f"{flops / s / peak:6.1%}" if peak else f"{'-':>6s}"
        ok, cos = verdicts[name]
        print(f"{name:34s} {1e3 * s:6.1f} ms {tokens / s:10,.0f} {mfu} "
              f"{peaks[name] / 2**30:5.1f} GiB {first[name]:10.4f} {losses[name]:9.4f} "
              f"{cos:9.4f}  "
              f"{'yes' if ok else 'NO'}")
    del runs, steps, grads
    torch.cuda.empty_cache()
    if not args.no_decode:
        print()
        print("\n".join(measure(device, repeats=3, new_tokens=256)))
    print(f"total {time.perf_counter() - start:.0f} s")
    return 0 if all(ok for ok, _ in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
