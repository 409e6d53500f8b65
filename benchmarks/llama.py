"""tlm against Hugging Face LlamaForCausalLM (eager and sdpa attention): training step and inference.

Usage: python benchmarks/llama.py [--repeats N] [--tf32] [--d-model 256 --layers 4 --heads 8 --d-ff 704 ...]
Same weights, same token ids, same loss (F.cross_entropy) for every contender; they run in turns in
one process. Prints median milliseconds and the ratios tlm eager / HF eager and tlm sdpa / HF sdpa.
"""

import argparse
import statistics

import torch

import tlm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-ff", type=int, default=704)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tf32", action="store_true", help="allow TF32 matrix products (CUDA, Ampere or newer)")
    args = parser.parse_args()
    device = tlm.get_device()
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    config = dict(vocab_size=args.vocab, context_length=args.context, d_model=args.d_model, num_layers=args.layers,
                  num_heads=args.heads, d_ff=args.d_ff, rope_theta=10_000.0)
    ours = tlm.TransformerLM(**config, device=device)
    ours_sdpa = tlm.TransformerLM(**config, device=device, attn_implementation="sdpa")
    ours_sdpa.load_state_dict(ours.state_dict())
    models = {"tlm eager": ours, "HF eager": tlm.to_hf_llama(ours, "eager").train(),
              "tlm sdpa": ours_sdpa, "HF sdpa": tlm.to_hf_llama(ours, "sdpa").train()}
    batch = torch.randint(0, args.vocab, (args.batch, args.context + 1), device=device)
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads; {config}, batch {args.batch}, "
          f"float32{' + TF32' if args.tf32 else ''}; medians of {args.repeats} alternating runs")
    for label, make in (("training step (forward + backward)", tlm.training_step),
                        ("inference (forward, no grad)", lambda m, b: tlm.inference_step(m, b[:, :-1]))):
        times = tlm.time_alternating({name: make(m, batch) for name, m in models.items()},
                                     repeats=args.repeats, device=device)
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"\n{label}")
        print(f"{'model':10s} {'median ms':>10s}")
        for name in models:
            print(f"{name:10s} {1e3 * med[name]:10.1f}")
        for ours_name, ref_name in (("tlm eager", "HF eager"), ("tlm sdpa", "HF sdpa")):
            paired = statistics.median(a / b for a, b in zip(times[ours_name], times[ref_name]))
            print(f"{ours_name} / {ref_name}: {med[ours_name] / med[ref_name]:.3f}  (median of per-round ratios {paired:.3f})")


if __name__ == "__main__":
    main()
