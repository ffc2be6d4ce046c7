"""Bad input gives a ValueError whose message names the problem."""
import numpy as np
import pytest

from transformer_lab import (TINY, TINY_GPT2, KVCache, apply_rope, attention_core,
                             attention_weights, check_params, forward, generate, init_params, loss,
                             rope_angles)


@pytest.fixture(scope="module")
def params():
    return init_params(TINY, seed=0)


def ok_tokens(T=4, B=1):
    return np.random.default_rng(0).integers(0, TINY.vocab, size=(B, T))


# ------------------------------------------------------------------ tokens

def test_float_tokens(params):
    with pytest.raises(ValueError, match=r"integer"):
        forward(params, TINY, np.array([[1.0, 2.0, 3.0]]))


@pytest.mark.parametrize("bad", [-1, TINY.vocab, TINY.vocab + 10])
def test_token_out_of_range(params, bad):
    toks = ok_tokens()
    toks[0, 2] = bad
    with pytest.raises(ValueError, match=rf"{bad}.*out of range.*\[0, {TINY.vocab}\)"):
        forward(params, TINY, toks)


@pytest.mark.parametrize("shape", [(4,), (1, 2, 3)])
def test_tokens_not_2d(params, shape):
    with pytest.raises(ValueError, match=r"2-D"):
        forward(params, TINY, np.zeros(shape, dtype=np.int64))


def test_sequence_longer_than_max_seq(params):
    with pytest.raises(ValueError, match=r"max_seq"):
        forward(params, TINY, np.zeros((1, TINY.max_seq + 1), dtype=np.int64))
    # exactly max_seq is fine
    assert forward(params, TINY, np.zeros((1, TINY.max_seq), dtype=np.int64)).shape[1] == TINY.max_seq


# ------------------------------------------------------------------ cache

def test_cache_longer_than_max_seq():
    with pytest.raises(ValueError, match=r"max_len.*max_seq"):
        KVCache(TINY, 1, TINY.max_seq + 1)


@pytest.mark.parametrize("kw", [dict(batch=0), dict(batch=1, max_len=0), dict(batch=1.5)])
def test_cache_bad_sizes(kw):
    with pytest.raises(ValueError, match=r"batch|max_len"):
        KVCache(TINY, **kw)


def test_overflowing_a_cache(params):
    cache = KVCache(TINY, 1, 5)
    forward(params, TINY, ok_tokens(3), cache=cache)
    with pytest.raises(ValueError, match=r"cache.*full|max_len"):
        forward(params, TINY, ok_tokens(3), cache=cache)
    assert cache.length == 3  # the failed call did not advance it
    forward(params, TINY, ok_tokens(2), cache=cache)
    assert cache.length == 5
    with pytest.raises(ValueError, match=r"cache.*full|max_len"):
        forward(params, TINY, ok_tokens(1), cache=cache)


def test_cache_batch_mismatch(params):
    cache = KVCache(TINY, 2, 8)
    with pytest.raises(ValueError, match=r"batch"):
        forward(params, TINY, ok_tokens(3, B=1), cache=cache)


def test_cache_for_another_config(params):
    cache = KVCache(TINY_GPT2, 1, 8)
    with pytest.raises(ValueError, match=r"cache"):
        forward(params, TINY, ok_tokens(3), cache=cache)


# ------------------------------------------------------------------ attention_core

def qkv(B=1, T=3, S=3, H=4, G=2, D=4, Dk=None):
    rng = np.random.default_rng(1)
    Dk = D if Dk is None else Dk
    return (rng.normal(size=(B, T, H, D)), rng.normal(size=(B, S, G, Dk)),
            rng.normal(size=(B, S, G, Dk)))


def test_rank_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"\[B,T,H,D\]"):
        attention_core(q[0], k, v)
    with pytest.raises(ValueError, match=r"\[B,S,G,D\]"):
        attention_core(q, k[0], v)
    with pytest.raises(ValueError, match=r"\[B,S,G,D\]"):
        attention_core(q, k, v[..., None])
    with pytest.raises(ValueError, match=r"\[B,T,H,D\]"):
        attention_weights(q[0], k)


def test_head_dim_mismatch():
    q, _, _ = qkv()
    _, k, v = qkv(Dk=6)
    with pytest.raises(ValueError, match=r"head_dim"):
        attention_core(q, k, v)


def test_k_v_shape_and_batch_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"same shape"):
        attention_core(q, k, v[:, :2])
    q2, k2, v2 = qkv(B=2)
    with pytest.raises(ValueError, match=r"batch"):
        attention_core(q2, k, v)


def test_heads_not_multiple_of_groups():
    q, k, v = qkv(H=4, G=3)
    with pytest.raises(ValueError, match=r"H=4.*multiple.*G=3"):
        attention_core(q, k, v)


def test_offset_plus_t_exceeds_s():
    q, k, v = qkv(T=3, S=4)
    attention_core(q, k, v, 1)  # 1 + 3 == 4 is fine
    with pytest.raises(ValueError, match=r"offset.*exceeds S"):
        attention_core(q, k, v, 2)
    with pytest.raises(ValueError, match=r"offset.*exceeds S"):
        attention_core(*qkv(T=4, S=3))
    with pytest.raises(ValueError, match=r"offset"):
        attention_core(q, k, v, -1)


@pytest.mark.parametrize("fn", ["core", "weights"])
@pytest.mark.parametrize("bad", [0.7, 2.0, "1", None, np.float64(1.0)])
def test_offset_must_be_an_integer(fn, bad):
    q, k, v = qkv(T=2, S=4)
    call = (lambda: attention_core(q, k, v, bad)) if fn == "core" else (
        lambda: attention_weights(q, k, bad))
    with pytest.raises(ValueError, match=r"offset must be an integer .*got " + repr(bad)[:3]):
        call()
    # NumPy integers, as a cache might hold, are integers.
    attention_core(q, k, v, np.int64(2))


def test_zero_kv_heads():
    q, k, v = qkv(H=4, G=0)
    with pytest.raises(ValueError, match=r"G=0 K/V heads"):
        attention_core(q, k, v)
    with pytest.raises(ValueError, match=r"G=0 K/V heads"):
        attention_weights(q, k)


def test_no_keys_without_the_causal_mask():
    q, k, v = qkv(T=3, S=0)
    with pytest.raises(ValueError, match=r"S=0 keys.*at least one key"):
        attention_core(q, k, v, causal=False)
    with pytest.raises(ValueError, match=r"S=0 keys"):
        attention_weights(q, k, causal=False)
    with pytest.raises(ValueError, match=r"exceeds S = 0"):  # with the mask: the offset check
        attention_core(q, k, v)


# ------------------------------------------------------------------ rope

@pytest.mark.parametrize("D", [3, 7, 1, 0])
def test_rope_angles_odd_head_dim(D):
    with pytest.raises(ValueError, match=r"head_dim"):
        rope_angles([0, 1], D)


def test_apply_rope_odd_head_dim():
    x = np.zeros((2, 1, 5))
    cos, sin = rope_angles([0, 1], 4)
    with pytest.raises(ValueError, match=r"even head_dim"):
        apply_rope(x, cos, sin)


def test_apply_rope_cos_sin_mismatch():
    x = np.zeros((1, 3, 2, 8))
    cos, sin = rope_angles([0, 1, 2], 8)
    wrong_T = rope_angles([0, 1], 8)
    wrong_D = rope_angles([0, 1, 2], 6)
    with pytest.raises(ValueError, match=r"cos/sin must be \[T, D/2\]"):
        apply_rope(x, *wrong_T)
    with pytest.raises(ValueError, match=r"cos/sin must be \[T, D/2\]"):
        apply_rope(x, *wrong_D)
    with pytest.raises(ValueError, match=r"cos/sin must be \[T, D/2\]"):
        apply_rope(x, cos, wrong_T[1])


def test_apply_rope_rank_too_small():
    cos, sin = rope_angles([0], 4)
    with pytest.raises(ValueError, match=r"\[\.\.\., T, H, D\]"):
        apply_rope(np.zeros((1, 4)), cos, sin)


def test_rope_positions_not_1d_or_2d():
    with pytest.raises(ValueError, match=r"positions must be 1-D \[T\] or 2-D \[B, T\]"):
        rope_angles([[[0, 1]]], 4)


# ------------------------------------------------------------------ params

def test_params_missing_key():
    p = init_params(TINY, seed=0)
    del p["blocks"][1]["attn"]["wk"]
    with pytest.raises(ValueError, match=r"missing blocks\[1\]\.attn\.wk"):
        forward(p, TINY, ok_tokens())
    with pytest.raises(ValueError, match=r"blocks\[1\]\.attn\.wk"):
        check_params(p, TINY)


def test_params_missing_top_level_key():
    p = init_params(TINY_GPT2, seed=0)
    del p["pos_emb"]
    with pytest.raises(ValueError, match=r"missing pos_emb"):
        forward(p, TINY_GPT2, ok_tokens())


def test_params_wrong_shape():
    p = init_params(TINY, seed=0)
    p["blocks"][0]["mlp"]["w_down"] = np.zeros((TINY.d_ff, TINY.d_model + 1))
    with pytest.raises(ValueError, match=r"blocks\[0\]\.mlp\.w_down.*shape.*\(64, 33\).*\(64, 32\)"):
        forward(p, TINY, ok_tokens())


def test_params_for_another_config():
    p = init_params(TINY, seed=0)
    with pytest.raises(ValueError, match=r"params"):
        check_params(p, TINY_GPT2)


def test_params_wrong_number_of_blocks():
    p = init_params(TINY, seed=0)
    p["blocks"] = p["blocks"][:1]
    with pytest.raises(ValueError, match=r"blocks"):
        forward(p, TINY, ok_tokens())


def test_params_with_keys_the_config_does_not_have():
    # TINY has bias=False: biases added by hand used to pass the check and move the logits.
    p = init_params(TINY, seed=0)
    p["blocks"][0]["attn"]["bq"] = np.ones(TINY.d_model)
    p["lm_head"]["b"] = np.full(TINY.vocab, 3.0)
    with pytest.raises(ValueError, match=r"params has blocks\[0\]\.attn\.bq, .*does not have"):
        forward(p, TINY, ok_tokens())
    del p["blocks"][0]["attn"]["bq"]
    with pytest.raises(ValueError, match=r"params has lm_head\.b, .*bias=False"):
        check_params(p, TINY)


def test_params_with_several_extra_keys_names_them_all():
    p = init_params(TINY, seed=0)
    p["extra"] = np.zeros(3)
    p["blocks"][1]["mlp"]["b_up"] = np.zeros(TINY.d_ff)
    with pytest.raises(ValueError, match=r"params has blocks\[1\]\.mlp\.b_up"):
        check_params(p, TINY)
    del p["blocks"][1]["mlp"]["b_up"]
    with pytest.raises(ValueError, match=r"params has extra,"):
        check_params(p, TINY)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int64, np.complex128])
def test_params_of_another_dtype(dtype):
    # TINY is float64: float16 params used to run silently in it; ints and complex too.
    p = init_params(TINY, seed=0)
    p["blocks"][1]["mlp"]["w_up"] = p["blocks"][1]["mlp"]["w_up"].astype(dtype)
    name = np.dtype(dtype).name
    with pytest.raises(ValueError, match=rf"blocks\[1\]\.mlp\.w_up has dtype {name}.*float64"):
        forward(p, TINY, ok_tokens())


def test_params_that_are_not_arrays():
    p = init_params(TINY, seed=0)
    p["final_norm"]["weight"] = p["final_norm"]["weight"].tolist()
    with pytest.raises(ValueError, match=r"final_norm\.weight has shape None"):
        check_params(p, TINY)


# ------------------------------------------------------------------ generate and loss

def test_generate_overflowing_max_seq(params):
    prompt = ok_tokens(10)
    with pytest.raises(ValueError, match=r"max_new_tokens.*max_seq"):
        generate(params, TINY, prompt, TINY.max_seq - 9)
    assert generate(params, TINY, prompt, TINY.max_seq - 10, greedy=True).shape[1] == TINY.max_seq


@pytest.mark.parametrize("bad", [0, -1, TINY.vocab + 1, 2.5, "3", True, False])
def test_bad_top_k(params, bad):
    with pytest.raises(ValueError, match=r"top_k"):
        generate(params, TINY, ok_tokens(), 2, top_k=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_max_new_tokens(params, bad):
    with pytest.raises(ValueError, match=r"max_new_tokens"):
        generate(params, TINY, ok_tokens(), bad)


@pytest.mark.parametrize("bad", [-1.0, "0.5", None, float("nan"), float("inf"), True])
def test_bad_temperature(params, bad):
    with pytest.raises(ValueError, match=r"temperature"):
        generate(params, TINY, ok_tokens(), 2, temperature=bad)
    with pytest.raises(ValueError, match=r"temperature"):
        generate(params, TINY, ok_tokens(), 2, temperature=bad, greedy=True)


@pytest.mark.parametrize("bad", [-1, 1.5, "7", True])
def test_bad_seed(params, bad):
    with pytest.raises(ValueError, match=r"seed must be None or an int >= 0"):
        generate(params, TINY, ok_tokens(), 2, seed=bad)


def test_good_seeds(params):
    a = generate(params, TINY, ok_tokens(), 3, seed=0)
    np.testing.assert_array_equal(a, generate(params, TINY, ok_tokens(), 3, seed=np.int64(0)))
    np.testing.assert_array_equal(
        a, generate(params, TINY, ok_tokens(), 3, seed=np.random.default_rng(0)))


def test_generate_checks_the_params_once_not_per_token(monkeypatch):
    from transformer_lab import generation as gen, model
    p = init_params(TINY, seed=0)
    checks = []
    real_check = model.check_params
    for module in (model, gen):
        monkeypatch.setattr(module, "check_params", lambda *a: checks.append(1) or real_check(*a))
    for use_cache in (True, False):
        checks.clear()
        assert generate(p, TINY, ok_tokens(), 5, use_cache=use_cache, seed=0).shape == (1, 9)
        assert len(checks) == 1
    # a direct forward call still checks, and still names the problem
    checks.clear()
    forward(p, TINY, ok_tokens())
    assert len(checks) == 1
    bad = init_params(TINY, seed=0)
    del bad["blocks"][1]["attn"]["wv"]
    with pytest.raises(ValueError, match=r"missing blocks\[1\]\.attn\.wv"):
        generate(bad, TINY, ok_tokens(), 5)


def test_sample_next_bad_arguments():
    from transformer_lab import sample_next
    logits = np.zeros((1, 5))
    with pytest.raises(ValueError, match=r"top_k"):
        sample_next(logits, top_k=True)
    with pytest.raises(ValueError, match=r"temperature"):
        sample_next(logits, temperature="0.5")
    with pytest.raises(ValueError, match=r"logits \[B, vocab\]"):
        sample_next(np.zeros(5))
    with pytest.raises(ValueError, match=r"row 1 gives no token a probability"):
        sample_next(np.array([[0.0, 1.0], [-np.inf, -np.inf]]), rng=np.random.default_rng(0))


def test_generate_stops_at_non_finite_logits():
    p = init_params(TINY, seed=0)
    p["blocks"][0]["mlp"]["w_down"][0, 0] = np.nan  # NaN params used to yield token 0 forever
    for use_cache in (True, False):
        with pytest.raises(ValueError, match=r"logits at step 0 are not finite; check the params"):
            generate(p, TINY, ok_tokens(), 4, use_cache=use_cache)


def test_generate_names_the_step_where_logits_go_bad(monkeypatch):
    from transformer_lab import generation as gen
    p = init_params(TINY, seed=0)
    real_forward = gen.forward  # what the decode loop calls
    calls = []

    def forward_that_breaks(*args, **kwargs):
        calls.append(1)
        logits = real_forward(*args, **kwargs)
        return logits * np.inf if len(calls) == 4 else logits  # the 4th pass: step 3

    monkeypatch.setattr(gen, "forward", forward_that_breaks)
    stream = gen.generate_stream(p, TINY, ok_tokens(), 6, greedy=True)
    assert len([next(stream) for _ in range(3)]) == 3
    with pytest.raises(ValueError, match=r"logits at step 3 are not finite"):
        next(stream)


def test_generate_bad_prompt(params):
    with pytest.raises(ValueError, match=r"2-D"):
        generate(params, TINY, np.array([1, 2, 3]), 2)


def test_loss_targets_shape_mismatch(params):
    toks = ok_tokens(4)
    with pytest.raises(ValueError, match=r"targets shape.*tokens shape"):
        loss(params, TINY, toks, toks[:, :3])
    with pytest.raises(ValueError, match=r"targets shape.*tokens shape"):
        loss(params, TINY, toks, toks[0])


def test_loss_targets_out_of_range(params):
    toks = ok_tokens(4)
    targets = toks.copy()
    targets[0, 0] = TINY.vocab
    with pytest.raises(ValueError, match=r"out of range"):
        loss(params, TINY, toks, targets)


def test_empty_sequence(params):
    with pytest.raises(ValueError, match=r"at least one sequence and one position"):
        forward(params, TINY, np.zeros((1, 0), dtype=np.int64))


def test_cache_without_the_protocol(params):
    with pytest.raises(ValueError, match=r"cache.CacheProtocol"):
        forward(params, TINY, ok_tokens(), cache={"k": []})


def test_empty_batch_is_rejected_by_name():
    import numpy as np
    from transformer_lab import TINY, forward, init_params
    with pytest.raises(ValueError, match="at least one sequence"):
        forward(init_params(TINY), TINY, np.zeros((0, 4), dtype=np.int64))


def test_dtype_none_is_rejected():
    from transformer_lab import TINY
    with pytest.raises(ValueError, match="Config.dtype"):
        TINY.replace(dtype=None)
