"""Demo 04's observations, asserted on its computed results."""
import numpy as np
import pytest

from demo_helpers import demo, rendered_text
from transformer_lab import KVCache, llama_config

D04 = demo(4)


@pytest.fixture(scope="module")
def result():
    return D04.compute()


@pytest.fixture(scope="module")
def rows(result):
    return {r["key"]: r for r in result["rows"]}


def test_the_table_covers_the_specified_configs(result, rows):
    assert (result["d"], result["T"]) == (512, 1024)
    assert [(r["H"], r["G"]) for r in result["rows"]] == [(1, 1), (8, 8), (64, 64), (8, 2), (8, 1)]
    assert all(r["H"] * r["D"] == 512 for r in result["rows"])


def test_flop_convention_is_2mkn():
    assert D04.flops([("x", 3, 2, 5, 7)], ("x",)) == 2 * 3 * 2 * 5 * 7


def test_splitting_into_heads_leaves_flops_unchanged(result, rows):
    d, T = result["d"], result["T"]
    for key in ("1 head", "8 heads", "64 heads"):
        assert rows[key]["proj_flops"] == 8 * T * d * d  # Q, K, V, O: four d×d projections
        assert rows[key]["core_flops"] == 4 * T * T * d  # QKᵀ and AV over all heads
        assert rows[key]["kv_values"] == 2 * d


def test_gqa_and_mqa_cut_kv_projections_and_cache_not_the_core(rows):
    mha, gqa, mqa = rows["8 heads"], rows["GQA"], rows["MQA"]
    assert mha["core_flops"] == gqa["core_flops"] == mqa["core_flops"]
    assert mha["kv_proj_flops"] == 4 * gqa["kv_proj_flops"] == 8 * mqa["kv_proj_flops"]
    # Q and O projections are untouched
    assert (mha["proj_flops"] - mha["kv_proj_flops"] == gqa["proj_flops"] - gqa["kv_proj_flops"]
            == mqa["proj_flops"] - mqa["kv_proj_flops"])
    assert (mha["kv_bytes"], gqa["kv_bytes"], mqa["kv_bytes"]) == (2048, 512, 256)
    assert mha["kv_bytes"] // gqa["kv_bytes"] == 4 and mha["kv_bytes"] // mqa["kv_bytes"] == 8


def test_kv_bytes_agree_with_the_kv_cache(result):
    # KVCache.bytes_per_token counts the same 2·G·D values (float32 there, 4 bytes each).
    for r in result["rows"]:
        cfg = llama_config(vocab=8, d_model=result["d"], n_heads=r["H"], n_kv_heads=r["G"],
                           n_layers=1, d_ff=8, max_seq=1, dtype=np.float32)
        assert KVCache(cfg, 1, 1).bytes_per_token() == r["kv_values"] * 4
        assert r["kv_bytes"] == r["kv_values"] * 2


def test_decode_reads_bytes_at_low_intensity(result, rows):
    T, d = result["T"], result["d"]
    mha, gqa, mqa = rows["8 heads"], rows["GQA"], rows["MQA"]
    assert mha["decode_flops"] == gqa["decode_flops"] == mqa["decode_flops"] == 4 * T * d
    assert mha["decode_bytes"] == T * mha["kv_bytes"]
    assert mha["decode_intensity"] == 1
    assert (gqa["decode_intensity"], mqa["decode_intensity"]) == (4, 8)
    assert mha["decode_bytes"] == 4 * gqa["decode_bytes"] == 8 * mqa["decode_bytes"]


def test_many_heads_make_thin_matmuls(result, rows):
    many = rows["64 heads"]
    assert many["D"] == 8 and many["qk_shape"] == [[1024, 8], [8, 1024]]
    assert many["flops_per_score"] == 16
    assert many["score_entries"] == 64 * 1024 * 1024 == 8 * rows["8 heads"]["score_entries"]


def test_all_heads_at_once_equals_per_head_loop_and_gqa_equals_repeated_kv(result):
    c = result["checks"]
    assert c["per_head_diff"] <= 1e-12
    assert c["gqa_diff"] <= 1e-12
    assert c["R"] == c["H"] // c["G"] == 4


def test_per_head_loop_handles_groups_too():
    from transformer_lab import attention_core
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 10, 6, 4))
    k = rng.standard_normal((1, 10, 2, 4))
    v = rng.standard_normal((1, 10, 2, 4))
    np.testing.assert_allclose(D04.per_head_loop(q, k, v), attention_core(q, k, v), atol=1e-12)


def test_findings_are_the_computed_numbers(result, rows):
    f = D04.findings(result)
    assert f["kv_bytes_ratio"] == (4, 8)  # GQA and MQA: 2048 K/V bytes down to 512 and 256
    assert (f["mha"]["kv_bytes"], f["gqa"]["kv_bytes"], f["mqa"]["kv_bytes"]) == (2048, 512, 256)
    assert f["mha"]["core_flops"] == f["gqa"]["core_flops"] == f["mqa"]["core_flops"]
    assert f["mha"]["decode_intensity"] == pytest.approx(1, rel=0.05)  # about 1 FLOP per byte
    assert f["many"]["qk_shape"] == [[1024, 8], [8, 1024]]  # thin: 64 heads of D = 8
    assert all(r["G"] == r["H"] for r in f["mha_rows"])
    text = " ".join(rendered_text(D04, result, "en").replace("│", " ").split())
    assert all(" ".join(o.split())[:30] in text for o in D04.observations(result, "en"))