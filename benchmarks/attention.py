"""Causal attention, forward + backward: the book's attention (eager) against F.scaled_dot_product_attention.

Usage: python benchmarks/attention.py [--seq-lens 128 256 512 1024 2048] [--batch 1] [--heads 8] [--d-k 32]
Prints median time, the bytes saved for the backward pass and, on CUDA, the peak memory per sequence length.
"""

import argparse

import torch

import tlm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-k", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    device = tlm.get_device()
    torch.manual_seed(0)
    rows = tlm.attention_sweep(args.seq_lens, batch=args.batch, heads=args.heads, d_k=args.d_k,
                               repeats=args.repeats, device=device)
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads; batch {args.batch}, "
          f"{args.heads} heads, d_k {args.d_k}, float32, causal; medians of {args.repeats} alternating runs")
    cuda = device.type == "cuda"
    print(f"{'T':>6s} {'eager ms':>9s} {'sdpa ms':>9s} {'eager MiB saved':>16s} {'sdpa MiB saved':>15s}"
          + (f" {'eager peak MiB':>15s} {'sdpa peak MiB':>14s}" if cuda else ""))
    by = {(r["seq_len"], r["impl"]): r for r in rows}
    for T in args.seq_lens:
        e, s = by[T, "eager"], by[T, "sdpa"]
        line = (f"{T:6d} {1e3 * e['median_s']:9.2f} {1e3 * s['median_s']:9.2f} "
                f"{e['saved_bytes'] / 2**20:16.2f} {s['saved_bytes'] / 2**20:15.2f}")
        if cuda:
            line += f" {e['peak_bytes'] / 2**20:15.1f} {s['peak_bytes'] / 2**20:14.1f}"
        print(line)


if __name__ == "__main__":
    main()
