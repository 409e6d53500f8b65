"""FlashAttention-2 (tlm's Triton kernels) against F.scaled_dot_product_attention on CUDA.

Usage: python benchmarks/flash_attention.py [--leaderboard-only] [--repeats 20]
Times forward, and forward + backward, at CS336's leaderboard shape (batch 1, 16 heads of width
64, 16,384 positions, causal, bfloat16; the heads folded into the batch, as the Triton Function
takes (batch, seq, d)) and over a sweep of lengths and widths in bfloat16 and float32: medians
of alternating rounds, in milliseconds, and the largest difference of the outputs. Needs CUDA
and triton (`pip install -e ".[flash]"`); `bench(...)` is importable for a notebook.
"""

import argparse
import statistics

import torch
import torch.nn.functional as F

import tlm

LEADERBOARD = dict(batch=1, heads=16, seq_len=16_384, d=64, dtype=torch.bfloat16,
                   is_causal=True)


def bench(batch: int, heads: int, seq_len: int, d: int, dtype: torch.dtype,
          is_causal: bool = True, repeats: int = 20) -> dict:
    """Median ms of forward and of forward + backward, flash and sdpa, on CUDA."""
    flash = tlm.get_flashattention_autograd_function_triton()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch * heads, seq_len, d, generator=g).to("cuda", dtype)
               .requires_grad_() for _ in range(3))
    grad = torch.randn(batch * heads, seq_len, d, generator=g).to("cuda", dtype)

    def fwd_flash():
        return flash.apply(q, k, v, is_causal)

    def fwd_sdpa():  # (batch, heads, seq, d), as a model calls it
        shaped = (t.view(batch, heads, seq_len, d) for t in (q, k, v))
        return F.scaled_dot_product_attention(*shaped, is_causal=is_causal).view_as(q)

    def both(fwd):
        def step():
            q.grad = k.grad = v.grad = None
            fwd().backward(grad)
        return step

    with torch.no_grad():
        diff = (fwd_flash().float() - fwd_sdpa().float()).abs().max().item()
    times = tlm.time_alternating({"flash fwd": fwd_flash, "sdpa fwd": fwd_sdpa,
                                  "flash fwd+bwd": both(fwd_flash),
                                  "sdpa fwd+bwd": both(fwd_sdpa)},
                                 repeats=repeats, warmup=3, device="cuda")
    ms = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    return dict(batch=batch, heads=heads, seq_len=seq_len, d=d, dtype=str(dtype),
                is_causal=is_causal, max_abs_diff=diff, **ms)


def _print(row: dict) -> None:
    print(f"{row['seq_len']:6d} {row['d']:4d} {row['dtype']:15s} "
          f"{row['flash fwd']:9.3f} {row['sdpa fwd']:9.3f} "
          f"{row['flash fwd+bwd']:13.3f} {row['sdpa fwd+bwd']:12.3f} "
          f"{row['max_abs_diff']:9.1e}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaderboard-only", action="store_true")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/flash_attention.py: needs CUDA (on a CPU, Triton's "
                         "interpreter times numpy, not the kernels)")
    reason = tlm.triton_unavailable_reason("cuda")
    if reason is not None:
        raise SystemExit(f"benchmarks/flash_attention.py: {reason}")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; causal; medians of "
          f"{args.repeats} alternating rounds, ms")
    print(f"{'T':>6s} {'d':>4s} {'dtype':15s} {'flash fwd':>9s} {'sdpa fwd':>9s} "
          f"{'flash fwd+bwd':>13s} {'sdpa fwd+bwd':>12s} {'max diff':>9s}")
    _print(bench(**LEADERBOARD, repeats=args.repeats))
    if args.leaderboard_only:
        return
    for dtype in (torch.bfloat16, torch.float32):
        for d in (16, 32, 64, 128):
            for seq_len in (128, 512, 2048, 8192):
                _print(bench(1, 16, seq_len, d, dtype, repeats=args.repeats))


if __name__ == "__main__":
    main()
