"""FlashAttention's Triton kernels compiled for GPUs that are not here, and read.

Triton compiles for an NVIDIA GPU on any machine (its wheel brings ptxas and cuobjdump), so
what makes the kernels fast is checked without one: every loop pipelined (loads issued
ahead into shared memory buffers), no registers spilled in 16-bit at d <= 128, products
on tensor cores (float32's too, as three TF32 products), the backward's five products a
tile, the forward's one multiply-add a score. A representative subset: each kernel's
first setting in 16-bit at d = 128, where registers and shared memory run shortest, for
sm_90 (H100) and sm_80 (A100); the forward at d = 64 and in float32. `python
benchmarks/flash_attention.py --compile-only --arch sm_90` (and sm_80) compiles every
setting.
"""

import pytest

from tlm import flash_triton as fa

REASON = fa.flash_compile_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))


@pytest.fixture(scope="module")
def report():
    cases = [dict(arch=arch, dtype="bfloat16", d=128) for arch in ("sm_90", "sm_80")]
    cases += [dict(arch="sm_90", dtype="bfloat16", d=64, kernel="forward"),
              dict(arch="sm_90", dtype="float32", d=64, kernel="forward")]
    return fa.compile_flash_kernels(cases)


def test_every_loop_is_pipelined(report):
    for r in report:
        assert r["loops"] and set(r["loops"]) == {"for"}, r
        assert r["async_copies"] > 0 and r["buffers"] >= 2, r


def test_no_spills_in_16_bit_and_the_settings_fit(report):
    for r in report:
        if r["dtype"] != "float32":
            assert r["spill"] == 0, r
        assert r["shared"] <= fa.SHARED_MEMORY[int(r["arch"][3:])], r


def test_the_products_run_on_tensor_cores(report):
    for r in report:  # wgmma: Hopper's warpgroup products; mma: Ampere's
        assert r["tensor_cores"] == {"sm_90": "wgmma", "sm_80": "mma"}[r["arch"]], r
    assert any(r["dtype"] == "float32" and r["precision"] == "tf32x3" for r in report)


def test_two_products_a_forward_tile_five_a_backward_tile(report):
    """S and P V in the forward; S, dP, dV, dK and dQ's share in the backward (not 7:
    S and dP are not recomputed for dQ), each loop (causal: off the diagonal, on it, and
    the backward's ragged tail). Only the backward adds atomically, into dQ."""
    for r in report:
        if r["dtype"] != "float32":
            per_tile = {"forward": 2, "backward": 5}[r["kernel"]]
            assert r["products"] == [per_tile] * len(r["loops"]), r
            assert (r["atomics"] > 0) == (r["kernel"] == "backward"), r


def test_one_multiply_add_a_score_in_the_forward(report):
    """The row maximum taken of the raw scores: a score's scale and the maximum's
    subtraction are one multiply-add (at least one fma an exponential), and the
    multiplies left rescale the output tile, d / B_k of them a score (a separate
    multiply a score, as when the max was taken after the scale, fails this)."""
    for r in report:
        if r["kernel"] == "forward" and r["dtype"] != "float32":
            assert r["fmas"] >= r["exponentials"] > 0, r
            assert r["multiplies"] <= r["d"] / r["config"][1] * r["exponentials"] + 16, r


def test_the_fallback_fits_a_t4():
    """FALLBACK fits a T4 (sm_75, 64 KB a program) where it needs the most shared memory
    of the kernels, two dtypes and d in {64, 128}: the backward in float32 at d = 128,
    multiplied as a T4 does, without TF32."""
    r, = fa.compile_flash_kernels([dict(arch="sm_75", dtype="float32", d=128,
                                        kernel="backward", config=fa.FALLBACK,
                                        precision="ieee")])
    assert r["shared"] <= fa.SHARED_MEMORY[75], r


def test_a_setting_too_large_for_an_l4_is_refused_and_the_fallback_fits():
    """Compiled for an L4 (sm_89, 99 KB a program) at d = 128, the forward's last
    setting needs more shared memory than the GPU has: Triton refuses it before the
    launch (OutOfResources, when the compiled kernel's shared memory exceeds the
    device's), and _launch runs FALLBACK, which fits, on tensor cores, spilling nothing."""
    large = fa.flash_configs("forward", 16, 128)[-1]
    first, fallback = fa.compile_flash_kernels([
        dict(arch="sm_89", dtype="bfloat16", d=128, kernel="forward", config=large),
        dict(arch="sm_89", dtype="bfloat16", d=128, kernel="backward",
             config=fa.FALLBACK)])
    assert first["shared"] > fa.SHARED_MEMORY[89], first
    assert fallback["shared"] <= fa.SHARED_MEMORY[89], fallback
    assert fallback["tensor_cores"] == "mma" and fallback["spill"] == 0, fallback


def test_the_fallback_is_the_t4s_setting():
    """A T4 has no tensor cores for Triton's products: a GPU before Ampere runs FALLBACK,
    whose kernels compiled for sm_75 in bfloat16 at d = 64 fit and spill at most 16 bytes
    a thread (the lists' first settings, made for tensor cores, spill kilobytes there,
    and take a minute each to compile)."""
    report = fa.compile_flash_kernels([dict(arch="sm_75", dtype="bfloat16", d=64,
                                            config=fa.FALLBACK)])
    assert [r["kernel"] for r in report] == list(fa.KERNELS)
    for r in report:
        assert r["tensor_cores"] == "none", r
        assert r["shared"] <= fa.SHARED_MEMORY[75] and r["spill"] <= 16, r
