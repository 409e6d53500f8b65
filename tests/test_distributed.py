"""Data parallel by hand (tlm.DDP, tlm.ShardedOptimizer) on gloo processes, against one
process training on the whole batch with PyTorch's own optimizers."""

import pytest
import torch
import torch.distributed as dist

import tlm

CONFIG = dict(vocab_size=48, context_length=12, d_model=24, num_layers=2, num_heads=3,
              d_ff=40, rope_theta=10000.0, tie_embeddings=True)
STEPS, BATCH = 4, 6


def _model(seed: int):
    torch.manual_seed(seed)
    model = tlm.TransformerLM(**CONFIG)
    model.layers[0].ln1.weight.requires_grad_(False)  # a frozen parameter
    return model


def _batches():
    return torch.randint(0, 48, (STEPS, BATCH, 13), generator=torch.Generator().manual_seed(7))


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


def _train(model, step_fn, optimizer, batches):
    for i, x in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] *= 0.5 if i == 2 else 1.0  # a schedule changes the rate mid-run
        optimizer.zero_grad()
        logits = model(x[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).backward()
        step_fn()
        optimizer.step()


def _one_process(kind: str) -> dict:
    model = _model(0)
    optimizer = _optimizer(kind, model, False)
    _train(model, lambda: None, optimizer, _batches())
    return {k: v.clone() for k, v in model.state_dict().items()}


def _rank(rank: int, world_size: int, kind: str, sharded: bool) -> dict:
    model = _model(100 * rank)  # other weights on every rank but 0: DDP broadcasts rank 0's
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
    return _model(seed).state_dict()


@pytest.mark.parametrize("world_size, kind, sharded", [
    (2, "adamw", False), (2, "sgd", False), (3, "adamw", True), (2, "sgd", True)])
def test_data_parallel_equals_one_process(world_size, kind, sharded):
    one = _one_process(kind)
    start = _reference_weights(0)
    ranks = tlm.run_processes(_rank, world_size, (kind, sharded))
    for run in ranks:
        assert run["frozen_grad"] is None  # nothing computed or sent for it
        for name, value in one.items():
            # float32: the ranks sum the batch in another order than one process
            torch.testing.assert_close(run["weights"][name], value, rtol=0, atol=1e-5)
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


def test_without_a_process_group_the_error_says_what_to_do():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="DDP needs a process group: start the processes"):
        tlm.DDP(torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="ShardedOptimizer needs a process group"):
        tlm.ShardedOptimizer(torch.nn.Linear(2, 2).parameters(), torch.optim.SGD, lr=0.1)
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got str"):
        tlm.DDP("model")
    with pytest.raises(ValueError, match="world_size must be an int >= 1, got 0"):
        tlm.run_processes(_rank, 0)
