"""Data parallel by hand (tlm.DDP, tlm.ShardedOptimizer) on gloo processes, against one
process training on the whole batch with PyTorch's own optimizers."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import tlm
import tlm.cli

# sizes that two and three ranks do not all divide: FSDP pads its shards
CONFIG = dict(vocab_size=49, context_length=12, d_model=20, num_layers=2, num_heads=2,
              d_ff=41, rope_theta=10000.0, tie_embeddings=True)
STEPS, BATCH = 4, 6


def _model(seed: int, dtype=torch.float32):
    torch.manual_seed(seed)
    model = tlm.TransformerLM(**CONFIG, dtype=dtype)
    model.layers[0].ln1.weight.requires_grad_(False)  # a frozen parameter
    return model


def _batches():
    return torch.randint(0, 49, (STEPS, BATCH, 13), generator=torch.Generator().manual_seed(7))


def _optimizer(kind: str, model, rank_sharded: bool):
    groups = tlm.param_groups(model, 0.1, "matrices")  # two groups: decay and no decay
    groups = [dict(g, params=[p for p in g["params"] if p.requires_grad]) for g in groups]
    if kind == "adamw":
        cls, kwargs = torch.optim.AdamW, dict(lr=3e-3, betas=(0.9, 0.95))
    else:
        cls, kwargs = torch.optim.SGD, dict(lr=0.05, momentum=0.9)
    if rank_sharded:
        return tlm.ShardedOptimizer(groups, cls, **kwargs)
    return cls(groups, **kwargs)


def _train(model, step_fn, optimizer, batches, parts: int = 1):
    """parts > 1: each batch in that many micro-batches, whose gradients add up."""
    for i, x in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] *= 0.5 if i == 2 else 1.0  # a schedule changes the rate mid-run
        optimizer.zero_grad()
        for part in x.chunk(parts):
            logits = model(part[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                     part[:, 1:].flatten())
            (loss / parts).backward()
        step_fn()
        optimizer.step()


def _one_process(kind: str) -> dict:
    model = _model(0, torch.float64)
    optimizer = _optimizer(kind, model, False)
    _train(model, lambda: None, optimizer, _batches())
    return {k: v.clone() for k, v in model.state_dict().items()}


def _rank(rank: int, world_size: int, kind: str, sharded: bool) -> dict:
    # other weights on every rank but 0: DDP broadcasts rank 0's
    model = _model(100 * rank, torch.float64)
    ddp = tlm.DDP(model)
    assert model.lm_head.weight is model.token_embeddings.weight
    optimizer = _optimizer(kind, model, sharded)
    share = BATCH // world_size
    _train(ddp, ddp.finish_gradient_synchronization, optimizer,
           _batches()[:, rank * share:(rank + 1) * share])
    if sharded:  # its state_dict is this rank's share
        assert len(optimizer.state_dict()["state"]) == len(optimizer._local.state) > 0
    frozen_grad = model.layers[0].ln1.weight.grad
    state = optimizer._local.state if sharded else optimizer.state
    return {"weights": {k: v.clone() for k, v in model.state_dict().items()},
            "frozen_grad": frozen_grad,
            "state_numbers": sum(t.numel() for s in state.values() for t in s.values()
                                 if torch.is_tensor(t) and t.dim())}


def _reference_weights(seed: int) -> dict:
    return _model(seed, torch.float64).state_dict()


@pytest.mark.parametrize("world_size, kind, sharded", [
    (2, "adamw", False), (2, "sgd", False), (3, "adamw", True), (2, "sgd", True)])
def test_data_parallel_equals_one_process(world_size, kind, sharded):
    one = _one_process(kind)
    start = _reference_weights(0)
    ranks = tlm.run_processes(_rank, world_size, (kind, sharded))
    # in float64: the ranks sum the batch in another order than one process, and AdamW
    # divides each gradient by its running size, which magnifies that rounding where a
    # gradient is nearly zero; in float32 that reached 1.1e-4 at one element of 820 with
    # three ranks, on one CPU and not another. In float64 the ranks differ from one
    # process by 2e-16, and a sum where the mean belongs moves a weight by 1e-2 (measured)
    atol = 1e-9
    for run in ranks:
        assert run["frozen_grad"] is None  # nothing computed or sent for it
        for name, value in one.items():
            torch.testing.assert_close(run["weights"][name], value, rtol=0, atol=atol)
            assert torch.equal(run["weights"][name], ranks[0]["weights"][name])
        assert not torch.equal(run["weights"]["lm_head.weight"], start["lm_head.weight"])
        assert torch.equal(run["weights"]["layers.0.ln1.weight"], start["layers.0.ln1.weight"])
    if sharded:  # every parameter's state lives on exactly one rank
        trained = sum(p.numel() for p in _model(0).parameters() if p.requires_grad)
        per_parameter = 2 if kind == "adamw" else 1  # two moments; one momentum buffer
        numbers = [run["state_numbers"] for run in ranks]
        assert sum(numbers) == per_parameter * trained
        assert max(numbers) < per_parameter * trained * 0.75  # each holds a share


def _accumulate(rank: int, world_size: int) -> dict:
    """Two micro-batches a step, synchronized after each backward; then a misuse."""
    model = _model(0)
    ddp = tlm.DDP(model)
    optimizer = _optimizer("sgd", model, False)
    share = BATCH // world_size
    for x in _batches()[:2, rank * share:(rank + 1) * share]:
        optimizer.zero_grad()
        for micro in x.chunk(2):
            logits = ddp(micro[:, :-1])
            loss = torch.nn.functional.cross_entropy(  # weighted: 2 and 1 sequences
                logits.flatten(0, 1), micro[:, 1:].flatten()) * len(micro) / len(x)
            loss.backward()
            ddp.finish_gradient_synchronization()
        optimizer.step()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    ddp(x[:, :-1]).sum().backward()
    try:
        ddp(x[:, :-1]).sum().backward()  # no synchronization in between
        error = None
    except RuntimeError as e:
        error = str(e)
    ddp.finish_gradient_synchronization()
    return {"weights": weights, "error": error}


def test_gradient_accumulation_and_a_missing_synchronization():
    model = _model(0)
    optimizer = _optimizer("sgd", model, False)
    _train(model, lambda: None, optimizer, _batches()[:2])
    for run in tlm.run_processes(_accumulate, 2):
        for name, value in model.state_dict().items():
            torch.testing.assert_close(run["weights"][name], value, rtol=0, atol=1e-5)
        assert "a second backward() before finish_gradient_synchronization()" in run["error"]


def _fsdp_rank(rank: int, world_size: int, kind: str, dtype) -> dict:
    model = _model(100 * rank)
    model.layers[1].attn.q_proj.weight.requires_grad_(False)  # a frozen sharded weight
    names = [n for n, _ in model.named_parameters()]
    fsdp = tlm.FSDP(model, dtype)
    optimizer = _optimizer(kind, model, False)
    share = BATCH // world_size
    _train(fsdp, fsdp.finish_gradient_synchronization, optimizer,
           _batches()[:, rank * share:(rank + 1) * share])
    full = fsdp.gather_full_params()
    assert list(full) == names and model.layers[1].attn.q_proj.weight.grad is None
    return {"weights": full, "held": sum(p.numel() for p in fsdp.parameters())}


def _named_one_process(kind: str, steps: int = STEPS, parts: int = 1) -> dict:
    model = _model(0)
    model.layers[1].attn.q_proj.weight.requires_grad_(False)
    optimizer = _optimizer(kind, model, False)
    _train(model, lambda: None, optimizer, _batches()[:steps], parts)
    return {k: v.detach() for k, v in model.named_parameters()}


@pytest.mark.parametrize("world_size, kind", [(2, "adamw"), (3, "sgd")])
def test_fsdp_equals_one_process_in_float32(world_size, kind):
    one = _named_one_process(kind)
    start = _model(0)
    ranks = tlm.run_processes(_fsdp_rank, world_size, (kind, None))
    for run in ranks:
        for name, value in one.items():
            torch.testing.assert_close(run["weights"][name], value, rtol=0, atol=1e-5)
    frozen = "layers.1.attn.q_proj.weight"
    assert torch.equal(ranks[0]["weights"][frozen], start.layers[1].attn.q_proj.weight)
    total = sum(p.numel() for p in start.parameters())
    assert ranks[0]["held"] < total / world_size * 1.1  # a shard of each weight


def _fsdp_and_ddp_rank(rank: int, world_size: int) -> dict:
    """tlm.FSDP and tlm.DDP with SGD in float32 on this rank's share: the weights after one
    step and after STEPS; then the gradient of a backward through the tied weight's
    embedding alone (its lm_head unused)."""
    share = BATCH // world_size
    batches = _batches()[:, rank * share:(rank + 1) * share]
    got = {}
    for name, wrapper in (("fsdp", tlm.FSDP), ("ddp", tlm.DDP)):
        for steps in (1, STEPS):
            model = _model(100 * rank)
            model.layers[1].attn.q_proj.weight.requires_grad_(False)
            wrapped = wrapper(model)
            optimizer = _optimizer("sgd", model, False)
            _train(wrapped, wrapped.finish_gradient_synchronization, optimizer,
                   batches[:steps])
            got[name, steps] = (wrapped.gather_full_params() if name == "fsdp" else
                                {k: v.detach().clone() for k, v in model.named_parameters()})
        optimizer.zero_grad()
        model.token_embeddings(batches[0]).pow(2).sum().backward()
        wrapped.finish_gradient_synchronization()
        tied = model.token_embeddings.weight
        shape = (CONFIG["vocab_size"], CONFIG["d_model"])
        got[name, "embedding alone"] = (wrapped._gather(tied.grad, shape)
                                        if name == "fsdp" else tied.grad.clone())
    return got


def test_fsdp_equals_ddp_and_one_process_bit_for_bit_on_two_ranks():
    """FSDP averages each gradient as DDP does: each rank's g / 2, summed, a tied weight's
    two uses added on each rank first. With two ranks the sum's order cannot matter, so
    both equal, bit for bit, one process that adds the two halves of each batch (the
    ranks' shares, as micro-batches). The whole batch in one backward adds in another
    order, and so does gloo with three ranks (its reduce-scatter and its all-reduce add the
    ranks' numbers in different orders): test_fsdp_equals_one_process_in_float32."""
    ranks = tlm.run_processes(_fsdp_and_ddp_rank, 2)
    for steps in (1, STEPS):
        one = _named_one_process("sgd", steps, parts=2)
        for run in ranks:
            for name, value in one.items():
                assert torch.equal(run["fsdp", steps][name], value), (steps, name)
                assert torch.equal(run["ddp", steps][name], value), (steps, name)
    for run in ranks:  # a tied weight only one of whose layers ran
        assert torch.equal(run["fsdp", "embedding alone"], run["ddp", "embedding alone"])
        assert run["fsdp", "embedding alone"].abs().sum() > 0


def test_fsdp_in_16_bits():
    one = _named_one_process("sgd")
    by = {}
    for world_size, dtype in ((1, torch.float16), (2, torch.float16), (2, torch.bfloat16)):
        by[world_size, dtype] = tlm.run_processes(_fsdp_rank, world_size,
                                                  ("sgd", dtype))[0]["weights"]
    gap = lambda a, b: max((a[k] - b[k]).abs().max().item() for k in a)  # noqa: E731
    # float16 on two processes against float16 on one process: the same products, the
    # gradients summed in another order (SGD: a step linear in the gradient)
    # measured here: 3.2e-5 between the two float16 runs; 9.3e-5 (float16) and 4.1e-4
    # (bfloat16) from float32
    assert gap(by[2, torch.float16], by[1, torch.float16]) < 1e-4
    assert gap(by[2, torch.float16], one) < 1e-2 and gap(by[2, torch.bfloat16], one) < 1e-2
    assert all(v.dtype == torch.float32 for v in by[2, torch.bfloat16].values())


def test_without_a_process_group_the_error_says_what_to_do():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="DDP needs a process group: start the processes"):
        tlm.DDP(torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="ShardedOptimizer needs a process group"):
        tlm.ShardedOptimizer(torch.nn.Linear(2, 2).parameters(), torch.optim.SGD, lr=0.1)
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got str"):
        tlm.DDP("model")
    with pytest.raises(RuntimeError, match="FSDP needs a process group"):
        tlm.FSDP(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="compute_dtype must be a floating torch.dtype"):
        tlm.FSDP(torch.nn.Linear(2, 2), torch.int8)
    with pytest.raises(ValueError, match="world_size must be an int >= 1, got 0"):
        tlm.run_processes(_rank, 0)


# ---- `tlm train` under torchrun --------------------------------------------------------

TINY = ["--context-length", "16", "--d-model", "32", "--num-layers", "2", "--num-heads", "2",
        "--d-ff", "64", "--steps", "20", "--warmup-steps", "2", "--log-every", "1",
        "--eval-every", "10", "--checkpoint-every", "5", "--batch-size", "4", "--quiet",
        "--device", "cpu"]


def _tlm_train(*args, processes: int = 1, script: bool = False,
               cwd=None) -> subprocess.CompletedProcess:
    """`tlm train ARGS`: in this process for one, under torchrun for several; script=True
    runs the console script `tlm` (under torchrun with --no-python)."""
    if processes == 1 and not script:  # no process start: the suite's time
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = tlm.cli.main(["train", *map(str, args)])
        return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())
    program = ([str(Path(sys.executable).parent / "tlm")] if script
               else [sys.executable, "-m", "tlm"])
    if processes > 1:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", str(processes)]
        program = [*torchrun, "--no-python", *program] if script else [*torchrun, *program[1:]]
    return subprocess.run([*program, "train", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The data, and one uninterrupted run on two processes."""
    root = tmp_path_factory.mktemp("torchrun")
    data = root / "data"
    data.mkdir()
    tlm.write_vocab({i: bytes([i]) for i in range(256)}, data / "vocab.json")
    tlm.write_merges([], data / "merges.txt")
    ids = np.frombuffer(b"the cat sat on the mat. " * 300, np.uint8).astype(np.uint16)
    np.save(data / "train.npy", ids[:6000])
    np.save(data / "valid.npy", ids[6000:])
    done = _tlm_train("--data-dir", data, "--out-dir", root / "two", *TINY, processes=2)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def _losses(run_dir) -> list[float]:
    log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [r["loss"] for r in log if "loss" in r]


def _weights(run_dir) -> dict:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


def test_two_processes_follow_one_with_twice_the_micro_batches(runs):
    done = _tlm_train("--data-dir", runs / "data", "--out-dir", runs / "one", *TINY,
                      "--grad-accum-steps", 2)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = _losses(runs / "one"), _losses(runs / "two")
    assert len(one) == len(two) == 20
    assert max(abs(a - b) for a, b in zip(one, two)) < 1e-5
    assert one[-1] < one[0] - 1  # it learns
    for name, value in _weights(runs / "one").items():
        torch.testing.assert_close(_weights(runs / "two")[name], value, rtol=0, atol=1e-5)
    saved = torch.load(runs / "two" / "checkpoint.pt", weights_only=False)
    assert len(saved["samplers"]) == 2  # every process's generator
    assert not (runs / "two" / "checkpoint.pt.tmp").exists()


def test_a_resumed_two_process_run_equals_the_uninterrupted_one(runs):
    out = runs / "split"
    first = _tlm_train("--data-dir", runs / "data", "--out-dir", out, *TINY, "--stop-at", 10,
                       processes=2)
    assert first.returncode == 0, first.stderr[-3000:]
    second = _tlm_train("--data-dir", runs / "data", "--out-dir", out, "--resume", "--quiet",
                        processes=2, script=True)  # the console script under torchrun
    assert second.returncode == 0, second.stderr[-3000:]
    whole = _weights(runs / "two")
    assert all(torch.equal(v, whole[k]) for k, v in _weights(out).items())
    assert _losses(out) == _losses(runs / "two")
    # with another number of processes: one line and exit status 2, before any work
    other = _tlm_train("--data-dir", runs / "data", "--out-dir", out, "--resume",
                       processes=1)
    assert other.returncode == 2
    assert other.stderr.strip() == (f"error: --resume: {out / 'checkpoint.pt'} was trained "
                                    "by 2 processes, this run has 1: resume with as many")


def test_fsdp_follows_one_process_and_resumes(runs):
    out = runs / "fsdp"
    first = _tlm_train("--data-dir", runs / "data", "--out-dir", out, *TINY, "--fsdp",
                       "--stop-at", 10, processes=2)
    assert first.returncode == 0, first.stderr[-3000:]
    second = _tlm_train("--data-dir", runs / "data", "--out-dir", out, "--resume", "--quiet",
                        processes=2)
    assert second.returncode == 0, second.stderr[-3000:]
    sharded, ddp = _losses(out), _losses(runs / "two")
    assert len(sharded) == 20 and max(abs(a - b) for a, b in zip(sharded, ddp)) < 1e-5
    for name, value in _weights(runs / "two").items():  # saved whole, as without --fsdp
        torch.testing.assert_close(_weights(out)[name], value, rtol=0, atol=1e-5)
    saved = torch.load(out / "checkpoint.pt", weights_only=False)
    assert saved["config"]["fsdp"] and not any(hasattr(v, "to_local")
                                               for v in saved["model"].values())


_AS_IF_WITH_A_GPU = """
import os
import sys

import torch

import tlm.distributed

# FSDP2 builds its default device mesh on the machine's accelerator: here, CUDA
torch._C._get_accelerator = lambda *args, **kwargs: torch.device("cuda")
shard = tlm.distributed.fully_shard


def fully_shard(module, **kwargs):
    mesh = kwargs.get("mesh")
    # one file per process: two processes printing to one pipe can interleave
    with open(os.environ["MESH_LOG"] + os.environ["RANK"], "a") as log:
        log.write(f"{None if mesh is None else mesh.device_type}\\n")
    return shard(module, **kwargs)


tlm.distributed.fully_shard = fully_shard
from tlm.cli import main

sys.exit(main(["train", *sys.argv[1:]]))
"""


def test_fsdp_on_the_cpu_of_a_machine_with_a_gpu(runs, tmp_path):
    """Its mesh is on the run's device: FSDP2's default, CUDA's on a machine that has a
    GPU, failed there on rank 1 ("CUDA error: invalid device ordinal")."""
    script = tmp_path / "with_a_gpu.py"
    script.write_text(_AS_IF_WITH_A_GPU)
    args = ["--data-dir", runs / "data", "--out-dir", tmp_path / "run", *TINY, "--fsdp",
            "--steps", 2, "--warmup-steps", 1, "--checkpoint-every", 2]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]
    done = subprocess.run([*torchrun, str(script), *map(str, args)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1",
                               "MESH_LOG": str(tmp_path / "mesh-")})
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):  # in each process: the 2 blocks, then the model
        meshes = (tmp_path / f"mesh-{rank}").read_text().split()
        assert meshes == ["cpu"] * 3, (rank, meshes)
    saved = torch.load(tmp_path / "run/checkpoint.pt", weights_only=True)
    assert saved["iteration"] == 2


def test_fsdp_refuses_one_process_and_a_model_too_small(runs):
    alone = _tlm_train("--data-dir", runs / "data", "--out-dir", runs / "x", *TINY, "--fsdp")
    assert alone.returncode == 2
    assert alone.stderr.strip() == ("error: --fsdp shards the model over processes: start "
                                    "the run with torchrun --nproc-per-node N, N >= 2")
    tiny = ["--d-model", 2, "--num-heads", 1, "--d-ff", 4]  # RMSNorm gains of 2 numbers
    done = _tlm_train("--data-dir", runs / "data", "--out-dir", runs / "x", *TINY, *tiny,
                      "--fsdp", processes=3)
    assert done.returncode != 0 and not (runs / "x" / "checkpoint.pt").exists()
    assert ("--fsdp: the model is too small to shard over 3 processes: a parameter has 2 "
            "rows, so some processes would hold none of it; use fewer") in done.stderr


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_trains_near_float32(runs, dtype):
    out = runs / dtype
    done = _tlm_train("--data-dir", runs / "data", "--out-dir", out, *TINY,
                      "--grad-accum-steps", 2, "--dtype", dtype)
    assert done.returncode == 0, done.stderr[-3000:]
    low, full = _losses(out), _losses(runs / "two")
    assert max(abs(a - b) for a, b in zip(low, full)) < 0.05  # 16-bit products
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert all(v.dtype == torch.float32 for v in state["model"].values())  # master weights
    assert ("scale" in state["scaler"]) == (dtype == "float16")  # the scaler kept


def test_bad_options_for_many_devices(runs):
    for args, message in ((["--grad-accum-steps", 0], "--grad-accum-steps must be a "
                           "positive int, got 0"),
                          (["--peak-tflops", -1], "--peak-tflops must be a positive number")):
        done = _tlm_train("--data-dir", runs / "data", "--out-dir", runs / "bad", *TINY,
                          *args)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert not (runs / "bad").exists()


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA H200", 989),
    ("NVIDIA A100-SXM4-80GB", 312), ("NVIDIA L4", 121), ("Tesla T4", 65),
    ("Tesla V100-SXM2-16GB", 125), ("Tesla V100-PCIE-16GB", 112),
    ("NVIDIA H100 NVL", None), ("NVIDIA L40S", None), ("NVIDIA GeForce RTX 4090", None)])
def test_peak_flops_of_known_gpus_from_their_data_sheets(monkeypatch, name, tflops):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak = tlm.peak_flops(torch.device("cuda", 0))
    assert peak == (None if tflops is None else tflops * 1e12)
    assert tlm.peak_flops(torch.device("cpu")) is None


def _process_with(rank: int, marker: str) -> int:
    """The pid of the torchrun worker of this rank whose command line holds marker."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            command = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:  # gone, or not ours
            continue
        if f"RANK={rank}".encode() in environ and marker.encode() in command:
            return int(pid)
    raise AssertionError(f"no process of rank {rank} runs {marker}")


def test_a_killed_process_stops_the_run_and_the_checkpoint_resumes(runs):
    out = runs / "killed"
    args = ["--data-dir", runs / "data", "--out-dir", out, *TINY[:10], "--steps", 300,
            "--warmup-steps", 2, "--checkpoint-every", 20, "--batch-size", 4, "--quiet",
            "--device", "cpu"]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", "-m", "tlm", "train", *map(str, args)]
    run = subprocess.Popen(launcher, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while not (out / "checkpoint.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(_process_with(1, str(out)), signal.SIGKILL)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode != 0
    assert "rank      : 1 (local_rank: 1)" in stderr and "SIGKILL" in stderr  # named
    saved = torch.load(out / "checkpoint.pt", weights_only=False)  # whole, loadable
    assert 0 < saved["iteration"] < 300 and len(saved["samplers"]) == 2
    done = _tlm_train("--data-dir", runs / "data", "--out-dir", out, "--resume", "--quiet",
                      processes=2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert torch.load(out / "checkpoint.pt", weights_only=False)["iteration"] == 300


def test_bfloat16_is_refused_on_a_gpu_without_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100")
    with pytest.raises(ValueError, match="--dtype bfloat16: Tesla V100 cannot compute in "
                                         "bfloat16; use float16"):
        tlm.mixed_precision(torch.device("cuda", 0), "bfloat16")
    autocast, scaler = tlm.mixed_precision(torch.device("cpu"), "float16")
    assert scaler.is_enabled() and autocast.fast_dtype == torch.float16


def test_run_processes_names_functions_a_new_process_cannot_import(monkeypatch):
    """A function from a notebook, a lambda or a nested function cannot be imported by a
    spawned process: refused before any process starts, saying what to do instead."""
    def nested(rank, world_size):
        return rank

    for fn in (nested, lambda r, w: r):
        with pytest.raises(TypeError,
                           match="is defined inside a function or a lambda.*%%writefile"):
            tlm.run_processes(fn, 2)
    import types
    notebook = types.ModuleType("__main__")  # a kernel's __main__ has no file
    monkeypatch.setitem(sys.modules, "__main__", notebook)
    monkeypatch.setattr(nested, "__module__", "__main__")
    monkeypatch.setattr(nested, "__qualname__", "nested")
    with pytest.raises(TypeError, match=r"'nested' is defined interactively "
                                        r"\(a notebook or the REPL\); a new process"):
        tlm.run_processes(nested, 2)


def test_run_processes_refuses_nccl_with_fewer_gpus_than_processes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"^backend 'nccl' runs one process per GPU: "
                                         r"world_size 2 needs 2 GPUs, this machine has 1$"):
        tlm.run_processes(tlm.distributed._collectives, 2, backend="nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="this machine has 0$"):
        tlm.run_processes(tlm.distributed._collectives, 1, backend="nccl")


def test_the_chapters_functions_run_on_the_cpu_outside_an_nccl_group(monkeypatch):
    """(The chapter's cells run them in gloo groups and print their CPU tensors.)"""
    assert tlm.distributed._rank_device() == torch.device("cpu")  # no group at all
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert tlm.distributed._rank_device() == torch.device("cpu")
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # set_device(rank 1)
    assert tlm.distributed._rank_device() == torch.device("cuda", 1)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_the_chapters_runs_on_two_gpus_with_nccl_as_on_the_cpu_with_gloo():
    gloo = tlm.run_processes(tlm.distributed._collectives, 2)
    nccl = tlm.run_processes(tlm.distributed._collectives, 2, backend="nccl")
    assert all(torch.equal(a[k], b[k]) for a, b in zip(gloo, nccl) for k in a)
    for mode in ("ddp", "fsdp", "torch-ddp"):
        cpu = tlm.run_processes(tlm.distributed._data_parallel_run, 2, (mode,))
        gpu = tlm.run_processes(tlm.distributed._data_parallel_run, 2, (mode,), "nccl")
        for a, b in zip(cpu, gpu):
            assert all(torch.allclose(a["weights"][k], b["weights"][k], rtol=0, atol=1e-5)
                       for k in a["weights"]), mode
