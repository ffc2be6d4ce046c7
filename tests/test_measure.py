"""transformer_lab.measure: the figures are well-formed (no timing assertions)."""

from transformer_lab import TINY, init_params, named_params
from transformer_lab.measure import (matmul_peak, param_bytes, peak_rss_bytes, read_bandwidth,
                                     time_call, time_side_by_side)


def test_time_side_by_side_runs_each_function_warmup_plus_repeats_times():
    calls = {"a": 0, "b": 0}

    def make(name):
        def fn():
            calls[name] += 1
        return fn

    stats = time_side_by_side({"a": make("a"), "b": make("b")}, repeats=4, warmup=2)
    assert calls == {"a": 6, "b": 6}
    for s in stats.values():
        assert s["repeats"] == 4 and 0 <= s["best_s"] <= s["median_s"]


def test_matmul_peak_and_bandwidth_report_positive_rates():
    peak = matmul_peak(64, repeats=2)
    assert peak["flops"] == 2 * 64 ** 3 and peak["flops_per_s"] > 0
    bw = read_bandwidth(4 * 2**20, repeats=2)
    assert bw["bytes"] == 4 * 2**20 and bw["bytes_per_s"] > 0
    assert time_call(lambda: None, repeats=2)["repeats"] == 2


def test_param_bytes_counts_every_array():
    params = init_params(TINY)
    leaves = [a for _, a in named_params(params)]
    assert param_bytes(params) == sum(a.nbytes for a in leaves) == sum(a.size for a in leaves) * 8
    assert peak_rss_bytes() is None or peak_rss_bytes() > 1e6
