"""Greedy generation of 300 tokens with and without the KV cache, same model, same process.

Usage: python benchmarks/generation.py [--repeats N]
Prints the median wall time of each variant (runs alternate) and their ratio.
"""

import argparse
import statistics

import torch

import tlm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=300)
    args = parser.parse_args()
    device = tlm.get_device()
    torch.manual_seed(0)
    model = tlm.TransformerLM(vocab_size=1000, context_length=512, d_model=128, num_layers=4, num_heads=4,
                              d_ff=352, rope_theta=10_000.0, device=device).eval()
    prompt = torch.randint(0, 1000, (1, 12), device=device)
    outputs = {}

    def run(name: str):
        return lambda: outputs.__setitem__(name, tlm.generate(model, prompt, args.new_tokens, temperature=0,
                                                              use_cache=name == "cache"))

    # alternating turns, so drift affects both alike
    times = tlm.time_alternating({"cache": run("cache"), "recompute": run("recompute")}, repeats=args.repeats, warmup=0, device=device)
    assert torch.equal(outputs["cache"], outputs["recompute"]), "cached and uncached greedy outputs differ"
    cached, uncached = statistics.median(times["cache"]), statistics.median(times["recompute"])
    print(f"device: {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'variant':24s} {'median s':>9s}  {'ms/token':>9s}")
    print(f"{'with KV cache':24s} {cached:9.3f}  {1e3 * cached / args.new_tokens:9.2f}")
    print(f"{'recompute the prefix':24s} {uncached:9.3f}  {1e3 * uncached / args.new_tokens:9.2f}")
    print(f"ratio cached / recompute: {cached / uncached:.3f}  ({args.new_tokens} greedy tokens, {args.repeats} runs each)")


if __name__ == "__main__":
    main()
