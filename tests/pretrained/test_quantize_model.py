"""pretrained.quants and measure.weight_quant without the gguf package: GGUF blocks worked by
hand, fake_quant (llm-awq's pseudo_quantize_tensor), AWQ's scale search, and quantize_model
over a small model."""
import numpy as np
import pytest

from transformer_lab import forward, init_params, llama_config, named_params
from transformer_lab.ops import log_softmax
from transformer_lab.precision import round_to
from transformer_lab.measure import weight_quant
from transformer_lab.measure.weight_quant import awq_scales, fake_quant, group_bits, quantize_model
from transformer_lab.pretrained.quants import dequantize, quantize

CFG = llama_config(vocab=96, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=128,
                   max_seq=64, dtype=np.float32)


def outlier_params(seed=0):
    """A small model whose normed stream has two loud channels, as trained models do."""
    params = init_params(CFG, seed=seed)
    for p in params["blocks"]:
        p["attn_norm"]["weight"][[3, 40]] = 25.0
        p["mlp_norm"]["weight"][[7, 50]] = 25.0
    params["lm_head"]["w"] *= 40  # logits far from uniform, so errors show in the KL
    return params


def kl(ref_logits, logits):
    p, q = log_softmax(ref_logits), log_softmax(logits)
    return float((np.exp(p) * (p - q)).sum(-1).mean())


# ---------------------------------------------------------------- GGUF blocks by hand

def test_a_q8_0_block_worked_by_hand():
    w = np.zeros(32, np.float32)
    w[:4] = [1.27, -0.635, 0.01, 0.0]
    data = quantize(w, "q8_0")
    assert data.shape == (34,)
    d = data[:2].view(np.float16)[0]
    assert d == np.float16(0.01)  # max |w| / 127
    assert list(data[2:6].view(np.int8)) == [127, -64, 1, 0]  # -63.5 rounds away from zero
    np.testing.assert_allclose(dequantize(data, "q8_0", (32,))[:4], np.float32(d) * np.array([127, -64, 1, 0], np.float32))


def test_a_q4_1_block_worked_by_hand():
    w = np.linspace(0.0, 15.0, 32, dtype=np.float32)  # min 0, max 15: d = 1, m = 0
    data = quantize(w, "q4_1")
    assert data[:2].view(np.float16)[0] == 1 and data[2:4].view(np.float16)[0] == 0
    q = np.trunc(w + 0.5).astype(np.uint8)
    assert list(data[4:]) == list(q[:16] | (q[16:] << 4))  # values 0..15 low, 16..31 high
    np.testing.assert_array_equal(dequantize(data, "q4_1", (32,)), q.astype(np.float32))


@pytest.mark.parametrize("kind,levels", [("q8_0", 127), ("q4_0", 8), ("q4_1", 15)])
def test_the_round_trip_error_is_at_most_half_a_step(kind, levels):
    w = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    back = dequantize(quantize(w, kind), kind, w.shape)
    blocks, err = w.reshape(8, 2, 32), np.abs(back - w).reshape(8, 2, 32)
    span = np.ptp(blocks, -1) if kind == "q4_1" else np.abs(blocks).max(-1)
    # Q4_0's levels are -8d .. 7d with the largest magnitude at -8d: the other side's
    # values past 7|d| clip, by up to a whole step.
    half = 1.0 if kind == "q4_0" else 0.5
    assert (err.max(-1) <= span / levels * half * 1.01 + 1e-3 * span).all()


# ---------------------------------------------------------------- fake_quant

def test_fake_quant_worked_by_hand():
    # One group [in=4] per column: min 0, max 3, 2 bits -> scale 1, zero 0: exact.
    w = np.array([[0.0], [1.0], [2.0], [3.0]], np.float32)
    np.testing.assert_array_equal(fake_quant(w, 2, group_size=4), w)
    # min -1, max 2: scale 1, zero 1; 0.5 and 1.5 round to even (0 and 2).
    w = np.array([[-1.0], [0.5], [1.5], [2.0]], np.float32)
    np.testing.assert_array_equal(fake_quant(w, 2, group_size=4), [[-1.0], [0.0], [2.0], [2.0]])
    # symmetric: max |w| = 2, levels -2..1 at scale 2: -1 / 2 = -0.5 rounds to even (0).
    np.testing.assert_array_equal(fake_quant(w, 2, group_size=4, symmetric=True),
                                  [[0.0], [0.0], [2.0], [2.0]])
    # A group wholly above zero: llm-awq clamps the zero point to 0 .. 2^bits - 1, so 0
    # stays on the grid and the top of the group clips (400..700 -> 0, 100, 200, 300).
    w = np.array([[400.0], [500.0], [600.0], [700.0]], np.float32)
    np.testing.assert_array_equal(fake_quant(w, 2, group_size=4), [[300.0]] * 4)


def test_fake_quant_groups_along_the_input_dimension():
    w = np.zeros((8, 2), np.float32)
    w[:4, 0] = [0, 1, 2, 3]  # group 0 of column 0
    w[4:, 0] = [0, 10, 20, 30]  # group 1 of column 0: its own scale
    w[:, 1] = [0, 100, 200, 300, -30, -20, -10, 0]  # column 1: its own groups
    got = fake_quant(w, 2, group_size=4)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, w)  # each group has exactly four equally spaced values


def test_fake_quant_equals_llm_awqs_pseudo_quantize_tensor():
    torch = pytest.importorskip("torch", reason="torch is the reference for llm-awq's rounding")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 48)).astype(np.float32)  # [in, out]
    for bits in (3, 4, 8):
        t = torch.from_numpy(w.T.copy()).reshape(-1, 64)  # llm-awq: [out, in] grouped along in
        mx, mn = t.amax(dim=1, keepdim=True), t.amin(dim=1, keepdim=True)
        scales = (mx - mn).clamp(min=1e-5) / (2 ** bits - 1)
        zeros = (-torch.round(mn / scales)).clamp_(0, 2 ** bits - 1)
        want = ((torch.clamp(torch.round(t / scales) + zeros, 0, 2 ** bits - 1) - zeros) * scales)
        np.testing.assert_array_equal(fake_quant(w, bits, 64), want.reshape(48, 256).numpy().T)


def test_group_bits_counts_the_scale_and_zero():
    assert group_bits(4, 128) == 4 + 20 / 128
    assert group_bits(4, 64, symmetric=True) == 4 + 16 / 64


# ---------------------------------------------------------------- AWQ

def test_awq_protects_a_loud_input_channel():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    x = rng.standard_normal((256, 64)).astype(np.float32)
    x[:, 5] *= 50  # one loud channel
    search = awq_scales(w, np.abs(x).mean(0), 3, group_size=32, x=x)
    assert len(search.errors) == 20 and search.alpha > 0
    s = search.scales
    assert s.dtype == np.float32 and s.argmax() == 5
    assert np.sqrt(s.max() * s.min()) == pytest.approx(1.0, rel=1e-5)
    rtn = np.mean((x @ (w - fake_quant(w, 3, 32))) ** 2)
    assert search.errors[0] == pytest.approx(rtn, rel=1e-5)  # alpha = 0 is plain RTN
    assert min(search.errors) == search.errors[int(round(search.alpha * 20))] < 0.8 * rtn


def test_awq_without_activations_weights_the_error_by_x_absmean_squared():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    a = np.ones(64, np.float32)
    a[9] = 30.0
    search = awq_scales(w, a, 3, group_size=32, grid=10)
    assert search.alpha > 0 and search.scales.argmax() == 9


def test_awqs_folded_scales_leave_the_model_unchanged_until_rounding():
    params = outlier_params()
    tokens = np.random.default_rng(2).integers(0, CFG.vocab, size=(2, 24))
    blocks, alphas = weight_quant._awq_fold(params, CFG, tokens, 4, 32)
    assert len(alphas) == CFG.n_layers and set(alphas[0]) == {"qkv", "o", "gate_up", "down"}
    folded = {**params, "blocks": blocks}
    np.testing.assert_allclose(forward(folded, CFG, tokens), forward(params, CFG, tokens),
                               rtol=1e-4, atol=1e-4)


def test_awq_lowers_the_kl_of_round_to_nearest_at_the_same_bits():
    params = outlier_params()
    rng = np.random.default_rng(3)
    calibration, text = rng.integers(0, CFG.vocab, size=(2, 32)), rng.integers(0, CFG.vocab, (1, 48))
    ref = forward(params, CFG, text)
    rtn, r_rtn = quantize_model(params, CFG, "w3_g32")
    awq, r_awq = quantize_model(params, CFG, "awq_w3_g32", calibration=calibration)
    assert r_rtn["bytes"] == r_awq["bytes"]
    assert kl(ref, forward(awq, CFG, text)) < 0.8 * kl(ref, forward(rtn, CFG, text))


# ---------------------------------------------------------------- quantize_model

def test_float32_is_the_model_itself_and_the_rest_runs_as_it_is():
    params = outlier_params()
    text = np.random.default_rng(4).integers(0, CFG.vocab, (1, 32))
    ref = forward(params, CFG, text)
    same, report = quantize_model(params, CFG, "float32")
    for (name, got), (_, want) in zip(named_params(same), named_params(params)):
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert report["bytes_per_weight"] == 4.0
    kls = {kind: kl(ref, forward(quantize_model(params, CFG, kind)[0], CFG, text))
           for kind in ("bf16", "q8_0", "q4_1", "w4_g32")}
    assert kls["bf16"] < kls["q4_1"] and kls["q8_0"] < kls["q4_1"]
    assert kls["bf16"] < 1e-3 and kls["q8_0"] < 1e-2


def test_the_report_counts_bytes_as_stored_and_read():
    params = init_params(CFG, seed=0)
    d, V, F = CFG.d_model, CFG.vocab, CFG.d_ff
    linear = CFG.n_layers * (d * d + 2 * d * (d // 2) + d * d + 3 * d * F)  # q k v o, gate up down
    table, norms = V * d, (2 * CFG.n_layers + 1) * d
    _, r = quantize_model(params, CFG, "q4_0")
    assert r["params"] == linear + 2 * table + norms
    assert r["linear_bits"] == 4.5
    assert r["bytes"] == pytest.approx(linear * 18 / 32 + 2 * table * 34 / 32 + norms * 4)
    # untied: a step reads one row of the token table and all of the head
    assert r["bytes_per_token"] == pytest.approx(linear * 18 / 32 + (table + d) * 34 / 32 + norms * 4)
    _, r = quantize_model(params, CFG, "w4_g64")
    assert r["linear_bits"] == pytest.approx(4 + 20 / 64)
    q, r = quantize_model(params, CFG, "bf16")
    assert r["bytes"] == 2 * r["params"]
    np.testing.assert_array_equal(q["tok_emb"], round_to(params["tok_emb"], "bf16"))


def test_the_quantized_values_are_those_of_quantize_and_fake_quant():
    params = init_params(CFG, seed=5)
    q, _ = quantize_model(params, CFG, "q4_0")
    w = params["blocks"][1]["mlp"]["w_down"]
    np.testing.assert_array_equal(q["blocks"][1]["mlp"]["w_down"],
                                  dequantize(quantize(w.T, "q4_0"), "q4_0", w.T.shape).T)
    np.testing.assert_array_equal(q["tok_emb"], dequantize(quantize(params["tok_emb"], "q8_0"),
                                                           "q8_0", params["tok_emb"].shape))
    np.testing.assert_array_equal(q["blocks"][0]["attn_norm"]["weight"],
                                  params["blocks"][0]["attn_norm"]["weight"])
    r, _ = quantize_model(params, CFG, "w4_g32")
    np.testing.assert_array_equal(r["blocks"][0]["attn"]["wk"],
                                  fake_quant(params["blocks"][0]["attn"]["wk"], 4, 32))


# ---------------------------------------------------------------- bad input, one line each

@pytest.mark.parametrize("call,message", [
    (lambda: quantize(np.zeros(32), "q5_k"), "unknown quantization kind 'q5_k'"),
    (lambda: quantize(np.zeros((2, 48)), "q8_0"), "the last axis must be a multiple of 32"),
    (lambda: quantize(np.array([np.nan] * 32), "q8_0"), "finite floats"),
    (lambda: dequantize(np.zeros(33, np.uint8), "q8_0", (64,)), "do not hold Q8_0 blocks"),
    (lambda: fake_quant(np.zeros((96, 4)), 4, 64), "input dimension 96 is not a multiple of group_size 64"),
    (lambda: fake_quant(np.zeros((64, 4)), 9), "bits must be an int in [2, 8], got 9"),
    (lambda: fake_quant(np.zeros((64, 4)), 1, 32), "bits must be an int in [2, 8], got 1"),
    (lambda: fake_quant(np.zeros(64), 4, 32), "must be a float [in, out] matrix"),
    (lambda: awq_scales(np.zeros((64, 4)), np.ones(32), 4, 32), "x_absmean must be 64 finite"),
    (lambda: quantize_model(init_params(CFG), CFG, "int4"), "unknown kind 'int4'"),
    (lambda: quantize_model(init_params(CFG), CFG, "w9_g32"), "bits must be an int in [2, 8], got 9"),
    (lambda: quantize_model(init_params(CFG), CFG, "w4_g48"), "is not a multiple of group_size 48"),
    (lambda: quantize_model(init_params(CFG), CFG, "awq_w4_g32"), "needs calibration tokens"),
    (lambda: quantize_model(init_params(CFG), CFG, "q8_0", calibration=np.zeros((1, 4), int)),
     "calibration is used only by the awq kinds"),
    (lambda: quantize_model(init_params(CFG.replace(d_model=48, n_heads=4, n_kv_heads=2)),
                            CFG.replace(d_model=48, n_heads=4, n_kv_heads=2), "q4_0"),
     "input dimension 48 is not a multiple of 32"),
])
def test_bad_input_is_one_clear_line(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)
