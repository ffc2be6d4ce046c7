"""The serving and speculative benchmark sections' own arithmetic, on a tiny model or on
made-up figures: the targets read what they say, the tables print, the speculative rows
compare against the plain rate measured before and after them. No timing is asserted."""
import numpy as np
import pytest

from api_helpers import tiny_config, toy_tokenizer
from benchmarks import bench_serving, bench_speculative
from benchmarks.output import Output
from transformer_lab.params import init_params


def serving_result(**overrides):
    r = {"requests": 2, "generated_tokens": 100, "prompt_tokens": [4, 9], "output_tokens": [40, 60],
         "max_num_seqs": 2, "tokens_per_s": {"one_by_one": 10.0, "static": 30.0, "mixed": 60.0},
         "probe_ms": {"one_by_one": 20.0, "static": 21.0, "mixed": 19.5},
         "engine_vs_one_by_one": 6.0, "engine_vs_static": 2.0, "engine_vs_hf": None,
         "decode_step_ratio_16_vs_1": 2.0, "decode_step_s": {"1": 0.01, "16": 0.02},
         "gathered_bytes_per_step_16": 2**20, "gather_s_16": 0.001,
         "kv": {"waste_pct": 3.0, "tokens_used": 97, "slots_held": 100,
                "contiguous_max_seq_slots": 1000},
         "stats": {"prefix_hit_tokens": 0}, "invariant_cost": 1.1, "ttft_median_s": 0.5,
         "tpot_median_s": 0.05, "same_tokens_as_mixed": {"mixed": 2},
         "speculation": [{"max_num_seqs": 1, "requests": 2, "plain_tokens_per_s": 10.0,
                          "spec_tokens_per_s": 12.0, "speedup": 1.2, "drafted": 10,
                          "accepted": 5, "same_tokens": 2}]}
    r.update(overrides)
    return r


def test_serving_targets_read_the_result():
    targets = {t["name"]: t for t in bench_serving.serving_targets(serving_result())}
    assert len(targets) == 5
    met = {name.split(": ", 1)[1]: t["met"] for name, t in targets.items()}
    assert met["engine vs one request at a time (generate_stream)"] is True
    assert met["engine vs HF transformers' batched generate"] is None  # not run
    assert all(v in (True, None) for v in met.values())
    worse = serving_result(engine_vs_one_by_one=4.9, engine_vs_static=1.2, engine_vs_hf=1.5,
                           decode_step_ratio_16_vs_1=3.1,
                           kv={"waste_pct": 5.0, "tokens_used": 95, "slots_held": 100,
                               "contiguous_max_seq_slots": 1000})
    assert all(t["met"] is False for t in bench_serving.serving_targets(worse))
    bench_serving.print_serving(Output(quiet=True), serving_result())
    bench_serving.print_serving(Output(quiet=True), worse)


def test_the_int8_pool_is_printed_beside_the_float32_one():
    tables = []

    class Capture(Output):
        def table(self, headers, rows, caption=None):
            tables.append((headers, rows, caption))

    r = serving_result(
        tokens_per_s={"one_by_one": 10.0, "static": 30.0, "mixed": 60.0, "int8_kv": 55.0},
        kv_pool={"mixed": {"kv_cache_dtype": "auto", "num_blocks": 100, "bytes": 2**20},
                 "int8_kv": {"kv_cache_dtype": "int8", "num_blocks": 371, "bytes": 2**20 - 64}},
        int8_kv={"tokens": 100, "same": 90, "agree": 0.90, "identical": 1, "requests": 2,
                 "parted": [{"request": 1, "at": 57, "gap": 0.0123}]},
        int8_kv_forced={"tokens": 100, "same": 99, "agree": 0.99, "misses": []})
    bench_serving.print_serving(Capture(quiet=True), r)
    headers, rows, caption = next(t for t in tables if t[0][0] == "KV pool")
    assert headers[4:] == ["greedy, by position", "teacher-forced top-1"]
    assert rows[1][:2] == ["int8", "371 (3.71x)"] and rows[1][4].startswith("90.0 %")
    assert rows[1][5] == "99.00 %" and caption.endswith("1@57: 0.0123")
    met = {t["name"].split(": ", 1)[1]: t["met"] for t in bench_serving.serving_targets(r)}
    assert met["int8 KV pool's blocks in the float32 pool's memory"] is True
    assert met["int8 pool's greedy tokens as float32's (by position)"] is False


def test_hf_baseline_is_skipped_without_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        assert bench_serving.hf_static_batches([[1, 2]], [3], 1) is None
    else:
        pytest.skip("torch and transformers are installed here")


def test_speculative_section_on_a_tiny_model():
    cfg = tiny_config(np.float64, max_seq=1024)
    model = (cfg, init_params(cfg, seed=1), toy_tokenizer())
    s = bench_speculative.run_speculative(6, 1, ngram_ks=(1, 2), model_ks=(1,), verify_repeats=1,
                                          model=model)
    assert len(s["plain"]) == 3 and len(s["rows"]) == 3 * 3
    for p in s["plain"]:  # the baseline is the mean of the runs before and after
        assert p["tokens_per_s"] == pytest.approx(np.mean(p["tokens_per_s_runs"]))
    for row in s["rows"]:
        plain = next(p for p in s["plain"] if p["kind"] == row["kind"])
        assert row["speedup"] == pytest.approx(row["tokens_per_s"] / plain["tokens_per_s"])
        assert row["identical"]  # float64: greedy speculation gives the plain tokens
    assert [r["k"] for r in s["verify"]] == [0, 1, 2]  # a plain step and each k drafted
    assert s["blas_threads"] is None or s["blas_threads"] >= 1  # the process's own count
    targets = bench_speculative.speculative_targets(s)
    assert targets[0]["measured"] == bench_speculative.best_copy_ngram(
        bench_speculative.summary(s))["speedup"]
    bench_speculative.print_speculative(Output(quiet=True), s)


def test_the_machine_probe_times_one_row_through_every_product():
    from transformer_lab import llama_config, pack_weights
    cfg = llama_config(vocab=50, d_model=16, n_heads=2, n_kv_heads=1, n_layers=2, d_ff=32,
                       max_seq=16, dtype=np.float32)
    probe = bench_serving.machine_probe(pack_weights(init_params(cfg), cfg), repeats=2)
    assert probe() > 0 and probe() > 0  # the same function, called before each method
