"""`tlm generate --compile`: the same text as without it; refused with --no-cache."""

import pytest
import torch

import tlm.generation
from tlm.cli import main
from tlm.generation import _last_logits


@pytest.fixture
def traced_step(monkeypatch):
    """The step captured whole by Dynamo (fullgraph), without Inductor's code
    generation, so that the test takes seconds; tests/test_generation.py runs Inductor
    itself."""
    step = torch.compile(_last_logits, backend="eager", fullgraph=True, dynamic=False)
    calls = []
    monkeypatch.setitem(tlm.generation._COMPILED, "cpu",
                        lambda *args: calls.append(1) or step(*args))
    return calls


@pytest.mark.parametrize("how", [["--temperature", "0"], ["--seed", "3"]])
def test_generate_compile_writes_the_same_text(how, traced_step, capsys):
    args = ["generate", "shakespeare", "--device", "cpu", "--prompt", "ROMEO:",
            "--max-new-tokens", "24", *how]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main([*args, "--compile"]) == 0
    assert capsys.readouterr().out == plain and plain.startswith("ROMEO:")
    assert len(traced_step) >= 20  # the compiled step made the tokens after the first


def test_generate_compile_refuses_no_cache(capsys):
    assert main(["generate", "shakespeare", "--device", "cpu", "--compile",
                 "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --compile needs the cache: drop --no-cache or --compile\n"
