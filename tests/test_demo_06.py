"""Demo 06's observations: the counts and structure on computed results, and the wording of the
timing sentences on synthetic timings (no test depends on how fast this machine is)."""
import numpy as np
import pytest

from console import fmt_time
from demo_helpers import demo, rendered_text

D06 = demo(6)


@pytest.fixture(scope="module")
def quick():
    return D06.compute(quick=True)


def flat(items):
    return " ".join(" ".join(items).split())


def fake(loop_s, matmul_s, attention_s, n=4096):
    """A result with the given timings at one n; every count is the demo's own."""
    d = D06.D
    timing = {"n": n, "loop_s": loop_s, "matmul_s": matmul_s, "attention_s": attention_s,
              "step_s": loop_s / n, "same_err": 1e-6, "rnn_flops": 4 * n * d * d,
              "matmul_flops": D06.matmul_flops(n, 2 * d, d),
              "attention_flops": 2 * n * (n + 1) * d}
    return {"d": d, "dtype": "float32", "repeats": 3,
            "flops": [D06.flop_counts(m) for m in D06.FLOP_NS], "timings": [timing],
            "decode": D06.decode_intensity(), "matmul_intensity": D06.matmul_intensity(n)}


def test_the_synthetic_results_have_the_real_shape(quick):
    made = fake(1.0, 1.0, 1.0)
    assert set(made) == set(quick) and set(made["timings"][0]) == set(quick["timings"][0])


# ---------------------------------------------------------------- counts

@pytest.mark.parametrize("n", D06.FLOP_NS)
def test_flop_counts(n):
    d = 256
    c = D06.flop_counts(n, d)
    assert c["rnn"] == 4 * n * d * d
    assert c["attention_core"] == 4 * n * n * d
    assert c["projections"] == 8 * n * d * d
    assert c["causal_core"] == 4 * d * (n * (n + 1) // 2)  # the visible (query, key) pairs
    assert (c["rnn_steps"], c["attention_steps"]) == (n, 1)
    # per token: 4d² for the RNN and 4nd for the core, so the core does n/d times the work
    assert c["attention_core"] / c["rnn"] == n / d
    assert (c["attention_core"] < c["rnn"]) == (n < d)  # "below n = d attention is cheaper"


def test_the_flop_table_is_the_spec(quick):
    assert quick["d"] == 256 and [r["n"] for r in quick["flops"]] == [64, 256, 1024, 4096]
    text = flat(D06.observations(quick, "en"))
    assert "0.25× at n = 64, 16× at n = 4096 (d = 256)" in text
    assert "the RNN takes 4096 steps in a row, attention 1" in text


def test_one_matmul_does_the_same_flops_as_the_loop(quick):
    for m in quick["timings"]:
        n, d = m["n"], quick["d"]
        assert m["matmul_flops"] == m["rnn_flops"] == 2 * D06.matmul_flops(1, d, d) * n
        assert m["attention_flops"] == 2 * n * (n + 1) * d  # causal: the visible half


def test_one_matmul_reproduces_the_loop_states(quick):
    for m in quick["timings"]:
        assert m["same_err"] < 1e-4  # float32 rounding only


def test_the_loop_is_the_recurrence():
    rng = np.random.default_rng(0)
    w_h, w_x = D06.rnn_weights(32)
    x = rng.normal(size=(20, 32)).astype(np.float32)
    states = D06.rnn_loop(x, w_h, w_x)
    assert states.dtype == np.float32 and states.shape == (20, 32)
    h = np.zeros(32)
    for t in range(20):
        h = np.tanh(h @ w_h.astype(np.float64) + x[t] @ w_x.astype(np.float64))
        np.testing.assert_allclose(states[t], h, atol=1e-5)
    # step t depends on step 0: the steps cannot run side by side
    x2 = x.copy()
    x2[0] += 1
    assert np.abs(D06.rnn_loop(x2, w_h, w_x)[-1] - states[-1]).max() > 1e-6


def test_timing_sizes_and_best_of_three(quick):
    assert [m["n"] for m in quick["timings"]] == list(D06.QUICK_TIME_NS) == [64, 256, 512]
    assert D06.TIME_NS == (256, 1024, 4096) and D06.REPEATS == 3
    assert quick["dtype"] == "float32"
    calls = []
    t = D06.best_time(lambda: calls.append(1))
    assert len(calls) == 1 + 3 and t >= 0  # one warm-up, then best of 3


def test_decode_is_memory_bound_by_the_numbers(quick):
    dec = quick["decode"]
    d = 256
    assert dec["itemsize"] == 4
    assert dec["flops"] == 4 * d * d and dec["weight_bytes"] == 2 * d * d * 4
    assert dec["flops_per_byte"] == 0.5  # 2 FLOPs per 4-byte weight
    assert quick["matmul_intensity"] > 100 * dec["flops_per_byte"]
    assert D06.matmul_intensity(4096) == pytest.approx(
        4 * 4096 * d * d / ((4096 * 2 * d + 2 * d * d + 4096 * d) * 4))
    text = flat(D06.observations(quick, "en"))
    assert "512 KiB read for 262 K FLOPs per step, only 0.5 FLOP/byte" in text
    assert f"against {quick['matmul_intensity']:.0f} FLOP/byte" in text


# ---------------------------------------------------------------- wording follows the timings

@pytest.mark.parametrize("loop_s, matmul_s, word", [
    (40e-3, 4e-3, "10.0× slower"),
    (2e-3, 4e-3, "2.0× faster"),
    (4.2e-3, 4e-3, "about as long"),
])
def test_loop_vs_matmul_wording(loop_s, matmul_s, word):
    items = D06.observations(fake(loop_s, matmul_s, 1.0), "en")
    line = flat([items[1]])
    assert word in line
    assert (" slower " in line) == (loop_s / matmul_s >= D06.SIMILAR)
    assert (" faster " in line) == (matmul_s / loop_s >= D06.SIMILAR)


@pytest.mark.parametrize("attention_s, word", [
    (10e-3, "4.0× faster, because"),  # less time than the loop
    (41e-3, "about as long, so per FLOP attention ran 7.8× faster"),  # 8.0 / 1.025
    (80e-3, "2.0× as long, but per FLOP it ran 4.0× faster"),  # less than 8× the time
    (800e-3, "20.0× as long: on this machine the extra work was not paid back"),
])
def test_attention_wording(attention_s, word):
    line = flat([D06.observations(fake(40e-3, 4e-3, attention_s), "en")[2]])
    # causal: 2n(n+1)d / 4nd² = (n+1)/2d = 4097/512 at n = 4096
    assert line.startswith("At n = 4096 causal attention needs 8.0× the RNN's FLOPs")
    assert f"took {fmt_time(attention_s)}, against {fmt_time(40e-3)} for the RNN loop" in line
    assert line.split("RNN loop: ", 1)[1].startswith(word)  # the verdict follows the numbers


def test_attention_wording_without_a_per_flop_gain():
    # n = 512: attention needs about 1.0x the RNN's FLOPs; the same time is no per-FLOP gain
    line = flat([D06.observations(fake(4e-3, 1e-3, 4.1e-3, n=512), "en")[2]])
    assert "needs 1.0× the RNN's FLOPs" in line and line.endswith("loop: about as long.")
    assert "per FLOP" not in line


@pytest.mark.parametrize("attention_s, tail", [(10e-3, "注意力快了 4.0 倍"),
                                               (41e-3, "两者差不多，所以每个 FLOP 注意力快了"),
                                               (80e-3, "但每个 FLOP 快了 4.0 倍"),
                                               (800e-3, "没有被并行赚回来")])
def test_chinese_wording_follows_the_same_choice(attention_s, tail):
    line = D06.observations(fake(40e-3, 4e-3, attention_s), "zh")[2]
    assert line.startswith("n = 4096 时，因果注意力需要的 FLOPs")
    assert tail in line


def test_chinese_loop_wording():
    assert "逐步慢了 10.0 倍" in D06.observations(fake(40e-3, 4e-3, 1.0), "zh")[1]
    assert "逐步反而快 2.0 倍" in D06.observations(fake(2e-3, 4e-3, 1.0), "zh")[1]
    assert "两者差不多" in D06.observations(fake(4.2e-3, 4e-3, 1.0), "zh")[1]


# ---------------------------------------------------------------- the real run's sentences

@pytest.mark.parametrize("lang", ["zh", "en"])
def test_observations_quote_the_measured_numbers(quick, lang):
    m = quick["timings"][-1]
    text = flat(D06.observations(quick, lang))
    for key in ("loop_s", "matmul_s", "attention_s", "step_s"):
        assert fmt_time(m[key]) in text
    ratio = m["loop_s"] / m["matmul_s"]
    if ratio >= D06.SIMILAR:
        assert f"{ratio:.1f}" in text


def test_the_tables_render(quick):
    text = rendered_text(D06, quick, "en")
    for m in quick["timings"]:
        assert fmt_time(m["loop_s"]) in text
    assert "16×" in text and "4096" in text
