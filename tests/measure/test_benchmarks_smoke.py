"""The benchmark suite runs end to end at tiny sizes and writes the expected JSON.

Correctness only: no timing is asserted. The hand-written formulations the
benchmark times beside attention_core must compute the same attention.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from benchmarks import QUICK, evaluate_targets, run_all
from benchmarks.__main__ import parse_args
from benchmarks.bench_attention import attention_bmm, attention_einsum, make_qkv, run_attention
from benchmarks.bench_model import memory_report, mid_config, run_decode, run_forward
from benchmarks.bench_train import run_train, train_config
from benchmarks.output import Output
from transformer_lab import attention_core
from transformer_lab.measure.flops import attention_flops, train_step_flops

from paths import ROOT

# Tiny sizes: a small model, short sequences, one timed repeat each.
TINY = replace(QUICK, name="tiny", attn_sizes=(16, 40), attn_groups=(4, 1), attn_heads=4,
               attn_head_dim=8, attn_repeats=1, einsum_max_T=16, einsum_repeats=1, peak_n=64,
               peak_repeats=1, forward_B=2, forward_T=12, forward_repeats=1,
               decode_contexts=(4, 8, 16), decode_repeats_cached=1, decode_repeats_recompute=1,
               model=dict(vocab=96, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
                          max_seq=64),
               train_B=2, train_T=8, train_repeats=1,
               train_model=dict(vocab=64, d_model=32, n_heads=4, n_kv_heads=2, n_layers=1,
                                d_ff=64, max_seq=8),
               smollm2_rounds=0)


@pytest.mark.parametrize("T,S,H,G,offset", [(1, 1, 2, 1, 0), (9, 9, 4, 2, 0), (5, 12, 4, 4, 7),
                                             (33, 33, 8, 2, 0), (3, 20, 6, 1, 17)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_formulations_agree_with_attention_core(T, S, H, G, offset, dtype):
    q, k, v = make_qkv(T, H, G, 8, B=2, S=S, dtype=dtype, seed=T + S)
    want = attention_core(q, k, v, offset)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)
    for impl in (attention_bmm, attention_einsum):
        got = impl(q, k, v, offset)
        assert got.shape == want.shape == (2, T, H * 8)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, **tol, err_msg=impl.__name__)


def test_run_attention_rows():
    res = run_attention((8, 24), (2,), H=4, D=8, einsum_max_T=8, repeats=1, einsum_repeats=1,
                        peak_n=32, peak_repeats=1)
    assert [r["T"] for r in res["rows"]] == [8, 24]
    assert res["rows"][0]["einsum"] is not None and res["rows"][1]["einsum"] is None
    for row in res["rows"]:
        assert row["flops"] == attention_flops(row["T"], row["S"], 4, 8)
        assert row["attention_core"]["gflops"] > 0 and row["bmm"]["gflops"] > 0
        assert row["core_vs_bmm"] > 0 and row["core_fraction_of_peak"] > 0
        assert 0 < row["core_causal_gflops"] < row["attention_core"]["gflops"]
        assert row["flash"]["gflops"] > 0 and row["flash_vs_core"] > 0
        assert set(row["peak_bytes"]) == {"attention_core", "bmm", "flash"}
        assert row["score_bytes"] == 4 * row["T"] * row["S"] * 4  # H = 4 heads of float32
        assert all(b > 0 for b in row["peak_bytes"].values())
    assert "4*T*S*H*D" in res["flop_convention"]


def test_decode_and_memory():
    cfg = mid_config(**TINY.model)
    from transformer_lab import init_params
    res = run_decode(cfg, init_params(cfg), contexts=(4, 8, 16), repeats_cached=1,
                     repeats_recompute=1)
    assert [r["context"] for r in res["rows"]] == [4, 8, 16]
    for row in res["rows"]:
        assert row["cached_ms"] > 0 and row["recompute_ms"] > 0
        assert row["cached_vs_recompute_max_abs_diff"] < 1e-4
    assert {"slope_ms_per_1k_context", "intercept_ms"} <= set(res["fit"])
    assert {"ratio", "predicted_ms_at_largest"} <= set(res["linearity"])
    mem = memory_report(cfg, res)
    assert mem["kv_bytes_per_token"] == mem["kv_bytes_per_token_formula"] == 2 * 2 * 2 * 8 * 4
    assert mem["peak_rss_bytes_decode"] >= mem["peak_rss_bytes_before_decode"] > 0


def test_run_all_writes_json(tmp_path):
    path = tmp_path / "out" / "results.json"
    results = run_all(TINY, path, out=Output(quiet=True), command="smoke test")
    data = json.loads(path.read_text())
    assert {"schema", "profile", "command", "machine", "attention", "forward", "decode", "memory",
            "targets"} <= set(data)
    m = data["machine"]
    assert {"cpu_model", "usable_cores", "numpy", "blas", "blas_threads"} <= set(m)
    assert m["numpy"] == np.__version__
    att = data["attention"]
    assert {"flop_convention", "matmul_peak", "rows"} <= set(att)
    assert {"T", "G", "flops", "attention_core", "bmm", "einsum", "core_vs_bmm",
            "core_fraction_of_peak"} <= set(att["rows"][0])
    fwd = data["forward"]
    assert {"config", "B", "T", "numpy", "torch"} <= set(fwd)
    assert fwd["numpy"]["tokens_per_s"] > 0
    if fwd["torch"] is None:
        assert fwd["torch_skipped"]
    else:  # PyTorch installed: the same weights must give the same logits
        assert fwd["torch"]["logits_agree"], fwd["torch"]
        assert fwd["numpy_over_torch_time"] > 0
    tr = data["train"]
    assert tr["numpy"]["best_s"] > 0 and tr["flops_per_step"] == train_step_flops(
        train_config(**TINY.train_model), 2, 8)
    assert tr["memory"]["activation_record_bytes"] > 0 and tr["memory"]["peak_step_bytes"] > 0
    if tr["torch"] is None:
        assert tr["torch_skipped"]
    else:  # the same weights must give the same loss and gradients
        assert tr["torch"]["grads_agree"], tr["torch"]
        assert tr["torch"]["loss_abs_diff"] < 1e-4 and tr["numpy_over_torch_time"] > 0
    assert {"rows", "fit", "linearity"} <= set(data["decode"])
    assert data["memory"]["kv_bytes_per_token"] > 0
    names = [t["name"] for t in data["targets"]]
    # With PyTorch installed the packed forward gets a row of its own against it.
    assert len(names) == 6 + (fwd["torch"] is not None) and all("met" in t for t in data["targets"])
    assert ("forward time, packed params, vs PyTorch eager" in names) == (fwd["torch"] is not None)
    assert data["targets"] == json.loads(json.dumps(evaluate_targets(results)))


def test_forward_without_torch_skips_the_row():
    cfg = mid_config(**TINY.model)
    from transformer_lab import init_params
    res = run_forward(cfg, init_params(cfg), B=1, T=5, repeats=1, use_torch=False)
    assert res["torch"] is None and res["torch_skipped"]
    assert res["numpy"]["tokens_per_s"] > 0 and "numpy_over_torch_time" not in res
    (target,) = evaluate_targets({"forward": res})
    assert target["met"] is None and "skipped" in target["measured_text"]


def test_run_all_one_section_without_json():
    results = run_all(TINY, None, sections=("attention",), out=Output(quiet=True))
    assert "forward" not in results and "decode" not in results
    assert len(results["targets"]) == 2


def test_train_without_torch_skips_the_row():
    cfg = train_config(**TINY.train_model)
    res = run_train(cfg, B=1, T=4, repeats=1, peak_n=32, peak_repeats=1, use_torch=False)
    assert res["torch"] is None and res["torch_skipped"] and "numpy_over_torch_time" not in res
    (target,) = evaluate_targets({"train": res})
    assert target["met"] is None and "skipped" in target["measured_text"]


def test_cli_parses_options():
    args = parse_args(["--quick", "--json", "x.json", "--only", "decode", "forward"])
    assert args.quick and args.json == "x.json" and args.only == ["decode", "forward"]


@pytest.mark.parametrize("argv", [["--bogus"], ["--only", "nothing"], ["--json"]])
def test_cli_bad_option_exits_2(argv):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()  # one line, no usage block
    assert line.startswith("python -m benchmarks: error: ")


# ---------------------------------------------------------------- spread in the JSON, ~ in the tables

def test_every_figure_records_its_spread(tmp_path):
    path = tmp_path / "results.json"
    run_all(TINY, path, out=Output(quiet=True), command="smoke test", use_torch=False)
    data = json.loads(path.read_text())
    figures = [data["attention"]["matmul_peak"], data["forward"]["numpy"]]
    for row in data["attention"]["rows"]:
        figures += [row["attention_core"], row["bmm"], row["flash"]] + (
            [row["einsum"]] if row["einsum"] else [])
    for fig in figures:
        assert fig["spread"] >= 1 and isinstance(fig["steady"], bool) and "waited" in fig
    for row in data["decode"]["rows"]:
        for kind in ("cached", "recompute"):
            assert row[f"{kind}_spread"] >= 1 and isinstance(row[f"{kind}_steady"], bool)


class Recorder(Output):
    """An Output that keeps the tables it is given instead of printing them."""

    def __init__(self):
        super().__init__(quiet=True)
        self.tables = []

    def table(self, headers, rows, caption=None):
        self.tables.append(([[str(c) for c in row] for row in rows], caption or ""))


def stats(steady=True):
    return {"best_s": 1e-3, "median_s": 1e-3, "max_s": 1e-3 if steady else 3e-3,
            "spread": 1.0 if steady else 3.0, "waited": 0.0, "steady": steady, "repeats": 3,
            "gflops": 10.0}


@pytest.mark.parametrize("noisy", ["none", "one", "all"])
def test_unsteady_figures_are_marked_in_the_tables(noisy):
    from benchmarks.suite import print_attention, print_decode
    steady_core = noisy == "none"
    rows = [{"T": T, "G": 2, "attention_core": stats(steady_core if T == 16 else noisy != "all"),
             "bmm": stats(noisy != "all"), "einsum": None, "core_vs_bmm": 1.0,
             "core_fraction_of_peak": 0.1, "core_causal_gflops": 5.0,
             "core_causal_fraction_of_peak": 0.05, "flash": stats(noisy != "all"),
             "flash_vs_core": 1.5, "score_bytes": 4 * T * T * 4,
             "peak_bytes": {"attention_core": 2e4, "bmm": 4e4, "flash": 1e3}} for T in (16, 40)]
    att = {"dtype": "float32", "B": 1, "H": 4, "D": 8, "flop_convention": "4*T*S*H*D.",
           "timing": "t", "matmul_peak": {**stats(noisy != "all"), "n": 64}, "rows": rows,
           "flash_block": 64}
    dec = {"config": {"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "d_ff": 64,
                      "vocab": 96, "params": 1e4}, "timing": "t",
           "rows": [{"context": c, "cached_ms": 1.0, "recompute_ms": 5.0, "speedup": 5.0,
                     "cached_steady": noisy == "none" or (noisy == "one" and c == 4),
                     "recompute_steady": noisy != "all"} for c in (4, 8)]}
    out = Recorder()
    print_attention(out, att)
    print_decode(out, dec)
    (att_rows, att_caption), (flash_rows, flash_caption), (dec_rows, dec_caption) = out.tables
    assert flash_rows[1][2].endswith(" ~") == (noisy == "all")  # T = 40, flash time
    marked = [sum(c.endswith(" ~") for row in t for c in row) for t in (att_rows, dec_rows)]
    if noisy == "none":
        assert marked == [0, 0] and "~" not in att_caption + dec_caption
    else:
        assert all(m > 0 for m in marked) and "~ marks an unsteady figure" in att_caption
        assert "~ marks an unsteady figure" in dec_caption
        assert att_rows[1][2].endswith(" ~") == (noisy == "all")  # T = 40, attention_core
        assert dec_rows[0][1] == ("1.00 ~" if noisy == "all" else "1.00")
    if noisy == "all":
        assert "10.0 ~ GFLOP/s" in att_caption
    targets = evaluate_targets({"attention": {**att, "rows": [
        {**r, "T": 2048} for r in rows]}, "decode": {**dec, "rows": [
        {**r, "context": 2048} for r in dec["rows"]]}})
    # the speedup target reads the first 2048 row, cached steady unless everything is noisy
    assert [t["steady"] for t in targets] == [noisy == "none"] * 2 + [True, noisy != "all"]
    from benchmarks.suite import print_targets
    out = Recorder()
    print_targets(out, targets)
    (cells, caption), = out.tables
    assert any(c.endswith(" ~") for row in cells for c in row) == (noisy != "none")
