"""Decoding speed: tokens/s of tlm.generate (plain, eager, compiled) against HF.

Usage: python benchmarks/decode.py [--device cpu|cuda] [--repeats 5] [--new-tokens 256]
One prompt of 16 ids, greedy, batch 1. The shape is chosen by the device:
- cpu: GPT-2-small's depth at width 64 (vocabulary 50,304, context 1,024, d_model 64,
  12 layers, 4 heads, d_ff 192), float32: the arithmetic is nearly free, so the time per
  token is the overhead of the loop (Python, dispatch) that a GPU at batch 1 also pays;
- cuda: the GPT-2-small shape (d_model 768, 12 layers, 12 heads, d_ff 2,048), bfloat16
  weights, sdpa attention.
HF is LlamaForCausalLM with the same weights (tlm.to_hf_llama), `generate` with
do_sample=False and no end token. The contenders take turns (tlm.time_alternating) in
one process, after a warm-up round (the first compiled call, timed apart, compiles); the
script prints median tokens/s, each contender's time relative to HF's (ratio of medians,
and median of the per-round ratios), the compile time, whether the tokens equal the
plain loop's, and the largest shortfall of a chosen token's logit below the best one when
the model reads the same ids in one pass: 0 for exact greedy decoding; in bfloat16 two
logits can tie to within a rounding step, and another rounding (a compiled kernel, HF's)
can then pick the other one and go on from there, still greedy.
"""

import argparse
import statistics
import sys
import time

import torch

import tlm
from tlm.generation import generate_plain

SHAPES = {
    "cpu": dict(vocab_size=50_304, context_length=1024, d_model=64, num_layers=12,
                num_heads=4, d_ff=192, rope_theta=10_000.0),
    "cuda": dict(vocab_size=50_304, context_length=1024, d_model=768, num_layers=12,
                 num_heads=12, d_ff=2048, rope_theta=10_000.0),
}


def measure(device: torch.device, repeats: int = 5, new_tokens: int = 256,
            compile: bool = True) -> list[str]:
    """The table's lines: tokens/s of each contender, its time relative to HF's, and
    whether its tokens equal the plain loop's."""
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    model = tlm.TransformerLM(**SHAPES["cuda" if cuda else "cpu"], device=device,
                              attn_implementation="sdpa").to(dtype).eval()
    hf = tlm.to_hf_llama(model, "sdpa").to(device=device, dtype=dtype).eval()
    hf.generation_config.eos_token_id = None  # every run makes all its tokens
    prompt = torch.randint(0, model.vocab_size, (1, 16), device=device)
    n = new_tokens
    out = {}

    def ours(name, **kw):
        fn = generate_plain if name == "tlm plain loop" else tlm.generate
        return lambda: out.__setitem__(name, fn(model, prompt, n, temperature=0, **kw))

    def theirs():
        with torch.no_grad():
            out["HF generate"] = hf.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                min_new_tokens=n, do_sample=False, pad_token_id=0)

    runs = {"tlm plain loop": ours("tlm plain loop"), "tlm eager": ours("tlm eager"),
            "HF generate": theirs}
    compile_s = None
    if compile:
        runs["tlm compiled"] = ours("tlm compiled", compile=True)
        start = time.perf_counter()
        runs["tlm compiled"]()  # the first call compiles
        if cuda:
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
    times = tlm.time_alternating(runs, repeats=repeats, warmup=1, device=device)

    def shortfall(ids: torch.Tensor) -> float:
        with torch.no_grad():
            logits = model(ids[:, :-1])[:, prompt.shape[1] - 1:].float()
        chosen = logits.gather(-1, ids[:, prompt.shape[1]:, None]).squeeze(-1)
        return (logits.amax(-1) - chosen).max().item()
    hf_s = statistics.median(times["HF generate"])
    lines = [f"{device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
             f"{dtype}, batch 1, 16-token prompt, {n} greedy tokens, "
             f"median of {repeats} rounds taken in turns",
             f"{'':16s} {'tokens/s':>9s} {'time / HF':>10s} {'(per round)':>12s} "
             f"{'same tokens as the plain loop':>30s} {'logit shortfall':>15s}"]
    for name, t in times.items():
        paired = statistics.median(a / b for a, b in zip(t, times["HF generate"]))
        same = torch.equal(out[name].cpu(), out["tlm plain loop"].cpu())
        lines.append(f"{name:16s} {n / statistics.median(t):9.1f} "
                     f"{statistics.median(t) / hf_s:10.3f} {paired:12.3f} "
                     f"{str(same):>30s} {shortfall(out[name]):15.4f}")
    if compile_s is not None:
        lines.append(f"compiling (the first call, with its {n} tokens): "
                     f"{compile_s:.1f} s")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--no-compile", action="store_true", help="leave out compiled")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    lines = measure(tlm.get_device(args.device), args.repeats, args.new_tokens,
                    not args.no_compile)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
