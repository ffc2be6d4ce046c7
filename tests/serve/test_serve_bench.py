"""transformer_lab.serve.bench: arrivals as vLLM draws them, the metrics from known timings,
loopback only, and a small end-to-end measure() on the tiny model (figures not checked:
these are benchmarks' functions, the tests check what they compute, never how fast)."""
import math

import numpy as np
import pytest

from api_helpers import prompts, tiny_llm
from transformer_lab.serve import bench
from transformer_lab.serve.bench import RequestResult, RequestSpec


def test_arrivals_are_gamma_gaps_with_mean_one_over_rate():
    times = bench.arrival_times(20000, rate=4.0, seed=3)
    gaps = np.diff(times)
    assert times[0] == 0 and np.all(gaps >= 0)
    assert abs(gaps.mean() - 0.25) < 0.01
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.03  # Poisson: exponential gaps, CV 1
    bursty = np.diff(bench.arrival_times(20000, rate=4.0, burstiness=0.25, seed=3))
    assert abs(bursty.mean() - 0.25) < 0.02 and bursty.std() / bursty.mean() > 1.8  # CV 2
    np.testing.assert_array_equal(bench.arrival_times(50, 2.0, seed=1),
                                  bench.arrival_times(50, 2.0, seed=1))
    assert not np.any(bench.arrival_times(5, math.inf))
    for bad in (dict(n=0, rate=1.0), dict(n=3, rate=0.0), dict(n=3, rate=1.0, burstiness=0)):
        with pytest.raises(ValueError):
            bench.arrival_times(**bad)


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://192.168.1.5:80",
                                 "http://example.com:8000", "http://8.8.8.8"])
def test_only_loopback_is_ever_targeted(url):
    with pytest.raises(ValueError, match="not a loopback address"):
        bench.run_load(url, [RequestSpec({"prompt": [1]})], [0.0])
    with pytest.raises(ValueError, match="not a loopback address"):
        bench.send_request(url, RequestSpec({"prompt": [1]}))


def test_summary_of_known_timings():
    results = [
        RequestResult(0, True, ttft=0.5, itl=[0.1, 0.1, 0.1], e2e=0.8, output_tokens=4,
                      prompt_tokens=10),
        RequestResult(1, True, ttft=3.0, itl=[0.2], e2e=3.2, output_tokens=2, prompt_tokens=5),
        RequestResult(2, True, ttft=1.0, itl=[], e2e=1.0, output_tokens=1, prompt_tokens=5),
        RequestResult(3, False, error="HTTP 503: full"),
    ]
    s = bench.summarize(results, duration=4.0, slo={"ttft": 2.0, "tpot": 0.15})
    assert (s["completed"], s["failed"], s["output_tokens"]) == (3, 1, 7)
    assert s["request_throughput"] == 0.75 and s["output_throughput"] == 1.75
    assert s["ttft_p50"] == 1.0 and s["ttft_mean"] == pytest.approx(1.5)
    assert s["tpot_p50"] == pytest.approx(0.15)  # 0.1 and 0.2; the 1-token request has none
    assert s["itl_p50"] == pytest.approx(0.1) and s["itl_p99"] == pytest.approx(0.197)
    # Request 0 (TPOT 0.1) and 2 (one token) meet the SLO; 1 misses TTFT; 3 failed.
    assert s["good_requests"] == 2 and s["goodput"] == 0.5 and s["slo_attainment"] == 0.5
    assert s["errors"] == ["HTTP 503: full"]


def test_measure_runs_every_batching_on_the_same_trace():
    ps = prompts(6, seed=2)
    specs = [RequestSpec({"prompt": p, "max_tokens": 5, "temperature": 0, "ignore_eos": True})
             for p in ps]
    seen = []
    for batching in ("continuous", "static", "none"):
        rows = bench.measure(lambda: tiny_llm(max_num_seqs=4), specs, [50.0, math.inf],
                             batching=batching, on_result=seen.append)
        for row in rows:
            assert row["completed"] == 6 and row["output_tokens"] == 30
            assert row["ttft_p50"] <= row["ttft_p99"] and row["itl_p50"] is not None
            assert 0 <= row["slo_attainment"] <= 1
    assert len(seen) == 6 and [r["rate"] for r in seen[:2]] == [50.0, math.inf]
    # Chat requests work too.
    with bench.serving(tiny_llm()) as url:
        results, _ = bench.run_load(url, [RequestSpec({"messages": [{"role": "user",
                                                                      "content": "hi"}],
                                                        "max_tokens": 3, "ignore_eos": True},
                                                       endpoint="chat")], [0.0])
    assert results[0].ok and results[0].output_tokens == 3


def test_online_section_reads_its_target_and_goodput_floor():
    from benchmarks import bench_online
    from benchmarks.output import Output

    def row(batching, rate, ttft99, out_tps, attain):
        return {"batching": batching, "rate": rate, "requests": 32, "completed": 32,
                "ttft_p50": ttft99 / 2, "ttft_p99": ttft99, "tpot_p50": 0.1, "tpot_p99": 0.2,
                "itl_p50": 0.1, "itl_p99": 0.3, "request_throughput": 0.5,
                "output_throughput": out_tps, "slo_attainment": attain, "uptime_load": 1.0}

    rows = [row("continuous", 0.5, 0.9, 30.0, 0.95), row("static", 0.5, 4.0, 20.0, 0.5),
            row("none", 0.5, 12.0, 6.0, 0.1), row("continuous", 1.0, 1.5, 50.0, 0.8),
            row("none", 1.0, 30.0, 6.5, 0.0)]
    target = bench_online.evaluate(rows)
    assert target["rate"] == 1.0 and target["met"] is True
    assert target["speedup"] == pytest.approx(50 / 6.5)
    assert bench_online.goodput_falls_at(rows) == 1.0
    assert bench_online.target_rate(rows, (0.5, 1.0)) == 1.0
    assert bench_online.evaluate([r for r in rows if r["batching"] != "none"])["met"] is None
    result = {"requests": 32, "prompt_tokens": 4332, "output_tokens": 2289, "slo": {"ttft": 2.0,
              "tpot": 0.25}, "max_num_seqs": 32, "rows": rows, "target": target,
              "goodput_below_floor_at": 1.0}
    assert len(bench_online.table_rows(result)) == 5
    bench_online.print_online(Output(quiet=True), result)


# ---------------------------------------------------------------- replay on the engine's clock

def replay_requests(n=6, max_tokens=5):
    from transformer_lab.serve import SamplingParams
    return [(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            for p in prompts(n, seed=11)]


@pytest.mark.parametrize("batching", ["continuous", "static", "none"])
def test_replay_serves_every_request_whole(batching):
    reqs = replay_requests()
    results, duration = bench.replay(tiny_llm(max_num_seqs=4), reqs, [0.0] * len(reqs),
                                     batching=batching)
    assert all(r.ok and r.output_tokens == 5 and r.finish_reason == "length" for r in results)
    assert all(0 < r.ttft <= r.e2e <= duration for r in results)
    assert all(len(r.itl) == 4 for r in results)  # one delivery a step after the first
    assert bench.summarize(results, duration)["completed"] == len(reqs)


def test_replay_one_at_a_time_never_overlaps_and_static_waits_for_the_batch():
    reqs = replay_requests()
    results, _ = bench.replay(tiny_llm(max_num_seqs=4), reqs, [0.0] * 6, batching="none")
    ends = sorted(r.e2e for r in results)
    firsts = sorted(r.ttft for r in results)
    assert all(firsts[i + 1] > ends[i] for i in range(5))  # request i+1 starts after i ends
    results, _ = bench.replay(tiny_llm(max_num_seqs=4), reqs, [0.0] * 6, batching="static")
    first_batch_end = max(r.e2e for r in results[:4])
    assert all(r.ttft > first_batch_end for r in results[4:])  # 4 first, then the other 2


def test_replay_idles_until_the_next_arrival():
    reqs = replay_requests(2)
    results, duration = bench.replay(tiny_llm(), reqs, [0.0, 50.0])
    assert results[1].send_time == 50.0 and duration > 50.0
    assert results[1].ttft < 50.0  # its wait starts at its arrival, not at the run's start


def test_replay_refuses_what_it_cannot_run():
    reqs = replay_requests(2)
    with pytest.raises(ValueError, match="batching must be one of"):
        bench.replay(tiny_llm(), reqs, [0.0, 0.0], batching="sometimes")
    with pytest.raises(ValueError, match="2 requests but 1 arrival"):
        bench.replay(tiny_llm(), reqs, [0.0])


def test_measure_replay_gives_one_row_per_rate():
    rows = bench.measure_replay(lambda: tiny_llm(max_num_seqs=4), replay_requests(), [1.0, 100.0],
                                batching="continuous", seed=2)
    assert [r["rate"] for r in rows] == [1.0, 100.0]
    assert all(r["completed"] == 6 and r["output_tokens"] == 30 for r in rows)
