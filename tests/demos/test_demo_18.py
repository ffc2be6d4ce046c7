"""Demo 18's observations, asserted on one --quick run (computed once per session), and its
other wordings on edited copies of that result."""
import copy

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs

D18 = demo(18)


@pytest.fixture(scope="module")
def quick():
    return quick_result(18)


def flat(text):
    return " ".join(text.replace("│", " ").split())


def test_every_form_is_exact(quick):
    ex = quick["exact"]
    for key in ("core", "tiled", "odd", "merged"):
        assert ex["float32"][key] < 1e-6 and ex["float64"][key] < 1e-12
    assert ex["float32"]["bwd"] < 1e-5 and ex["float64"]["bwd"] < 1e-12
    assert ex["float32"]["dtype_kept"] and ex["float64"]["dtype_kept"]
    bq, bk = ex["odd_blocks"]
    assert ex["T"] % bq and ex["T"] % bk  # the odd tiles divide neither T nor S


def test_tiled_memory_stays_under_a_sixteenth(quick):
    mem = quick["memory"]
    for r in mem["rows"]:
        assert r["scores"] == r["T"] ** 2 * 4
        assert r["flash"] < r["core"] < r["plain"] and r["scores"] <= r["plain"]
        assert r["flash"] >= r["out_bytes"]  # the output is part of what it holds
        assert r["share"] == pytest.approx(r["flash"] / r["scores"])
    assert mem["rows"][-1]["flash"] <= mem["rows"][-1]["scores"] / 16  # at the largest T
    # The plain form grows with T^2, the tiled one about with T.
    assert mem["growth"]["plain"] > 3.5 and mem["growth"]["flash"] < 2.5


def test_traffic_about_halves_per_doubling(quick):
    io = quick["io"]
    rows = io["rows"]
    assert len({r["plain"] for r in rows}) == 1
    for prev, r in zip(rows, rows[1:]):
        assert r["sram"] == 2 * prev["sram"] and r["block_q"] == 2 * prev["block_q"]
        assert 0.5 < r["ratio"] < 0.6 and 0.5 < r["full_ratio"] < 0.6
        assert r["full"] > r["flash"]  # the causal loop skips tiles
    assert io["ratio_min"] == min(r["ratio"] for r in rows[1:])
    assert io["ratio_max"] == max(r["ratio"] for r in rows[1:])


def test_skipped_share_is_the_formula(quick):
    sk = quick["skip"]
    assert sk["all_equal"]
    for r in sk["rows"]:
        n = r["n"]
        assert r["total"] == n * n and r["visited"] == n * (n + 1) // 2 and r["masked"] == n
        assert r["share"] == pytest.approx(r["formula"])


def test_time_rows_are_measured(quick):
    tm = quick["time"]
    rows = tm["rows"]
    assert set(rows) == {"core"} | {f"flash{b}" for b in D18.TIME_BLOCKS}
    assert all(r["best_s"] > 0 for r in rows.values())
    tiles = [rows[f"flash{b}"]["tiles"] for b in D18.TIME_BLOCKS]
    assert tiles == sorted(tiles, reverse=True)
    assert tm["flash_faster"] == (rows["flash64"]["best_s"] < rows["core"]["best_s"])


def test_split_k_over_the_page_table(quick):
    pg = quick["pages"]
    assert len(pg["rows"]) == 2
    for r in pg["rows"]:
        assert r["once"] and r["reads"] == r["table"]
        assert len(r["table"]) == -(-r["tokens"] // pg["block_size"])
        assert r["diff"] < 1e-6
    ids = [b for r in pg["rows"] for b in r["table"]]
    assert len(ids) == len(set(ids)) == pg["blocks"]


def test_split_k_reads_each_block_once():
    """split_k on a hand-made pool: the reads are the table, and the result is the attention."""
    class Pool:
        block_size = 4
    rng = np.random.default_rng(0)
    pool = Pool()
    pool.k = [rng.standard_normal((6, 4, 2, 8))]
    pool.v = [rng.standard_normal((6, 4, 2, 8))]
    q = rng.standard_normal((1, 1, 4, 8))
    table = [5, 0, 3]
    out, reads = D18.split_k(q, pool, 0, table, 10)
    assert reads == table
    k = pool.k[0][table].reshape(1, 12, 2, 8)[:, :10]
    v = pool.v[0][table].reshape(1, 12, 2, 8)[:, :10]
    from transformer_lab import attention_reference
    np.testing.assert_allclose(out, attention_reference(q, k, v, offset=9), atol=1e-12)


def test_findings_are_the_computed_numbers(quick):
    f = D18.findings(quick)
    ex, mem, io, sk, tm, pg = (quick[k] for k in ("exact", "memory", "io", "skip", "time",
                                                  "pages"))
    last = mem["rows"][-1]
    assert f["mem_T"] == last["T"] == max(D18.QUICK_MEM_T) and f["plain_peak"] == last["plain"]
    assert f["flash_share"] == last["flash"] / last["scores"] <= 1 / 16
    assert f["out_share"] == last["out_bytes"] / last["flash"]
    assert f["tiled_err"]["float64"] == max(ex["float64"]["tiled"], ex["float64"]["odd"]) < 1e-12
    assert f["merged_err"] == ex["float64"]["merged"] and f["bwd_err"] == ex["float64"]["bwd"]
    assert f["io_ratio"] == (min(r["ratio"] for r in io["rows"][1:]),
                             max(r["ratio"] for r in io["rows"][1:]))
    assert 0.45 < f["io_ratio"][0] <= f["io_ratio"][1] < 0.6  # about halves per doubling
    assert f["skip"]["n"] == 64 and f["skip"]["visited"] == 64 * 65 // 2
    assert f["skip"]["visited"] + f["skip"]["skipped"] == sk["rows"][-1]["total"]
    assert f["flash_faster"] == tm["flash_faster"]
    assert f["blocks"][16][0] > f["blocks"][256][0]  # smaller tiles, more of them
    assert f["pages_once"] and f["pages_blocks"] == sum(len(r["table"]) for r in pg["rows"])
    assert f["pages_diff"] == pg["max_diff"] < 1e-5


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_each_finding_is_one_observation_and_the_verdict_follows_the_timing(quick, lang):
    r = copy.deepcopy(quick)
    r["time"]["flash_faster"] = not r["time"]["flash_faster"]
    one, other = D18.observations(quick, lang), D18.observations(r, lang)
    assert len(one) == len(other) == 6
    assert [a == b for a, b in zip(one, other)] == [True] * 4 + [False, True]
    text = rendered_text(D18, quick, lang)
    assert all(" ".join(obs.split())[:20] in " ".join(text.split()) for obs in one)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_figures_are_written(quick, tmp_path, lang):
    names = written_without_missing_glyphs(D18, quick, tmp_path, lang)
    assert names == ["18_flash_attention_memory.png", "18_flash_attention_memory.svg",
                     "18_flash_attention_traffic.png", "18_flash_attention_traffic.svg"]


def test_traffic_figure_plots_the_counts(quick):
    pytest.importorskip("matplotlib")
    fig = D18.figures(quick, "en")["traffic"]
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    np.testing.assert_allclose(lines["io_flash"].get_ydata(),
                               [r["flash"] / 2 ** 20 for r in quick["io"]["rows"]])
