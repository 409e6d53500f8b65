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


@pytest.mark.parametrize("flag, value", [("--temperature", "1e-46"),
                                         ("--temperature", "5e-324"),
                                         ("--top-p", "1e-46"), ("--top-p", "1e-300")])
def test_generate_a_tiny_temperature_or_top_p_is_greedy(capsys, flag, value):
    args = ["generate", "shakespeare", "--device", "cpu", "--prompt", "ROMEO:",
            "--max-new-tokens", "12"]
    assert main([*args, "--temperature", "0"]) == 0
    greedy = capsys.readouterr().out
    assert main([*args, flag, value]) == 0
    assert capsys.readouterr().out == greedy


def test_generate_compile_that_cannot_build_is_one_warning_line(monkeypatch, capsys):
    """Where Inductor cannot build (no C++ compiler), --compile goes on eagerly after
    one line on stderr, and writes the same text."""
    def failing(gm, example_inputs):
        raise torch._inductor.exc.InvalidCxxCompiler("g++")
    step = torch.compile(_last_logits, backend=failing, fullgraph=True, dynamic=False)
    monkeypatch.setitem(tlm.generation._COMPILED, "cpu", step)
    args = ["generate", "shakespeare", "--device", "cpu", "--prompt", "ROMEO:",
            "--max-new-tokens", "8", "--temperature", "0"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main([*args, "--compile"]) == 0
    out, err = capsys.readouterr()
    assert out == plain
    assert err.startswith("warning: torch.compile: it cannot build the decoding step "
                          "here (") and err.count("\n") == 1, err
    assert "InvalidCxxCompiler" in err and err.endswith("going on eagerly\n")
    torch._dynamo.reset()
