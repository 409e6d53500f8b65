"""FlashAttention-2 (tlm's Triton kernels): timed against sdpa on CUDA, or compiled anywhere.

Usage:
  python benchmarks/flash_attention.py [--leaderboard-only | --gpu-check] [--json PATH]
  python benchmarks/flash_attention.py --compile-only [--arch sm_90] [--json PATH]

On CUDA: forward, backward and forward + backward of the Triton Function against
F.scaled_dot_product_attention with its FlashAttention-2 backend (16-bit; float32 has
none, so the memory-efficient one) and against the book's attention (softmax(QK^T/sqrt d)V
in tensor operations, the handout's "regular PyTorch" attention, where its T x T weights
fit), causal, 16 heads folded into the batch (the Triton Function takes (batch, seq, d)).
First the Spring 2025 leaderboard's shape (16 heads of width 64, 16,384 positions,
bfloat16), as that harness times it: the Function under torch.compile, forward + backward
the mean of triton.testing.do_bench(warmup=1000, rep=10000) (the forward alone, like every
other time here, the median of do_bench(warmup=25, rep=100)); then the same eagerly, which
runs Triton's autotuner, and the settings it chose; then lengths 128 ... 65,536, widths
16 ... 128, bfloat16 and float32 (--gpu-check: one row, 4,096 positions of width 64 in
bfloat16). The last columns are sdpa's time
over flash's (above 1: flash is faster) and the largest difference of the outputs. The exit
status is 1 if an output differs from sdpa's by more than the dtype allows.

--compile-only needs no GPU: it compiles every kernel at every autotuner setting
(tlm.flash_triton.CONFIGS) for the given architecture, d in {64, 128}, 16-bit (bfloat16;
float16 for sm_75, which has no bfloat16) and float32, and prints what the compiler made:
loop kinds, loads issued ahead (async copies) and shared-memory buffers, registers, spilled
bytes, shared memory, tensor-core instructions, compile seconds. The exit status is 1 if a
16-bit kernel at sm_80 or later is not pipelined, spills, misses the tensor cores or does
not fit in shared memory.
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import tlm
from tlm import flash_triton as fa

LEADERBOARD = dict(heads=16, seq_len=16_384, d=64, dtype=torch.bfloat16)
# largest |output - sdpa's| allowed, relative to the output's largest entry
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-3}


def _sdpa_backends(dtype: torch.dtype):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if dtype == torch.float32:
        return "mem-efficient", sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION])
    return "flash", sdpa_kernel([SDPBackend.FLASH_ATTENTION])


# The leaderboard's do_bench, its mean returned. Its harness also differs in what it times:
# q, k, v unpacked from one leaf tensor, whose gradient accumulates across calls, and the
# gradient of o.sum(); here three leaves, their gradients reset, and a random gradient.
HARNESS = dict(warmup=1000, rep=10_000)


def _ms(fn, harness: bool = False) -> float:
    import triton.testing
    if harness:
        return triton.testing.do_bench(fn, **HARNESS)
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def bench(heads: int, seq_len: int, d: int, dtype: torch.dtype, compiled: bool = False,
          eager: bool = True, harness: tuple[str, ...] = (),
          timed: tuple[str, ...] = ("fwd", "bwd", "fwd+bwd")) -> dict:
    """ms of `timed` (forward, backward, both), for flash, sdpa and (eager) the book's
    attention, causal, on CUDA: medians, or for those in `harness` the leaderboard's
    do_bench; compiled: flash's apply under torch.compile."""
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(heads, seq_len, d, generator=g).to("cuda", dtype)
                     for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    apply = tlm.get_flashattention_autograd_function_triton().apply
    if compiled:
        apply = torch.compile(apply)
    backend, sdpa_context = _sdpa_backends(dtype)

    def sdpa(q, k, v, is_causal):
        with sdpa_context:  # (batch 1, heads, seq, d), as a model calls it
            return F.scaled_dot_product_attention(q[None], k[None], v[None],
                                                  is_causal=is_causal)[0]

    def book(q, k, v, is_causal):
        bias = torch.full((seq_len, seq_len), float("-inf"), device="cuda",
                          dtype=dtype).triu(1)
        return tlm.softmax((q @ k.transpose(-2, -1)) / math.sqrt(d) + bias, -1) @ v

    contenders = {"flash": apply, "sdpa": sdpa}
    free = torch.cuda.mem_get_info()[0]
    if eager and 6 * heads * seq_len**2 * 4 < 0.8 * free:  # its T x T tensors fit
        contenders["book"] = book
    row = dict(heads=heads, seq_len=seq_len, d=d, dtype=str(dtype).removeprefix("torch."),
               sdpa_backend=backend, compiled=compiled)
    outs = {}
    for name, fn in contenders.items():
        out = fn(q, k, v, True)
        q.grad = k.grad = v.grad = None
        out.backward(grad, retain_graph=True)  # the first: the autotuner's, for flash
        outs[name] = [t.detach().float() for t in (out, q.grad, k.grad, v.grad)]

        def forward_backward(fn=fn):
            q.grad = k.grad = v.grad = None
            fn(q, k, v, True).backward(grad)

        def backward(out=out):
            q.grad = k.grad = v.grad = None
            out.backward(grad, retain_graph=True)
        runs = {"fwd": lambda fn=fn: fn(q, k, v, True), "bwd": backward,
                "fwd+bwd": forward_backward}
        for what in timed:
            row[f"{name} {what}"] = _ms(runs[what], what in harness)
        del out
    row["max diff"] = max((a - b).abs().max().item() / b.abs().max().item()  # O, dQ, dK, dV
                          for a, b in zip(outs["flash"], outs["sdpa"]))
    row["agrees"] = row["max diff"] <= TOLERANCE[dtype]
    for what in timed:
        row[f"sdpa/flash {what}"] = row[f"sdpa {what}"] / row[f"flash {what}"]
    return row


def _print_row(row: dict) -> None:
    times = " ".join(f"{row.get(n + ' ' + c, math.nan):8.2f}" for n in ("flash", "sdpa", "book")
                     for c in ("fwd", "bwd", "fwd+bwd"))
    print(f"{row['seq_len']:6d} {row['d']:4d} {row['dtype']:8s} {times} "
          f"{row['sdpa/flash fwd+bwd']:6.2f} {row['max diff']:8.1e}", flush=True)


def timed(args) -> int:
    if not torch.cuda.is_available():
        print("needs CUDA: this machine has no CUDA device (nothing measured; "
              "--compile-only works without one)")
        return 2
    if (reason := tlm.triton_unavailable_reason("cuda")) is not None:
        print(f"benchmarks/flash_attention.py: {reason}")
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{fa.triton.__version__}; causal, 16 heads folded into the batch; median ms of "
          "do_bench (the leaderboard's fwd+bwd: the mean of its own do_bench); sdpa: its "
          "flash backend (float32: mem-efficient); book: softmax(QK^T/sqrt d)V")
    rows, start = [], time.perf_counter()
    timed = ("fwd", "fwd+bwd")
    try:
        lb = bench(**LEADERBOARD, compiled=True, eager=False, harness=("fwd+bwd",),
                   timed=timed)
        how = "torch.compile(apply)"
    except Exception as e:  # say why, and time the Function as it is
        print(f"torch.compile(apply) failed: {type(e).__name__}: "
              f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}")
        lb = bench(**LEADERBOARD, eager=False, harness=("fwd+bwd",), timed=timed)
        how = "apply, eager"
    rows.append(lb)
    print(leaderboard_line(lb, how), flush=True)
    eager = bench(**LEADERBOARD, eager=False, timed=("fwd+bwd",))  # the autotuner runs
    rows.append(eager)
    print(f"eager apply: flash fwd+bwd {eager['flash fwd+bwd']:.2f} ms, sdpa "
          f"{eager['sdpa fwd+bwd']:.2f} ms (medians)", flush=True)
    print("autotuner's choices at 16 x 16,384 x 64, bf16, causal, in the eager run "
          "(Inductor tunes the compiled one apart) (B_q, B_k, warps, stages): " + ", ".join(f"{name} {_setting(fa._KERNELS[name])}"
                                   for name in fa.KERNELS), flush=True)
    if not args.leaderboard_only:
        print(f"{'T':>6s} {'d':>4s} {'dtype':8s} " + " ".join(
            f"{n + ' ' + c:>8s}"[-8:] for n in ("flash", "sdpa", "book")
            for c in ("fwd", "bwd", "fwd+bwd")) + f" {'sdpa/fl':>6s} {'max diff':>8s}")
        sweep = [(seq_len, d, dtype) for dtype in (torch.bfloat16, torch.float32)
                 for d in (16, 32, 64, 128) for seq_len in (2**p for p in range(7, 17))]
        if args.gpu_check:  # what make gpu-check has time for: no new compiles
            sweep = [(4096, 64, torch.bfloat16)]
        for seq_len, d, dtype in sweep:
            row = bench(LEADERBOARD["heads"], seq_len, d, dtype)
            rows.append(row)
            _print_row(row)
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(row["agrees"] for row in rows) else 1


def leaderboard_line(row: dict, how: str) -> str:
    """The leaderboard row as one line (benchmarks/gpu_check.py reads it)."""
    return (f"leaderboard: flash fwd {row['flash fwd']:.2f} ms, sdpa {row['sdpa fwd']:.2f} "
            f"ms, sdpa/flash {row['sdpa/flash fwd']:.3f}; fwd+bwd {row['flash fwd+bwd']:.2f}"
            f" ms, sdpa {row['sdpa fwd+bwd']:.2f} ms, sdpa/flash "
            f"{row['sdpa/flash fwd+bwd']:.3f} ({how}, 16 x 16,384 x 64, bf16, causal; "
            "fwd+bwd the mean of do_bench(warmup=1000, rep=10000), fwd a median); outputs "
            f"agree: {row['agrees']}")


def _setting(kernel) -> str:
    """The setting the autotuner chose last, as (B_q, B_k, num_warps, num_stages)."""
    c = getattr(kernel, "best_config", None)
    if c is None:
        return "none (no launch was autotuned: before Ampere every launch runs FALLBACK)"
    return str((c.kwargs["BQ"], c.kwargs["BK"], c.num_warps, c.num_stages))


def compile_only(args) -> int:
    if (reason := fa.flash_compile_unavailable_reason()) is not None:
        print(f"cannot compile for CUDA here: {reason}")
        return 2
    capability = int(args.arch.removeprefix("sm_"))
    half = "float16" if capability < 80 else "bfloat16"
    cases = [dict(arch=args.arch, dtype=dtype, d=d, kernel=kernel, config=config,
                  **({"precision": "ieee"} if dtype == "float32" and capability < 80
                     else {}))
             for dtype in (half, "float32") for d in (64, 128) for kernel in fa.KERNELS
             for config in fa.flash_configs(kernel, 8 * getattr(torch, dtype).itemsize, d)]
    start = time.perf_counter()
    report = fa.compile_flash_kernels(cases)
    limit = fa.SHARED_MEMORY[capability]
    print(f"triton {fa.triton.__version__}, {args.arch} (shared memory {limit // 1024} KB "
          f"a program), the launch at the Spring 2025 leaderboard's shape; spill: bytes "
          "of stack per thread")
    print(f"{'kernel':8s} {'dtype':8s} {'d':>3s} {'(B_q, B_k, warps, stages)':26s} "
          f"{'loops':12s} {'async':>5s} {'bufs':>4s} {'regs':>4s} {'spill':>5s} "
          f"{'smem KB':>7s} {'fits':>4s} {'tensor cores':12s} {'s':>5s}")
    failures = []
    for r in report:
        fits = r["shared"] <= limit
        cores = r["tensor_cores"]
        if r["dtype"] == "float32":
            cores += f" ({r['precision']})"
        print(f"{r['kernel']:8s} {r['dtype']:8s} {r['d']:3d} {str(tuple(r['config'])):26s} "
              f"{','.join(r['loops']):12s} {r['async_copies']:5d} {r['buffers']:4d} "
              f"{r['registers']:4d} {r['spill']:5d} {r['shared'] / 1024:7.1f} "
              f"{'yes' if fits else 'NO':>4s} {cores:15s} {r['seconds']:5.1f}")
        if r["dtype"] != "float32" and capability >= 80 and not (
                set(r["loops"]) == {"for"} and r["async_copies"] > 0 and r["spill"] == 0
                and r["tensor_cores"] != "none" and fits):
            failures.append(r)
    sixteen = [r for r in report if r["dtype"] != "float32"]
    print(f"16-bit: every loop a pipelined scf.for: "
          f"{all(set(r['loops']) == {'for'} and r['async_copies'] > 0 for r in sixteen)}; "
          f"no spills: {all(r['spill'] == 0 for r in sixteen)}; tensor cores: "
          f"{all(r['tensor_cores'] != 'none' for r in sixteen)}; fit in shared memory: "
          f"{all(r['shared'] <= limit for r in sixteen)}")
    print(f"{len(report)} kernels compiled in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaderboard-only", action="store_true")
    parser.add_argument("--gpu-check", action="store_true",
                        help="one row after the leaderboard's (make gpu-check)")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--arch", default="sm_90", choices=["sm_75", "sm_80", "sm_90"])
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    return compile_only(args) if args.compile_only else timed(args)


if __name__ == "__main__":
    sys.exit(main())
