import pytest
import torch

import tlm

CFG = dict(vocab_size=300, context_length=64, d_model=32, num_layers=2, num_heads=4, d_ff=64, rope_theta=10_000.0)


def make_model(dtype=torch.float64):
    torch.manual_seed(0)
    return tlm.TransformerLM(**CFG, dtype=dtype)


def test_cached_logits_equal_full_recomputation():
    model = make_model()
    ids = torch.randint(0, 300, (3, 20))
    with tlm.KVCache(model) as cache:
        parts = [model(ids[:, :7])]
        for t in range(7, 20):
            parts.append(model(ids[:, t : t + 1]))
        assert cache.seq_len == 20
    torch.testing.assert_close(torch.cat(parts, dim=1), model(ids), rtol=1e-10, atol=1e-10)


def test_cache_restores_layers_and_state_dict_even_after_an_error():
    model = make_model()
    keys = list(model.state_dict())
    originals = [block.attn for block in model.layers]
    with pytest.raises(RuntimeError, match="boom"):
        with tlm.KVCache(model):
            assert all(isinstance(block.attn, tlm.LayerKVCache) for block in model.layers)
            raise RuntimeError("boom")
    assert [block.attn for block in model.layers] == originals
    assert list(model.state_dict()) == keys
    ids = torch.randint(0, 300, (1, 5))
    with tlm.KVCache(model):
        model(ids)
    torch.testing.assert_close(model(ids), make_model()(ids))  # weights untouched


def test_cached_layer_continues_positions_and_offsets_the_mask():
    """One layer with a cache equals the layer on the full sequence, row for row."""
    attn = tlm.MultiHeadSelfAttention(32, 4, 16, 10_000.0, dtype=torch.float64)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    layer = tlm.LayerKVCache(attn, capacity=16)
    out = torch.cat([layer(x[:, :4]), layer(x[:, 4:5]), layer(x[:, 5:])], dim=1)
    torch.testing.assert_close(out, attn(x), rtol=1e-12, atol=1e-12)
    assert layer.seq_len == 9 and layer.k.shape == (2, 4, 16, 8)


def test_greedy_with_cache_equals_recomputing_prefix():
    model = make_model()
    prompt = torch.randint(0, 300, (2, 5))
    with_cache = tlm.generate(model, prompt, 30, temperature=0)
    without = tlm.generate(model, prompt, 30, temperature=0, use_cache=False)
    assert with_cache.shape == (2, 35) and torch.equal(with_cache[:, :5], prompt)
    assert torch.equal(with_cache, without)
    # and greedy means argmax of the full model at every step
    logits = model(with_cache[:, :-1])
    assert torch.equal(logits[:, 4:].argmax(-1), with_cache[:, 5:])


def test_seeded_sampling_reproducible_and_1d_prompt():
    model = make_model(torch.float32)
    prompt = torch.tensor([1, 2, 3])
    run = lambda seed: tlm.generate(model, prompt, 15, temperature=1.0, top_p=0.9, generator=torch.Generator().manual_seed(seed))
    assert run(0).shape == (18,)
    assert torch.equal(run(0), run(0)) and not torch.equal(run(0), run(1))


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15])
    # sorted: 0.4, 0.3, 0.15, 0.1, 0.05 -> cumulative 0.4, 0.7, 0.85, 0.95, 1.0
    cases = {0.3: {1}, 0.4: {1}, 0.41: {1, 3}, 0.7: {1, 3}, 0.71: {1, 3, 4}, 0.9: {0, 1, 3, 4}, 1.0: {0, 1, 2, 3, 4}}
    for p, kept in cases.items():
        out = tlm.top_p_filter(probs, p)
        assert set(out.nonzero().flatten().tolist()) == kept, p
        torch.testing.assert_close(out[list(kept)], probs[list(kept)] / probs[list(kept)].sum())
    # sampling never picks a filtered token
    logits = probs.log().repeat(2000, 1)
    # (0.65, not 0.7: softmax of the logs gives 0.4 + 0.3 as 0.69999996, which a float64
    # running sum keeps below 0.7)
    draws = tlm.sample_next(logits, 1.0, top_p=0.65, generator=torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {1, 3}


def test_temperature_zero_is_argmax_and_low_temperature_approaches_it():
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    assert tlm.sample_next(logits, 0).item() == 1
    draws = tlm.sample_next(logits.repeat(500, 1), 0.05, generator=torch.Generator().manual_seed(0))
    assert (draws == 1).all()


def test_stops_at_eos_and_at_context_length():
    """The end token stops generation; the context length does not: the window slides."""
    model = make_model()
    prompt = torch.randint(0, 300, (1, 4))
    free = tlm.generate(model, prompt, 20, temperature=0)
    eos = int(free[0, 7])  # the 4th generated token
    stopped = tlm.generate(model, prompt, 20, temperature=0, eos_id=eos)
    first = (free[0, 4:] == eos).nonzero()[0].item() + 4
    assert torch.equal(stopped[0], free[0, : first + 1])
    long = tlm.generate(model, prompt, 100, temperature=0)
    assert long.shape == (1, 104)  # past context_length=64, every token asked for
    assert torch.equal(long[:, :24], free)
    assert tlm.generate(model, prompt, 0).shape == (1, 4)


def cropped_loop(model, ids, max_new_tokens, pick):
    """The plain loop, predicting each token from the last context_length ids."""
    T = model.context_length
    with torch.no_grad():
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, pick(model(ids[:, -T:])[:, -1])[:, None]], dim=1)
    return ids


@pytest.mark.parametrize("prompt_len", [1, 5, 7, 8, 9, 20])
def test_past_the_context_the_window_slides_with_and_without_the_cache(prompt_len):
    torch.manual_seed(1)
    model = tlm.TransformerLM(**{**CFG, "context_length": 8}, dtype=torch.float64)
    prompt = torch.randint(0, 300, (2, prompt_len))
    greedy = [tlm.generate(model, prompt, 30, temperature=0, use_cache=c) for c in (True, False)]
    assert greedy[0].shape == (2, prompt_len + 30) and torch.equal(greedy[0][:, :prompt_len], prompt)
    assert torch.equal(greedy[0], greedy[1])
    assert torch.equal(greedy[0], cropped_loop(model, prompt, 30, lambda logits: logits.argmax(-1)))

    def sampled(use_cache):
        return tlm.generate(model, prompt, 30, temperature=1.0, top_p=0.95, use_cache=use_cache,
                            generator=torch.Generator().manual_seed(prompt_len))
    g = torch.Generator().manual_seed(prompt_len)
    oracle = cropped_loop(model, prompt, 30, lambda logits: tlm.sample_next(logits, 1.0, 0.95, g))
    assert torch.equal(sampled(True), oracle) and torch.equal(sampled(False), oracle)


def test_reset_empties_the_cache():
    model = make_model()
    ids = torch.randint(0, 300, (2, 10))
    with tlm.KVCache(model) as cache:
        model(ids[:, :6])
        cache.reset()
        assert cache.seq_len == 0 and all(layer.seq_len == 0 for layer in cache.layers)
        again = model(ids)  # from position 0, as if nothing had been cached
        assert cache.seq_len == 10
    torch.testing.assert_close(again, model(ids), rtol=1e-10, atol=1e-10)


def test_training_mode_restored_and_cache_capacity():
    model = make_model()
    model.train()
    tlm.generate(model, torch.tensor([1]), 3, temperature=0)
    assert model.training
    with tlm.KVCache(model, capacity=4) as cache:
        model(torch.tensor([[1, 2, 3]]))
        with pytest.raises(ValueError, match="the cache holds at most 4 positions, "
                                             "got 3 cached and 2 new"):
            model(torch.tensor([[4, 5]]))
    assert cache.seq_len == 3


def test_bad_inputs():
    model = make_model()
    prompt = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match="temperature must be a number >= 0"):
        tlm.generate(model, prompt, 5, temperature=-1)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        tlm.generate(model, prompt, 5, top_p=0)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0, got -1"):
        tlm.generate(model, prompt, -1)
    with pytest.raises(ValueError, match="eos_id must be an int"):
        tlm.generate(model, prompt, 5, eos_id=300)
    # the wrong kind of value is a TypeError, naming the argument and what came
    for kwargs, message in ((dict(temperature="0.5"), r"temperature must be a number >= 0 \(0 = greedy\), got str"),
                            (dict(top_p=True), r"top_p must be in \(0, 1\], got bool"),
                            (dict(eos_id=1.0), "eos_id must be an int >= 0, got float"),
                            (dict(max_new_tokens=2.0), "max_new_tokens must be an int >= 0, got float")):
        with pytest.raises(TypeError, match=message):
            tlm.generate(model, prompt, **{"max_new_tokens": 5, **kwargs})
    for use_cache in (True, False):  # before any draw, in both loops
        with pytest.raises(TypeError, match="generator must be a torch.Generator or "
                                            "None, got int"):
            tlm.generate(model, prompt, 5, temperature=1.0, generator=5,
                         use_cache=use_cache)
    with pytest.raises(ValueError, match="temperature must be a number >= 0 .*got nan"):
        tlm.generate(model, prompt, 5, temperature=float("nan"))
    with pytest.raises(ValueError, match=r"prompt_ids must lie in \[0, vocab_size=300\)"):
        tlm.generate(model, torch.tensor([[1, 300]]), 5)
    with pytest.raises(TypeError, match="prompt_ids must be an integer tensor"):
        tlm.generate(model, torch.tensor([[1.0]]), 5)
    with tlm.KVCache(model):
        model(torch.zeros(1, 60, dtype=torch.long))
        with pytest.raises(ValueError, match="at most 64 positions, got 60 cached and 5 new"):
            model(torch.zeros(1, 5, dtype=torch.long))
        with pytest.raises(ValueError, match="already has a KV cache attached"):
            tlm.KVCache(model)
    with pytest.raises(TypeError, match="model must be a tlm.TransformerLM"):
        tlm.KVCache(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="capacity must be at most context_length=64, got 65"):
        tlm.KVCache(model, capacity=65)
    with pytest.raises(ValueError, match="capacity must be a positive int, got 0"):
        tlm.KVCache(model, capacity=0)


def test_a_tiny_temperature_is_greedy_not_a_crash():
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 20
    for temperature in (1e-45, 1e-30, 1e-8):
        assert torch.equal(tlm.sample_next(logits, temperature,
                                           generator=torch.Generator().manual_seed(0)),
                           logits.argmax(dim=-1))
    ties = torch.tensor([[1.0, 5.0, 5.0, 0.0]])  # a tie stays a draw between the two
    drawn = {tlm.sample_next(ties, 1e-40, generator=torch.Generator().manual_seed(s)).item()
             for s in range(20)}
    assert drawn == {1, 2}


def test_top_k_keeps_the_k_largest_against_sorting():
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(5, 50, dtype=torch.float64), -1)
    for k in (1, 2, 7, 50, 80):
        out = tlm.top_k_filter(probs, k)
        # oracle: the k largest of each row by a full sort, renormalized
        order = probs.argsort(dim=-1, descending=True)[:, :min(k, 50)]
        expected = torch.zeros_like(probs).scatter(-1, order, probs.gather(-1, order))
        torch.testing.assert_close(out, expected / expected.sum(-1, keepdim=True))
    # a tie at the k-th value keeps every tied token
    tied = tlm.top_k_filter(torch.tensor([0.4, 0.2, 0.2, 0.2]), 2)
    torch.testing.assert_close(tied, torch.tensor([0.4, 0.2, 0.2, 0.2]))


def test_top_k_then_top_p_and_draws_stay_inside():
    probs = torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15])
    logits = probs.log().repeat(2000, 1)
    gen = lambda: torch.Generator().manual_seed(0)
    assert set(tlm.sample_next(logits, 1.0, generator=gen(), top_k=3).tolist()) == {1, 3, 4}
    # top-k 3 leaves 0.4, 0.3, 0.15 (renormalized 0.47, 0.35, 0.18): top-p 0.8 keeps two
    both = tlm.sample_next(logits, 1.0, top_p=0.8, generator=gen(), top_k=3)
    assert set(both.tolist()) == {1, 3}
    model = make_model(torch.float32)
    out = tlm.generate(model, torch.tensor([1, 2]), 20, top_k=1)
    assert torch.equal(out, tlm.generate(model, torch.tensor([1, 2]), 20, temperature=0))
    with pytest.raises(ValueError, match="top_k must be a positive int, got 0"):
        tlm.generate(model, torch.tensor([1, 2]), 5, top_k=0)
    with pytest.raises(TypeError, match="top_k must be a positive int, got float"):
        tlm.generate(model, torch.tensor([1, 2]), 5, top_k=2.0)


# ---- the decoding loop of fixed shapes, and its compiled step ----

from tlm.generation import generate_plain, _last_logits  # noqa: E402


@pytest.fixture
def traced_step(monkeypatch):
    """compile=True with Dynamo's capture of the whole step (fullgraph) but no code
    generation: what the compiled path computes, in a fraction of a second."""
    step = torch.compile(_last_logits, backend="eager", fullgraph=True, dynamic=False)
    monkeypatch.setitem(tlm.generation._COMPILED, "cpu", step)
    return step


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_fixed_size_cache_gives_the_plain_loops_tokens(impl, traced_step):
    """Greedy and seeded sampling, within and past the context (8), batch 2, grouped-query
    attention: the fast loop (eager, and with the step captured whole) equals the plain
    loop with and without its cache."""
    torch.manual_seed(1)
    model = tlm.TransformerLM(**{**CFG, "context_length": 8}, dtype=torch.float64,
                              attn_implementation=impl, num_kv_heads=2)
    for prompt_len, kw in ((1, dict(temperature=0)), (5, dict(temperature=0)),
                           (3, dict(temperature=1.0, top_p=0.95, top_k=50)),
                           (8, dict(temperature=0)), (20, dict(temperature=0.7))):
        prompt = torch.randint(0, 300, (2, prompt_len))

        def run(fn, **more):
            g = torch.Generator().manual_seed(prompt_len)
            return fn(model, prompt, 12, generator=g, **kw, **more)
        oracle = run(generate_plain, use_cache=False)
        assert torch.equal(run(generate_plain), oracle)
        assert torch.equal(run(tlm.generate), oracle)
        assert torch.equal(run(tlm.generate, compile=True), oracle)
        assert torch.equal(run(tlm.generate, use_cache=False), oracle)


def test_fixed_size_cache_stops_at_the_end_token_where_the_plain_loop_does(traced_step):
    """The end token is read back every few steps only; the result ends where the plain
    loop's ends, for every place of the last sequence's end token."""
    model = make_model()
    prompt = torch.randint(0, 300, (2, 4))
    free = generate_plain(model, prompt, 24, temperature=0)
    lengths = set()
    for rows in (prompt, prompt[1:]):  # two sequences, and the second alone
        for k in (0, 11, 12, 13):  # the loop reads every 16 ids: after 12 new ones
            eos = int(free[1, 4 + k])
            expected = generate_plain(model, rows, 24, temperature=0, eos_id=eos)
            lengths.add(expected.shape[-1])
            assert torch.equal(tlm.generate(model, rows, 24, temperature=0, eos_id=eos),
                               expected)
            assert torch.equal(tlm.generate(model, rows, 24, temperature=0, eos_id=eos,
                                            compile=True), expected)
    assert len(lengths) > 2  # it stopped early, at several places


def test_the_fast_loop_reads_nothing_from_the_device_while_greedy(monkeypatch):
    """No .item(), .tolist() or bool(tensor) inside the loop: the loop runs with
    Tensor.__bool__, item and tolist refused after the arguments are checked."""
    model = make_model()
    prompt = torch.randint(0, 300, (1, 3))
    expected = generate_plain(model, prompt, 12, temperature=0)
    calls = []
    original = tlm.generation._StaticKVCache.__enter__

    def enter(self):
        for name in ("__bool__", "item", "tolist"):
            monkeypatch.setattr(torch.Tensor, name,
                                lambda *a, name=name: calls.append(name))
        return original(self)
    monkeypatch.setattr(tlm.generation._StaticKVCache, "__enter__", enter)
    out = tlm.generate(model, prompt, 12, temperature=0)
    monkeypatch.undo()
    assert calls == [] and torch.equal(out, expected)


def test_compiled_step_with_inductor_gives_the_same_tokens():
    """The real compiler (Inductor's C++ code on the CPU) on a one-layer model."""
    torch.manual_seed(0)
    model = tlm.TransformerLM(**{**CFG, "num_layers": 1, "context_length": 16})
    prompt = torch.randint(0, 300, (1, 3))
    expected = generate_plain(model, prompt, 20, temperature=0)
    out = tlm.generate(model, prompt, 20, temperature=0, compile=True)
    assert torch.equal(out, expected)


def test_compile_refuses_bad_values():
    model = make_model()
    prompt = torch.tensor([[1, 2]])
    with pytest.raises(TypeError, match="compile must be a bool, got str"):
        tlm.generate(model, prompt, 5, compile="yes")
    with pytest.raises(TypeError, match="compile must be a bool, got int"):
        tlm.generate(model, prompt, 5, compile=1)
    with pytest.raises(ValueError, match="compile=True needs use_cache=True"):
        tlm.generate(model, prompt, 5, compile=True, use_cache=False)


def _causal_kernel(q, k, v):
    """A stand-in for a kernel of ATTN_KERNELS: causal (the last n of m), no bias."""
    n, m = q.shape[-2], k.shape[-2]
    keep = torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def test_kernels_refuse_a_bias_and_compile_refuses_a_kernel(monkeypatch):
    """A kernel masks causally itself: the fixed-size step's bias would be dropped and the
    query would see the empty slots. attend refuses the bias; generate refuses
    compile=True, and its eager loop (no bias) still gives the plain loop's tokens."""
    monkeypatch.setitem(tlm.attention.ATTN_KERNELS, "stand-in", _causal_kernel)
    torch.manual_seed(0)
    model = tlm.TransformerLM(**{**CFG, "context_length": 16},
                              attn_implementation="stand-in")
    attn = model.layers[0].attn
    q = k = v = torch.randn(1, 4, 3, attn.d_k)
    with pytest.raises(ValueError, match="attn_implementation='stand-in' takes no bias"):
        attn.attend(q, k, v, torch.zeros(3, 3))
    prompt = torch.randint(0, 300, (1, 3))
    with pytest.raises(ValueError, match="compile=True needs attn_implementation 'eager' "
                                         "or 'sdpa'.*got 'stand-in'"):
        tlm.generate(model, prompt, 5, compile=True)
    expected = generate_plain(model, prompt, 20, temperature=0)
    assert torch.equal(tlm.generate(model, prompt, 20, temperature=0), expected)


def test_too_many_compiled_variants_go_on_eagerly(traced_step):
    """Past torch.compile's recompile limit a fullgraph step raises; generate warns and
    finishes eagerly, with the same tokens."""
    torch._dynamo.reset()
    model = make_model()
    with torch._dynamo.config.patch(recompile_limit=1):
        for batch in (1, 2):  # the second batch size needs a second variant
            prompt = torch.randint(0, 300, (batch, 3))
            expected = generate_plain(model, prompt, 10, temperature=0)
            if batch == 1:
                out = tlm.generate(model, prompt, 10, temperature=0, compile=True)
            else:
                with pytest.warns(UserWarning, match="too many variants"):
                    out = tlm.generate(model, prompt, 10, temperature=0, compile=True)
            assert torch.equal(out, expected)
    torch._dynamo.reset()


def _eos_after(model, prompt, k):
    """The id greedy decoding produces k-th (1-based) after the prompt: an end token
    that stops the run there."""
    return int(generate_plain(model, prompt, k, temperature=0)[0, prompt.shape[-1] + k - 1])


@pytest.mark.parametrize("max_new_tokens", [10**10, 10**20])
def test_a_huge_max_new_tokens_with_an_end_token_stops_there(max_new_tokens):
    """"Until the end token" is a large max_new_tokens: the fast loop must not reserve
    room for all of it up front (10**10 ids were an 80 GB allocation, 10**20 a C++
    overflow) and must stop where the plain loop stops."""
    torch.manual_seed(0)
    model = tlm.TransformerLM(**{**CFG, "context_length": 8})
    prompt = torch.randint(0, 300, (1, 3))
    eos = _eos_after(model, prompt, 20)
    expected = generate_plain(model, prompt, max_new_tokens, temperature=0, eos_id=eos)
    assert expected.shape[1] <= 3 + 20
    out = tlm.generate(model, prompt, max_new_tokens, temperature=0, eos_id=eos)
    assert torch.equal(out, expected)
    assert out.untyped_storage().nbytes() <= 8 * (3 + 1024)  # a first allocation


def test_an_early_stop_returns_ids_of_their_own():
    """Stopped by the end token, the result is no view of the larger buffer the loop
    wrote into (non-contiguous for a batch of two): it holds its ids only, and .view
    works on it as on the plain loop's."""
    torch.manual_seed(0)
    model = tlm.TransformerLM(**{**CFG, "context_length": 8})
    prompt = torch.randint(0, 300, (1, 3)).repeat(2, 1)  # both rows end together
    eos = _eos_after(model, prompt[:1], 6)
    expected = generate_plain(model, prompt, 100, temperature=0, eos_id=eos)
    out = tlm.generate(model, prompt, 100, temperature=0, eos_id=eos)
    assert torch.equal(out, expected) and out.shape == (2, 3 + 6)
    assert out.is_contiguous() and out.view(-1).shape == (18,)
    assert out.untyped_storage().nbytes() == out.numel() * out.element_size()


def test_the_output_grows_past_its_first_allocation(monkeypatch):
    """With room for 4 new ids at first, 37 new ids (greedy and sampled, batch 2, past
    the context) are the plain loop's."""
    monkeypatch.setattr(tlm.generation, "_FIRST_ROOM", 4)
    torch.manual_seed(0)
    model = tlm.TransformerLM(**{**CFG, "context_length": 8})
    prompt = torch.randint(0, 300, (2, 5))
    for kw in (dict(temperature=0), dict(temperature=0.9, top_p=0.9)):
        expected = generate_plain(model, prompt, 37, generator=torch.Generator()
                                  .manual_seed(1), **kw)
        out = tlm.generate(model, prompt, 37, generator=torch.Generator().manual_seed(1),
                           **kw)
        assert out.shape == (2, 5 + 37) and torch.equal(out, expected)


@pytest.mark.parametrize("temperature", [1e-46, 5e-324, 2.0**-150])
def test_a_temperature_that_float32_rounds_to_zero_is_greedy(temperature):
    """Below half of float32's smallest number a positive temperature becomes 0 in the
    logits' float32, and (x - max) / 0 was nan for multinomial: the limit is greedy."""
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 5
    drawn = tlm.sample_next(logits, temperature, generator=torch.Generator().manual_seed(0))
    assert torch.equal(drawn, logits.argmax(dim=-1))
    model = make_model(torch.float32)
    prompt = torch.randint(0, 300, (2, 4))
    assert torch.equal(tlm.generate(model, prompt, 6, temperature=temperature),
                       tlm.generate(model, prompt, 6, temperature=0))


@pytest.mark.parametrize("top_p", [1e-46, 1e-300, 5e-324])
def test_a_top_p_that_float32_rounds_to_zero_keeps_the_most_likely_token(top_p):
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(4, 30) * 3, dim=-1)
    kept = tlm.top_p_filter(probs, top_p)
    assert torch.equal(kept, torch.nn.functional.one_hot(probs.argmax(-1), 30).float())
    model = make_model(torch.float32)
    prompt = torch.randint(0, 300, (2, 4))
    out = tlm.generate(model, prompt, 6, temperature=1.0, top_p=top_p,
                       generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, tlm.generate(model, prompt, 6, temperature=0))


def test_top_p_one_keeps_every_token():
    """A float32 running sum reaches 1 before the last of 50,257 tokens: top_p=1 must
    still keep them all (it dropped up to 49,441 tokens of a row, by 2.5e-7 of mass)."""
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(8, 50257) * 4, dim=-1)
    assert bool((probs > 0).all())
    assert torch.equal(tlm.top_p_filter(probs, 1.0), probs)


def test_top_p_just_below_one_drops_no_more_than_its_share():
    """Tokens past the nucleus are dropped only when the mass ranked above them reaches
    top_p: with top_p = 1 - 1e-9 a float32 running sum dropped 4.6e-6 of the mass of
    each row (thousands of tokens). Oracle: the float64 mass of what was dropped."""
    probs = torch.softmax(3 * torch.randn(64, 50257, generator=torch.Generator()
                                          .manual_seed(0)), dim=-1)
    for top_p in (1 - 1e-9, 1 - 1e-6, 0.999):
        kept = tlm.top_p_filter(probs, top_p)
        dropped = (probs.double() * (kept == 0)).sum(dim=-1)
        total = probs.double().sum(dim=-1)  # 1 to float32's rounding
        assert bool((dropped <= 1 - top_p + (total - 1).abs() + 1e-12).all()), top_p


def _failing_backend(gm, example_inputs):
    raise torch._inductor.exc.InvalidCxxCompiler("g++")  # Inductor, without g++


def test_a_compiler_that_cannot_build_warns_and_goes_on_eagerly(monkeypatch):
    """No C++ compiler (a slim Docker image, macOS without Xcode's tools): one warning,
    then the eager step, with the same tokens."""
    step = torch.compile(tlm.generation._last_logits, backend=_failing_backend,
                         fullgraph=True, dynamic=False)
    monkeypatch.setitem(tlm.generation._COMPILED, "cpu", step)
    model = make_model()
    prompt = torch.randint(0, 300, (2, 3))
    expected = generate_plain(model, prompt, 10, temperature=0)
    with pytest.warns(UserWarning) as caught:
        out = tlm.generate(model, prompt, 10, temperature=0, compile=True)
    assert torch.equal(out, expected)
    messages = [str(w.message) for w in caught if w.category is UserWarning]
    assert len(messages) == 1 and messages[0].startswith(
        "torch.compile: it cannot build the decoding step here (")
    assert "InvalidCxxCompiler" in messages[0] and messages[0].endswith("going on eagerly")
    assert "\n" not in messages[0]
    torch._dynamo.reset()
