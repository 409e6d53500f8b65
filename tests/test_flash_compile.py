"""FlashAttention's Triton kernels compiled for GPUs that are not here, and read.

Triton compiles for an NVIDIA GPU on any machine (its wheel brings ptxas and cuobjdump), so
what makes the kernels fast is checked without one: every loop pipelined (loads issued
ahead into shared memory buffers), no registers spilled in 16-bit at d <= 128, products
on tensor cores (float32's too, as three TF32 products). A representative subset: each
kernel's first setting in 16-bit at d = 128, where registers run shortest, for sm_90 (H100);
one kernel for sm_80 (A100) and one in float32. `python benchmarks/flash_attention.py
--compile-only --arch sm_90` (and sm_80) compiles every setting.
"""

import pytest

from tlm import flash_attention as fa

REASON = fa.flash_compile_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))


@pytest.fixture(scope="module")
def report():
    cases = [dict(arch="sm_90", dtype="bfloat16", d=128, kernel=kernel)
             for kernel in fa.KERNELS]
    cases += [dict(arch="sm_80", dtype="float16", d=64, kernel="forward"),
              dict(arch="sm_90", dtype="float32", d=64, kernel="forward")]
    return fa.compile_flash_kernels(cases)


def test_every_loop_is_pipelined(report):
    for r in report:
        assert r["loops"] and set(r["loops"]) == {"for"}, r
        assert r["async_copies"] > 0 and r["buffers"] >= 2, r


def test_no_spills_in_16_bit(report):
    for r in report:
        if r["dtype"] != "float32":
            assert r["spill"] == 0, r
            assert r["shared"] <= fa.SHARED_MEMORY[int(r["arch"][3:])], r


def test_the_products_run_on_tensor_cores(report):
    for r in report:  # wgmma: Hopper's warpgroup products; mma: Ampere's
        assert r["tensor_cores"] == {"sm_90": "wgmma", "sm_80": "mma"}[r["arch"]], r
    assert any(r["dtype"] == "float32" and r["precision"] == "tf32x3" for r in report)


def test_exp2_leaves_no_multiply_by_log2e_per_score(report):
    """log2(e) folded into the scale of the scores: the forward pass's exponentials are
    bare exp2; what multiplies by log2(e) is the log2 of each row's sum, a few times."""
    for r in report:
        if r["kernel"] == "forward":
            assert 0 < 8 * r["log2e_multiplies"] <= r["exponentials"], r


def test_the_fallback_fits_a_t4():
    """FALLBACK fits a T4 (sm_75, 64 KB a program) where it needs the most shared memory
    of the three kernels, two dtypes and d in {64, 128}: the dK, dV kernel in float32 at
    d = 128 (51,200 bytes with Triton 3.9), multiplied as a T4 does, without TF32."""
    r, = fa.compile_flash_kernels([dict(arch="sm_75", dtype="float32", d=128,
                                        kernel="dkdv", config=fa.FALLBACK,
                                        precision="ieee")])
    assert r["shared"] <= fa.SHARED_MEMORY[75], r


def test_a_setting_too_large_for_an_l4_is_refused_and_the_fallback_fits():
    """Compiled for an L4 (sm_89, 99 KB a program) at d = 128, the dQ kernel's first
    setting needs more shared memory than the GPU has: Triton refuses it before the
    launch (OutOfResources, when the compiled kernel's shared memory exceeds the
    device's), and _launch runs FALLBACK, which fits, on tensor cores, spilling nothing."""
    first, fallback = fa.compile_flash_kernels([
        dict(arch="sm_89", dtype="bfloat16", d=128, kernel="dq"),
        dict(arch="sm_89", dtype="bfloat16", d=128, kernel="dq", config=fa.FALLBACK)])
    assert tuple(first["config"]) == fa.flash_configs("dq", 16, 128)[0]
    assert first["shared"] > fa.SHARED_MEMORY[89], first
    assert fallback["shared"] <= fa.SHARED_MEMORY[89], fallback
    assert fallback["tensor_cores"] == "mma" and fallback["spill"] == 0, fallback


def test_the_fallback_is_the_t4s_setting():
    """A T4 has no tensor cores for Triton's products: a GPU before Ampere runs FALLBACK,
    whose three kernels compiled for sm_75 in bfloat16 at d = 64 fit and spill at most
    16 bytes a thread (the lists' first settings, made for tensor cores, spill kilobytes
    there, and take a minute each to compile)."""
    report = fa.compile_flash_kernels([dict(arch="sm_75", dtype="bfloat16", d=64,
                                            config=fa.FALLBACK)])
    assert [r["kernel"] for r in report] == list(fa.KERNELS)
    for r in report:
        assert r["tensor_cores"] == "none", r
        assert r["shared"] <= fa.SHARED_MEMORY[75] and r["spill"] <= 16, r
