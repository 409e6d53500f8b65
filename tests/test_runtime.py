"""tlm.runtime: the runtimes the loop calls, devices, --deterministic, the compile check and
the warning about a run that does not learn (see tests/tiny_runs.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tlm
from tlm.cli import main
from tlm.run import train_model
from tiny_runs import (ROOT, TINY, TINY_CONFIG, doctor_rows, run_cli, run_generate,
                       tlm_train, weights)


@pytest.mark.parametrize("name", ["cuda", "mps"])
def test_a_device_this_machine_lacks_is_one_line(run_dir, data_dir, tmp_path, name):
    mps = getattr(torch.backends, "mps", None)
    have = torch.cuda.is_available() if name == "cuda" else bool(mps and mps.is_available())
    for result in (run_cli(*TINY, "--data-dir", data_dir, "--out-dir", tmp_path / "r",
                           "--steps", 2, "--device", name),
                   run_generate(run_dir / "checkpoint.pt", "--device", name)):
        if have:  # the device works here: the run trains and samples on it
            assert result.returncode == 0, result.stderr
        else:
            assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
            assert result.stderr.startswith(f"error: device: {name} is not available here")


def _deterministic_at_each_batch(monkeypatch) -> list[bool]:
    """Whether torch's deterministic mode is on whenever a run draws a batch."""
    seen, real = [], tlm.run.get_batch

    def spy(*args, **kwargs):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(tlm.run, "get_batch", spy)
    return seen


def test_deterministic_reaches_torch_is_kept_on_resume_and_resumes_bit_for_bit(
        data_dir, tmp_path, monkeypatch):
    seen = _deterministic_at_each_batch(monkeypatch)
    common = [*TINY, "--data-dir", data_dir, "--steps", 12, "--checkpoint-every", 6,
              "--eval-every", 6, "--deterministic"]  # on the CPU, as TINY says
    assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "a"]))) == 0
    assert len(seen) == 12 and all(seen)
    assert not torch.are_deterministic_algorithms_enabled()  # as before the run
    assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "b",
                                    "--stop-at", 6]))) == 0
    seen.clear()  # the flag is not given again: the checkpoint has it
    assert tlm_train(list(map(str, ["--out-dir", tmp_path / "b", "--data-dir", data_dir,
                                    "--resume", "--quiet"]))) == 0
    assert len(seen) == 6 and all(seen)
    resumed = torch.load(tmp_path / "b/checkpoint.pt", weights_only=True)
    assert resumed["config"]["deterministic"] is True
    a = weights(tmp_path / "a/checkpoint.pt")
    assert all(torch.equal(a[k], resumed["model"][k]) for k in a)
    seen.clear()  # a run without the flag leaves the mode alone
    assert tlm_train(list(map(str, [*common[:-1], "--out-dir", tmp_path / "c"]))) == 0
    assert seen and not any(seen)


def test_a_resumed_run_can_turn_off_what_its_checkpoint_turned_on(data_dir, tmp_path,
                                                                  monkeypatch):
    """Every on/off option has a --no- form: --no-deterministic (or --no-compile) on
    --resume drops what the checkpoint's settings say."""
    seen = _deterministic_at_each_batch(monkeypatch)
    common = ["--out-dir", tmp_path, "--data-dir", data_dir]
    assert tlm_train(list(map(str, [*TINY, *common, "--steps", 8, "--checkpoint-every", 4,
                                    "--eval-every", 4, "--deterministic", "--stop-at", 4]))) == 0
    seen.clear()
    assert tlm_train(list(map(str, [*common, "--resume", "--quiet", "--no-deterministic"]))) == 0
    assert len(seen) == 4 and not any(seen)
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["config"]
    assert saved["deterministic"] is False and saved["compile"] is False


def test_train_model_restores_the_callers_deterministic_mode(data_dir, tmp_path):
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        args = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path, "--steps", 3,
                "--deterministic"]
        assert tlm_train(list(map(str, args))) == 0
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("value, started, message", [
    (":0:0", False, "--deterministic: CUBLAS_WORKSPACE_CONFIG must be :4096:8 or "
                    ":16:8, got ':0:0'"),
    (None, True, "--deterministic: CUDA started before CUBLAS_WORKSPACE_CONFIG was "
                 "set; set CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting Python"),
    (None, False, None),  # set here, before cuBLAS reads it
    (":16:8", True, None),  # cuBLAS's other deterministic setting
])
def test_deterministic_on_cuda_needs_the_cublas_workspace_setting(monkeypatch, value,
                                                                   started, message):
    """The rule, on any machine: torch's view of CUDA is patched."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: started)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "restored after the test")
    if value is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    try:
        if message is not None:
            with pytest.raises(ValueError, match=re.escape(message)):
                tlm.runtime._make_deterministic(torch.device("cuda"))
            assert not torch.are_deterministic_algorithms_enabled()
        else:
            tlm.runtime._make_deterministic(torch.device("cuda"))
            assert torch.are_deterministic_algorithms_enabled()
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == (value or ":4096:8")
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_deterministic_on_cuda_refuses_another_cublas_workspace(data_dir, tmp_path,
                                                                 monkeypatch, capsys):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    code = tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path,
                                    "--device", "cuda", "--deterministic"])))
    assert code == 2 and not (tmp_path / "checkpoint.pt").exists()
    assert capsys.readouterr().err == ("error: --deterministic: "
                                       "CUBLAS_WORKSPACE_CONFIG must be :4096:8 or "
                                       ":16:8, got ':0:0'\n")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_deterministic_on_cuda_resumes_bit_for_bit(data_dir, tmp_path):
    """On CUDA, in new processes (cuBLAS reads its setting when it starts)."""
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    common = [*TINY, "--data-dir", data_dir, "--steps", 40, "--checkpoint-every", 20,
              "--eval-every", 20, "--device", "cuda", "--deterministic"]
    for args in ([*common, "--out-dir", tmp_path / "a"],
                 [*common, "--out-dir", tmp_path / "b", "--stop-at", 20],
                 ["--out-dir", tmp_path / "b", "--data-dir", data_dir, "--resume"]):
        done = subprocess.run([sys.executable, "-m", "tlm", "train", *map(str, args)],
                              capture_output=True, text=True, cwd=ROOT, timeout=300,
                              env=env)
        assert done.returncode == 0, done.stderr
    a, b = weights(tmp_path / "a/checkpoint.pt"), weights(tmp_path / "b/checkpoint.pt")
    assert all(v.is_cuda for v in a.values())
    assert all(torch.equal(a[k], b[k]) for k in a)


class _Scaled(torch.autograd.Function):
    """The identity, whose backward pass multiplies the gradient by `scale`."""

    @staticmethod
    def forward(ctx, w, scale):
        ctx.scale = scale
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def _wrong_compiler(name: str, scale: float):
    """A stand-in for torch.compile that computes the forward pass right and the
    gradient of the parameter `name` `scale` times too large, as a broken compiler
    could."""
    def compile(module, *args, **kwargs):
        def forward(x):
            params = dict(module.named_parameters())
            params[name] = _Scaled.apply(params[name], scale)
            return torch.func.functional_call(module, params, (x,))
        return forward
    return compile


Q = "layers.0.attn.q_proj.weight"


def _tiny_model_and_batch():
    config = {**tlm.run.MODEL_OPTIONS, **tlm.run.OPTIMIZER_OPTIONS,
              "vocab_size": 257, "context_length": 16, "d_model": 32, "num_layers": 2,
              "num_heads": 2, "d_ff": 64}
    model = tlm.train.build_model(config)
    ids = torch.randint(0, 257, (4, 17), generator=torch.Generator().manual_seed(0))
    return model, ids[:, :-1], ids[:, 1:]


@pytest.mark.parametrize("scale, stops", [
    (0.0, True), (-1.0, True), (2.0, True), (1.01, True), (1.002, True),
    (1 + 1e-4, False), (1.0, False)])
def test_the_compile_check_stops_gradients_off_by_more_than_its_tolerance(scale, stops):
    model, x, y = _tiny_model_and_batch()
    wrong = _wrong_compiler(Q, scale)(model)
    rng = torch.get_rng_state()
    errors = tlm.runtime._gradient_errors(model, wrong, x, y)
    assert errors[Q] == pytest.approx(abs(scale - 1), rel=1e-3, abs=1e-6)
    assert max(errors.values()) == errors[Q] or scale == 1
    assert tlm.runtime.COMPILE_TOLERANCE == 1e-3
    if stops:
        with pytest.raises(tlm.runtime.CompileCheckError, match=re.escape(
                f"in float32, {Q} is off by a relative error of {errors[Q]:.2g} "
                "against eager (at most 0.001); train without --compile")):
            tlm.runtime._check_compiled(model, wrong, x, y)
    else:
        tlm.runtime._check_compiled(model, wrong, x, y)
    # the run goes on as without the check: no gradient kept, no random number drawn
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_compile_run_with_wrong_gradients_stops_before_its_first_step(
        data_dir, tmp_path, monkeypatch, capsys, dtype):
    """Checked in float32 whatever --dtype says."""
    monkeypatch.setattr(torch, "compile", _wrong_compiler(Q, 0.0))
    code = tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path,
                                    "--compile", "--dtype", dtype])))
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err == (f"error: --compile: torch {torch.__version__} compiled this model "
                   f"into wrong gradients: in float32, {Q} is off by a relative error "
                   "of 1 against eager (at most 0.001); train without --compile\n")
    assert not (tmp_path / "checkpoint.pt").exists()


def test_a_compile_run_whose_gradients_are_right_trains(data_dir, tmp_path,
                                                        monkeypatch):
    """A scale within the tolerance passes the check, and the run then trains with
    the 'compiled' forward pass."""
    monkeypatch.setattr(torch, "compile", _wrong_compiler(Q, 1 + 1e-5))
    common = [*TINY, "--data-dir", data_dir, "--steps", 6, "--checkpoint-every", 3]
    assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "c", "--compile",
                                    "--stop-at", 3]))) == 0
    assert tlm_train(list(map(str, ["--out-dir", tmp_path / "c", "--data-dir", data_dir,
                                    "--resume", "--quiet"]))) == 0  # checked again
    assert torch.load(tmp_path / "c/checkpoint.pt", weights_only=True)["iteration"] == 6


def test_torch_compile_passes_the_check_and_trains(data_dir, tmp_path, capsys):
    """The real compiler (Inductor), on the whole tiny model: a softmax or an RMSNorm whose
    `forward` returned a tensor it changed in place made torch 2.11 compile wrong gradients,
    which the check stops; the book's return a new tensor."""
    torch._dynamo.reset()
    args = [*TINY, "--data-dir", data_dir, "--out-dir", tmp_path, "--steps", 3,
            "--compile"]
    assert tlm_train(list(map(str, args))) == 0, capsys.readouterr().err


def _warnings(err: str, log: Path) -> tuple[list[str], list[int]]:
    """The warning lines on stderr, and the steps of the log's warning records."""
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return ([line for line in err.splitlines() if line.startswith("warning: ")],
            [r["step"] for r in records if "warning" in r])


def test_a_run_that_does_not_learn_is_warned_about(data_dir, tmp_path, monkeypatch,
                                                   capsys):
    common = [*TINY, "--data-dir", data_dir, "--steps", 60, "--eval-every", 30,
              "--checkpoint-every", 30]
    assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "learns"]))) == 0
    assert _warnings(capsys.readouterr().err, tmp_path / "learns/log.jsonl") == ([], [])
    monkeypatch.setattr(tlm.run, "get_lr_cosine_schedule", lambda *args: 0.0)
    assert tlm_train(list(map(str, [*common, "--out-dir", tmp_path / "flat"]))) == 0
    lines, steps = _warnings(capsys.readouterr().err, tmp_path / "flat/log.jsonl")
    assert steps == [60] and len(lines) == 1  # step 30 is too early to tell
    assert re.fullmatch(r"warning: the training loss of step 60, \d\.\d{3}, is not "
                        r"5% below step 1's, \d\.\d{3}: the model is not learning "
                        r"\(is --lr too small\? with --compile, try without it\)",
                        lines[0])
    # resumed, from a checkpoint of step 30 that has step 1's loss, or (an older tlm's)
    # that has not: then from the log
    for keep in (True, False):
        out = tmp_path / f"resumed-{keep}"
        assert tlm_train(list(map(str, [*common, "--out-dir", out, "--stop-at", 30]))) == 0
        if not keep:
            state = torch.load(out / "checkpoint.pt", weights_only=True)
            del state["first_loss"]
            torch.save(state, out / "checkpoint.pt")
        capsys.readouterr()
        assert tlm_train(list(map(str, ["--out-dir", out, "--data-dir", data_dir,
                                        "--resume", "--quiet"]))) == 0
        assert _warnings(capsys.readouterr().err, out / "log.jsonl") == (lines, [60])


@pytest.mark.parametrize("name", ["meta", "xpu"])
def test_a_device_that_cannot_hold_numbers_is_one_line(run_dir, data_dir, tmp_path,
                                                       name, capsys, monkeypatch):
    xpu = getattr(torch, "xpu", None)
    if name == "xpu" and xpu is not None and xpu.is_available():
        pytest.skip("this machine has an XPU")
    out = tmp_path / "r"
    assert tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir", out,
                                    "--device", name]))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: device: {name} is not usable here (")
    assert err.endswith("); try cpu\n") and len(err.splitlines()) == 1
    assert not out.exists()
    assert main(["generate", str(run_dir), "--device", name]) == 2
    assert capsys.readouterr().err == err
    monkeypatch.setenv("TLM_DEVICE", name)
    assert doctor_rows(capsys)["device"].split()[1:3] == ["unusable", "device:"]


def test_the_loop_goes_through_its_runtime_at_every_point(data_dir, tmp_path,
                                                          monkeypatch):
    """A runtime put first in RUNTIMES runs the loop: each point is called as often as
    the loop says, and a runtime that does what Runtime does changes nothing."""
    calls = {}

    class Counting(tlm.Runtime):
        def __getattribute__(self, name):
            if name in ("wrap", "micro_batch", "autocast", "backward", "step", "mean",
                        "state_dict", "load_state_dict"):
                calls[name] = calls.get(name, 0) + 1
            return super().__getattribute__(name)

    config = {**TINY_CONFIG, "data_dir": str(data_dir)}
    train_model({**config, "out_dir": str(tmp_path / "plain")}, progress=False)
    monkeypatch.setattr(tlm.runtime, "RUNTIMES", [Counting, *tlm.runtime.RUNTIMES])
    train_model({**config, "out_dir": str(tmp_path / "counted")}, progress=False)
    steps, A = config["steps"], config["grad_accum_steps"]
    assert calls == {"wrap": 1, "micro_batch": steps * A, "autocast": steps * A,
                     "backward": steps * A, "step": steps, "mean": steps,
                     "state_dict": steps // config["checkpoint_every"]}
    a, b = weights(tmp_path / "plain/checkpoint.pt"), weights(tmp_path / "counted/checkpoint.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_train_model_takes_the_first_runtime_that_accepts_the_run(monkeypatch):
    from tlm.run import MODEL_OPTIONS, OPTIMIZER_OPTIONS, RUN_OPTIONS
    from tlm.runtime import _runtime
    config = {**MODEL_OPTIONS, **OPTIMIZER_OPTIONS, **RUN_OPTIONS, "device": "cpu"}
    cpu = torch.device("cpu")
    assert type(_runtime(config, cpu)) is tlm.Runtime
    for other in ({"dtype": "bfloat16"}, {"dtype": "float16"}):
        assert type(_runtime({**config, **other}, cpu)) is tlm.DistributedRuntime
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets
    assert not tlm.Runtime.accepts(config)
    assert not tlm.Runtime.accepts({**config, "fsdp": True, "dtype": "float32"})
    monkeypatch.setattr(tlm.runtime, "RUNTIMES", [tlm.Runtime])
    with pytest.raises(ValueError, match="need the runtime of tlm.distributed"):
        _runtime(config, cpu)


def _failing_backend(gm, example_inputs):
    raise torch._inductor.exc.InvalidCxxCompiler("g++")  # Inductor, without g++


def test_a_compiler_that_cannot_build_stops_the_run_in_one_line(data_dir, tmp_path,
                                                                monkeypatch, capsys):
    """No C++ compiler (a slim Docker image, macOS without Xcode's tools): Inductor's
    80-line traceback became one line and status 1, before the first step."""
    torch._dynamo.reset()
    real = torch.compile
    monkeypatch.setattr(torch, "compile",
                        lambda model, **kw: real(model, backend=_failing_backend))
    code = tlm_train(list(map(str, [*TINY, "--data-dir", data_dir, "--out-dir",
                                    tmp_path / "run", "--compile"])))
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("error: --compile: torch.compile cannot build this model here (")
    assert "InvalidCxxCompiler" in err and err.endswith("; train without --compile\n")
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
    torch._dynamo.reset()
