"""What each change buys for a whole training step: the handout's model, tlm eager, tlm sdpa, compiled.

Usage: python benchmarks/whole_model.py [--repeats N] [--no-compile] [--d-model 256 --layers 4 --heads 8 ...]
Same weights, same token ids, same loss (F.cross_entropy) for every contender; they run in turns in one
process (the performance chapter's last comparison, with more rounds, and compiled eager too). Each compiled
model's first call compiles forward and backward in an empty Inductor cache; that time is printed apart.
"""

import argparse
import statistics
import time

import torch
from torch._inductor.utils import fresh_inductor_cache

import tlm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-ff", type=int, default=704)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled models")
    args = parser.parse_args()
    device = tlm.get_device()
    torch.manual_seed(0)
    config = dict(vocab_size=args.vocab, context_length=args.context, d_model=args.d_model,
                  num_layers=args.layers, num_heads=args.heads, d_ff=args.d_ff, rope_theta=10_000.0)
    eager = tlm.TransformerLM(**config, device=device)
    sdpa = tlm.TransformerLM(**config, device=device, attn_implementation="sdpa")
    handout = tlm.HandoutTransformerLM(**config, device=device)
    for model in (sdpa, handout):
        model.load_state_dict(eager.state_dict())
    models = {"handout model": handout, "tlm eager": eager, "tlm sdpa": sdpa}
    if not args.no_compile:
        models |= {"tlm eager, compiled": torch.compile(eager),
                   "tlm sdpa, compiled": torch.compile(sdpa)}
    ids = torch.randint(0, args.vocab, (args.batch, args.context + 1)).to(device)
    steps = {name: tlm.training_step(m, ids) for name, m in models.items()}
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads; {config}, "
          f"batch {args.batch}, float32; medians of {args.repeats} rounds taken in turns")
    for name, step in steps.items():
        if name.endswith("compiled"):
            with fresh_inductor_cache():
                start = time.perf_counter()
                step().item()  # .item() waits for the device
                print(f"{name}: first call (compiles forward and backward) {time.perf_counter() - start:.1f} s")
    losses = {name: step().item() for name, step in steps.items()}
    spread = max(losses.values()) - min(losses.values())
    print(f"losses: {min(losses.values()):.4f} to {max(losses.values()):.4f}, the same within 1e-4: {spread < 1e-4}")
    times = tlm.time_alternating(steps, repeats=args.repeats, warmup=1, device=device)
    print(f"\n{'model':20s} {'median ms':>10s} {'/ handout':>10s} {'(per-round)':>12s}")
    for row in tlm.summarize(times, baseline="handout model"):
        print(f"{row['name']:20s} {row['median_ms']:10.1f} {row['ratio']:10.3f} {row['paired_ratio']:12.3f}")


if __name__ == "__main__":
    main()
