"""All-reduce bandwidth on gloo (or nccl on GPUs), and what data parallelism costs a step.

Usage: python benchmarks/allreduce.py [--processes 2] [--sizes-mb 1 2 4 ... 256]
                                      [--repeats 7] [--plot benchmarks/allreduce.png]

1. All-reduce of float32 tensors from 1 MiB to 256 MiB between the processes: the median
   time, the algorithm bandwidth (size / time) and the bus bandwidth (the ring's bytes per
   process, 2 (N - 1) / N x size, / time), as NCCL's tests report them.
2. A training step of `tlm train`'s default model (d_model 128, 4 layers, vocab 4,096,
   batch 32 x 128) on one process, and the same per-process batch under tlm.DDP on N
   processes: the median step time of each and their ratio. On a CPU each process uses one
   thread, so the N processes share the machine's cores.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import tlm


def _bandwidth(rank: int, world_size: int, sizes_mb: list[int], repeats: int) -> list:
    rows = []
    for mb in sizes_mb:
        t = torch.ones(mb * 2**20 // 4)
        dist.all_reduce(t)  # warm-up
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        rows.append((mb, statistics.median(times)))
    return rows


def _model_and_batch():
    torch.manual_seed(0)
    model = tlm.TransformerLM(4096, 128, 128, 4, 4, 352, 10000.0)
    x = torch.randint(0, 4096, (32, 129))
    return model, x


def _step_times(rank: int, world_size: int, repeats: int) -> list[float]:
    model, x = _model_and_batch()
    ddp = tlm.DDP(model) if world_size > 1 else None
    net = ddp or model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for i in range(repeats + 1):
        if world_size > 1:
            dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        logits = net(x[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).backward()
        if ddp is not None:
            ddp.finish_gradient_synchronization()
        opt.step()
        if i:  # the first step warms up
            times.append(time.perf_counter() - start)
    return times


def _single(rank: int, world_size: int, repeats: int) -> list[float]:
    return _step_times(0, 1, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--sizes-mb", type=int, nargs="+",
                        default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--plot", default=None, help="save the bandwidth figure here")
    args = parser.parse_args()
    n = args.processes
    rows = tlm.run_processes(_bandwidth, n, (args.sizes_mb, args.repeats))[0]
    print(f"gloo all-reduce, {n} processes, float32, torch {torch.__version__}, median of "
          f"{args.repeats}")
    print(f"{'MiB':>5s} {'ms':>9s} {'algorithm GB/s':>15s} {'bus GB/s':>9s}")
    for mb, t in rows:
        size = mb * 2**20
        print(f"{mb:5d} {1e3 * t:9.2f} {size / t / 1e9:15.2f} "
              f"{2 * (n - 1) / n * size / t / 1e9:9.2f}")
    one = tlm.run_processes(_single, 1, (args.repeats,))[0]
    many = tlm.run_processes(_step_times, n, (args.repeats,))
    t1, tn = statistics.median(one), statistics.median(many[0])
    print(f"training step, batch 32 x 128 per process, default model: one process "
          f"{1e3 * t1:.0f} ms, {n} processes with tlm.DDP {1e3 * tn:.0f} ms "
          f"(x{tn / t1:.2f})")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.plot([mb for mb, _ in rows],
                [2 * (n - 1) / n * mb * 2**20 / t / 1e9 for mb, t in rows], "o-")
        ax.set(xscale="log", xlabel="tensor size (MiB)", ylabel="bus bandwidth (GB/s)",
               title=f"gloo all-reduce, {n} processes on this machine")
        ax.set_xticks(args.sizes_mb, [str(mb) for mb in args.sizes_mb])
        ax.minorticks_off()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print("figure:", args.plot)


if __name__ == "__main__":
    main()
