"""Training throughput of `tlm train`'s step against the same loop with Hugging Face.

Usage: python benchmarks/train_throughput.py [--repeats 41] [--device cpu]
tlm: TransformerLM (sdpa attention) + tlm.AdamW + tlm.gradient_clipping, as `tlm train` has them by default (decay on every parameter here).
HF: LlamaForCausalLM of the same config and weights (attn_implementation="sdpa") +
torch.optim.AdamW + clip_grad_norm_. One step each, in turns, in one process, on the same batch
from get_batch; prints median tokens/s and the step-time ratio tlm / HF (below 1: tlm is faster).
"""

import argparse
import statistics

import numpy as np
import torch

import tlm
from tlm.run import MODEL_OPTIONS, OPTIMIZER_OPTIONS
from tlm.train import build_model, get_batch


def step_fn(optimizer, forward, clip, x, y):
    def step():
        loss = tlm.cross_entropy(forward(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip()
        optimizer.step()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    device = tlm.get_device(args.device)
    config = {**MODEL_OPTIONS, **OPTIMIZER_OPTIONS, "vocab_size": 4096}
    ours = build_model(config, device)
    hf = tlm.to_hf_llama(ours, "sdpa").train()
    opt = dict(lr=config["lr"], betas=(config["beta1"], config["beta2"]),
               eps=config["eps"], weight_decay=config["weight_decay"])
    data = np.random.default_rng(0).integers(0, 4096, 200_000).astype(np.uint16)
    x, y = get_batch(data, config["batch_size"], config["context_length"], device,
                     torch.Generator().manual_seed(0))
    ours_opt, hf_opt = tlm.AdamW(ours.parameters(), **opt), torch.optim.AdamW(hf.parameters(), **opt)
    steps = {
        "tlm": step_fn(ours_opt, ours, lambda: tlm.gradient_clipping(ours.parameters(), 1.0), x, y),
        "HF": step_fn(hf_opt, lambda ids: hf(ids).logits, lambda: torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0), x, y),
    }
    times = tlm.time_alternating(steps, repeats=args.repeats, warmup=3, device=device)
    tokens = x.numel()
    rate = {name: tokens / statistics.median(t) for name, t in times.items()}
    for name, r in rate.items():
        print(f"{name:>4}: {r:9,.0f} tokens/s (median of {args.repeats} steps of {tokens:,} tokens)")
    paired = statistics.median(a / b for a, b in zip(times["tlm"], times["HF"]))
    print(f"step time tlm / HF: {rate['HF'] / rate['tlm']:.3f} (median of per-round ratios "
          f"{paired:.3f}) on {device}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
