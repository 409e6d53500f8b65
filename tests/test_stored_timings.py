"""What the prose says about a stored timing holds for the stored output, and the README quotes
the stored outputs verbatim.

Timing cells are machine-dependent (`# NBVAL_IGNORE_OUTPUT`), so nbval does not compare a re-run
with them. These tests read the committed notebooks instead: a re-execution whose timings
contradict a sentence of the chapter (or of the README) fails here before it can be committed.
"""

import re
import sys
from pathlib import Path

import nbformat
import pytest

from tlm.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent


def stored_output(chapter: str, marker: str) -> str:
    """The printed output of the one code cell of `chapter` whose source contains `marker`."""
    cells = [c for c in nbformat.read(ROOT / "chapters" / chapter, as_version=4).cells
             if c.cell_type == "code" and marker in c.source]
    assert len(cells) == 1, f"{chapter}: {len(cells)} cells contain {marker!r}"
    assert cells[0].execution_count is not None, f"{chapter}: the timing cell never ran"
    return "".join(o.get("text", "") for o in cells[0].outputs if o.output_type == "stream")


def numbers(text: str, pattern: str) -> dict[str, tuple[float, ...]]:
    """{first group: the other groups as floats} for every line matching `pattern`."""
    found = {}
    for line in text.splitlines():
        m = re.match(pattern, line)
        if m:
            found[m.group(1).strip()] = tuple(float(g) for g in m.groups()[1:])
    return found


MEDIAN_MS = r"^(.*?)\s+forward \+ backward:\s+([\d.]+) ms"


def test_fast_bpe_training_is_the_faster_as_the_tokenizer_chapter_says():
    text = stored_output("14_tokenizer.ipynb", '"plain": lambda: plain_train_bpe(sample')
    t = numbers(text, r"^(plain|fast)\s+training on .*?: ([\d.]+) s")
    assert set(t) == {"plain", "fast"}, text
    assert t["fast"][0] < t["plain"][0] / 3  # "faster by far"


def test_tokenizer_speeds_as_the_tokenizer_chapter_says():
    text = stored_output("14_tokenizer.ipynb", "def hf_train():")
    m = re.search(r"tlm ([\d.]+) s, tokenizers ([\d.]+) s", text)
    rates = numbers(text, r"^\s+(tlm, first pass|tlm, second pass|tiktoken)\s+([\d.]+) MB/s")
    cached = re.search(r"caches the plays' ([\d,]+) distinct pre-tokens", text)
    assert m and len(rates) == 3 and cached, text
    ours_s, hf_s = map(float, m.groups())
    assert hf_s < ours_s < 30  # Rust faster; under half a minute
    first, second, tiktoken_mb = (rates[k][0] for k in ("tlm, first pass", "tlm, second pass",
                                                         "tiktoken"))
    assert first < second < tiktoken_mb  # Rust faster; the first pass is the slower
    assert int(cached.group(1).replace(",", "")) < Tokenizer.CACHE_SIZE  # "all fit"



def test_the_addition_model_trains_in_under_a_minute_as_the_training_chapter_says():
    text = stored_output("15_training.ipynb", "model, history = train_addition_model(device")
    m = re.search(r"^600 steps in ([\d.]+) s on cpu", text, re.M)
    assert m, text
    assert float(m.group(1)) < 60  # "in under a minute" on the CPU


@pytest.mark.parametrize("chapter, marker", [
    ("05_rmsnorm.ipynb", 'versions = {"handout": HandoutRMSNorm(256'),
    ("08_softmax.ipynb", 'steps = {name: (lambda fn=fn: fn(big, -1).backward(upstream))'),
    ("09_attention.ipynb", '"handout": lambda: handout_attention(q_t, k_t, v_t, causal_t)'),
])
def test_the_exported_version_is_the_faster_as_the_chapter_says(chapter, marker):
    t = numbers(stored_output(chapter, marker), MEDIAN_MS)
    assert set(t) == {"handout", "tlm"}, t
    assert t["tlm"][0] < t["handout"][0], t


def test_rope_timings_rank_as_the_chapter_says():
    """The complex multiplication is the fastest of the four; tlm beats the handout's."""
    t = numbers(stored_output("07_rope.ipynb", '"complex multiplication": as_complex'),
                r"^(.*?)\s+fwd \+ bwd:\s+([\d.]+) ms")
    assert len(t) == 4, t
    assert min(t, key=t.get) == "complex multiplication", t
    assert t["tlm (rotation, back)"] < t["handout (strided slices)"], t


def generation_timings() -> dict[str, tuple[float, ...]]:
    """{name: (total s, ms per token over tokens 1-50, over the last 50)}."""
    text = stored_output("16_generation.ipynb", "def greedy_run(name: str):")
    return numbers(text, r"^(with the cache|recomputing)\s+([\d.]+) s\s+([\d.]+)\s+([\d.]+)$")


def test_the_cache_saves_time_as_the_generation_chapter_says():
    t = generation_timings()
    cached, recomputed = t["with the cache"], t["recomputing"]
    assert cached[0] < recomputed[0]  # less time in total
    assert recomputed[2] > recomputed[1]  # recomputing: the last tokens cost more
    assert cached[1] < recomputed[1] and cached[2] < recomputed[2]
    assert cached[2] / cached[1] < recomputed[2] / recomputed[1]  # grows much more slowly


def test_the_fast_decoding_loop_as_the_generation_chapter_says():
    """"the fixed-size loop is a little faster than the plain loop and the compiled step
    about three times faster"."""
    text = stored_output("16_generation.ipynb", 'loops = {"plain loop"')
    t = numbers(text, r"^(plain loop|fixed-size cache|compiled step)\s+(\d+) tokens/s"
                      r"\s+time / plain loop ([\d.]+)$")
    assert len(t) == 3, text
    assert 0.7 < t["fixed-size cache"][1] < 1, t  # a little faster
    assert 0.25 < t["compiled step"][1] < 0.42, t  # about three times (2.4 to 4)


PERF = "20_performance.ipynb"


def test_llama_comparison_as_the_performance_chapter_says():
    text = stored_output(PERF, "times = tlm.time_alternating(steps, repeats=7")
    t = numbers(text, r"^(tlm eager|HF eager|tlm sdpa|HF sdpa)\s+([\d.]+) ms")
    assert len(t) == 4, text
    assert re.match(r"cpu, torch .*, 2 threads$", text.splitlines()[0]), text  # "a 2-core CPU"
    assert abs(t["tlm sdpa"][0] / t["HF sdpa"][0] - 1) < 0.10  # "to within 10%"
    assert t["tlm sdpa"] < t["tlm eager"] and t["HF sdpa"] < t["HF eager"]  # sdpa is faster


def test_fused_silu_and_index_select_as_the_performance_chapter_says():
    text = stored_output(PERF, '"silu: F.silu (fused)": lambda: F.silu(h).backward(g_h)')
    t = numbers(text, r"^(.*?)\s+fwd \+ bwd\s+([\d.]+) ms")
    assert t["silu: F.silu (fused)"] < t["silu: x * sigmoid(x) (tlm)"], t
    assert t["embedding: index_select (tlm)"] < t["embedding: weight[ids]"], t
    share = re.search(r"^\s+\+([\d.]+) ms per training step, ([\d.]+)% of tlm sdpa's", text,
                      re.M)
    assert share, text
    assert float(share.group(2)) < 5  # "less than 5% of" the step, estimated for 4 layers


def test_matrix_products_dominate_the_profile_as_the_performance_chapter_says():
    text = stored_output(PERF, "with quiet_fds(), profile(activities=activities) as prof:")
    share = numbers(text, r"^(aten::\w+)\s+([\d.]+)%")
    assert share.get("aten::mm", (0,))[0] + share.get("aten::bmm", (0,))[0] > 50, text


def test_whole_model_step_as_the_performance_chapter_says():
    text = stored_output(PERF, "whole_times = tlm.time_alternating(whole_steps")
    t = numbers(text, r"^(.*?)\s+([\d.]+) ms\s+([\d.]+)\s+([\d.]+)$")  # ms, ratio, per round
    assert set(t) == {"handout model", "tlm eager", "tlm sdpa", "tlm sdpa, compiled"}, text
    assert abs(t["tlm eager"][2] - 1) < 0.10  # the handout model: "the same time", per round
    assert t["tlm sdpa"][0] < t["tlm eager"][0]  # the fused kernel "makes the step faster"
    compiled = re.search(r"^tlm sdpa, compiled / tlm sdpa: ([\d.]+)$", text, re.M)
    assert compiled, text
    assert abs(float(compiled.group(1)) - 1) < 0.20, text  # "by less than 20%"
    steps = re.search(r"compiling \(the first call\): ([\d.]+) s, the time of (\d+) compiled",
                      text)
    assert steps and int(steps.group(2)) > 20, text  # "longer than 20 compiled steps"


def test_fused_qkv_buys_nothing_as_the_performance_chapter_says():
    text = stored_output(PERF, "def fused(x):")
    t = numbers(text, r"^(projections.*?)\s+([\d.]+) ms\s+([\d.]+) ms\s+([\d.]+)$")
    assert set(t) == {"projections + attention, fwd+bwd", "projections, one token"}, text
    for separate_ms, fused_ms, ratio in t.values():  # "not 10% faster", in both cases
        assert ratio > 0.9  # the printed ratio, not the rounded times


def test_attention_sweep_as_the_performance_chapter_says():
    text = stored_output(PERF, "sweep = tlm.attention_sweep(seq_lens, device=device)")
    ms = {}
    for line in text.splitlines():
        m = re.match(r"^T=\s*(\d+) (eager|sdpa)\s+([\d.]+) ms", line)
        if m:
            ms[int(m.group(1)), m.group(2)] = float(m.group(3))
    lengths = sorted({T for T, _ in ms})
    assert lengths == [128, 256, 512, 1024, 2048], text
    assert all(ms[T, "sdpa"] < ms[T, "eager"] for T in lengths)  # faster at every length
    for impl in ("eager", "sdpa"):  # more than twice the time for twice the length
        assert ms[2048, impl] > 2 * ms[1024, impl]
        assert all(ms[a, impl] < ms[b, impl] for a, b in zip(lengths, lengths[1:]))
    mib = {(int(T), impl): float(x) for T, impl, x in re.findall(
        r"^T=\s*(\d+) (eager|sdpa).*?saved for backward\s+([\d.]+) MiB", text, re.M)}
    assert abs(mib[2048, "eager"] - mib[2048, "sdpa"] - 126) < 2  # "about 126 MiB"


def test_grouped_query_decoding_as_the_architectures_chapter_says():
    text = stored_output("23_architectures.ipynb", "times = tlm.time_alternating(decode")
    t = numbers(text, r"^g = (\d+):\s+([\d.]+) ms per decoding step.*?([\d.]+)x the speed")
    assert set(t) == {"8", "2", "1"}, text
    assert 1 < t["2"][1] < 4 and 1 < t["1"][1] < 8  # faster, by less than the bytes saved


# The README quotes stored outputs verbatim, as fenced blocks that tools/quote_outputs.py
# refreshes from the chapters (`make execute` runs it after re-executing them).
sys.path.insert(0, str(ROOT / "tools"))
import quote_outputs  # noqa: E402


def test_the_readme_quotes_the_stored_outputs_verbatim():
    counts = {}
    for path in quote_outputs.FILES:
        text = path.read_text()
        counts[path.name if path.parent == ROOT else "benchmarks"] = len(
            quote_outputs.QUOTE.findall(text))
        assert quote_outputs.refresh(text) == text, \
            f"{path} quotes differ from the stored outputs: run python tools/quote_outputs.py"
    # the README's headline figures and the benchmark page quote the chapters
    assert counts["README.md"] >= 2 and counts["benchmarks"] >= 5, counts


def test_the_quote_check_notices_a_changed_number():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    quote = next(q for q in quote_outputs.QUOTE.finditer(readme) if re.search(r"\d", q[4]))
    digit = re.search(r"\d", quote[4]).start() + quote.start(4)
    changed = readme[:digit] + str((int(readme[digit]) + 1) % 10) + readme[digit + 1:]
    assert quote_outputs.refresh(changed) != changed
