"""Demo 06's observations: the counts and structure on computed results, and the wording of the
timing sentences on synthetic timings (no test depends on how fast this machine is)."""
import numpy as np
import pytest

from console import fmt_time
from demo_helpers import ScriptedTimings, demo, jittered, rendered_text
from transformer_lab import measure
from transformer_lab.measure import UNSTEADY, WAIT_LIMIT, speed_check

D06 = demo(6)


@pytest.fixture(scope="module")
def quick():
    return D06.compute(quick=True)


def flat(items):
    return " ".join(" ".join(items).split())


def timing(loop_s, matmul_s, attention_s, n=4096, spread=1.05, waited=0.0):
    """One row of timings at n; unsteady when the spread or the wait is over the limit."""
    d = D06.D
    steady = spread <= UNSTEADY and waited <= WAIT_LIMIT
    return {"n": n, "loop_s": loop_s, "matmul_s": matmul_s, "attention_s": attention_s,
            "step_s": loop_s / n, "same_err": 1e-6, "rnn_flops": 4 * n * d * d,
            "matmul_flops": D06.matmul_flops(n, 2 * d, d),
            "attention_flops": 2 * n * (n + 1) * d,
            "spreads": {"loop": spread, "matmul": 1.0, "attention": 1.0}, "spread": spread,
            "waited": waited, "steady": steady, "attempts": 1 if steady else 3,
            "remeasured_s": 0.0 if steady else 1.0}


def fake(loop_s, matmul_s, attention_s, n=4096, rows=None, peak=(300e9, 290e9)):
    """A result with the given timings at one n (or the given rows); every count is the
    demo's own."""
    d = D06.D
    rows = rows or [timing(loop_s, matmul_s, attention_s, n)]
    return {"d": d, "dtype": "float32", "repeats": 5, "budget_s": 1.0,
            "flops": [D06.flop_counts(m) for m in D06.FLOP_NS], "timings": rows,
            "speed_check": {**speed_check(*peak, "matmul peak"), "n": D06.PEAK_N},
            "decode": D06.decode_intensity(),
            "matmul_intensity": D06.matmul_intensity(rows[-1]["n"])}


def test_the_synthetic_results_have_the_real_shape(quick):
    made = fake(1.0, 1.0, 1.0)
    assert set(made) == set(quick) and set(made["timings"][0]) == set(quick["timings"][0])
    assert set(made["speed_check"]) == set(quick["speed_check"])


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


def test_timing_sizes_and_medians_of_five(quick):
    assert [m["n"] for m in quick["timings"]] == list(D06.QUICK_TIME_NS) == [64, 256, 512]
    assert D06.TIME_NS == (256, 1024, 4096) and D06.REPEATS == quick["repeats"] == 5
    assert quick["dtype"] == "float32"
    for m in quick["timings"]:
        assert m["spread"] == max(m["spreads"].values()) >= 1
        assert m["steady"] == (m["spread"] <= UNSTEADY
                               and (m["waited"] is None or m["waited"] <= WAIT_LIMIT))
        assert m["attempts"] >= 1 and m["step_s"] == m["loop_s"] / m["n"]
    check = quick["speed_check"]
    assert check["n"] == D06.PEAK_N and check["before"] > 0 and check["after"] > 0


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

@pytest.mark.parametrize("loop_s, matmul_s, verdict", [
    (40e-3, 4e-3, "slower"), (2e-3, 4e-3, "faster"), (4.2e-3, 4e-3, "same"),
])
def test_the_loop_verdict_follows_the_timings(loop_s, matmul_s, verdict):
    f = D06.findings(fake(loop_s, matmul_s, 1.0))
    assert f["loop"] == verdict and f["loop_vs_matmul"] == loop_s / matmul_s


@pytest.mark.parametrize("loop_s, matmul_s, attention_s, n, verdict", [
    (40e-3, 4e-3, 10e-3, 4096, "faster"),  # less time than the loop
    (40e-3, 4e-3, 41e-3, 4096, "same_per_flop"),  # about as long for 8x the FLOPs
    (40e-3, 4e-3, 80e-3, 4096, "cheaper"),  # less than 8x the time
    (40e-3, 4e-3, 800e-3, 4096, "slower"),
    (4e-3, 1e-3, 4.1e-3, 512, "same"),  # n = 512: about 1.0x the FLOPs, the same time
])
def test_the_attention_verdict_follows_the_timings(loop_s, matmul_s, attention_s, n, verdict):
    f = D06.findings(fake(loop_s, matmul_s, attention_s, n=n))
    # causal: 2n(n+1)d / 4nd² = (n+1)/2d
    assert f["attention_flops_x"] == pytest.approx((n + 1) / (2 * D06.D))
    assert f["attention_time_x"] == attention_s / loop_s and f["attn"] == verdict


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_each_verdict_has_its_own_sentence(lang):
    lines = {D06.observations(fake(40e-3, 4e-3, a), lang)[2] for a in (10e-3, 41e-3, 80e-3, 800e-3)}
    loops = {D06.observations(fake(l, 4e-3, 1.0), lang)[1] for l in (40e-3, 2e-3, 4.2e-3)}
    assert len(lines) == 4 and len(loops) == 3


# ---------------------------------------------------------------- the real run's sentences

@pytest.mark.parametrize("lang", ["zh", "en"])
def test_observations_quote_the_measured_numbers(quick, lang):
    m = D06.quoted_timing(quick)
    steady = [r for r in quick["timings"] if r["steady"]]
    assert m is (steady[-1] if steady else quick["timings"][-1])
    items = D06.observations(quick, lang)
    text = flat(items)
    for key in ("loop_s", "matmul_s", "attention_s") + (("step_s",) if m["steady"] else ()):
        assert fmt_time(m[key]) in text
    ratio = m["loop_s"] / m["matmul_s"]
    if m["steady"] and ratio >= D06.SIMILAR:
        assert f"{ratio:.1f}" in text
    unknown = "could not be determined here" if lang == "en" else "无法判断"
    assert (unknown in text) == (not m["steady"])
    busy = D06.busy_sentence(quick, lang)
    assert (busy is None) == (bool(steady) and len(steady) == len(quick["timings"])
                              and not quick["speed_check"]["changed"])
    if busy:
        assert items[0] == busy


def test_the_tables_render(quick):
    text = rendered_text(D06, quick, "en")
    for m in quick["timings"]:
        assert fmt_time(m["loop_s"]) in text
    assert "16×" in text and "4096" in text


# ---------------------------------------------------------------- a busy machine

def three_rows(noisy=(), waited=()):
    """Rows at n = 64, 256, 512 with a clear ordering; the given n are unsteady."""
    return [timing(40e-3, 4e-3, 10e-3, n=n, spread=3.2 if n in noisy else 1.05,
                   waited=0.9 if n in waited else 0.0) for n in (64, 256, 512)]


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_a_quiet_run_says_nothing_about_noise(lang):
    result = fake(0, 0, 0, rows=three_rows())
    items = D06.observations(result, lang)
    assert len(items) == 5 and D06.busy_sentence(result, lang) is None
    text = rendered_text(D06, result, lang)
    assert "~" not in text and "1.1×" in text  # the spread column, nothing marked


def test_one_noisy_row_is_marked_and_the_observations_quote_a_steady_one():
    result = fake(0, 0, 0, rows=three_rows(noisy=(512,)))
    items = D06.observations(result, "en")
    assert items[0].startswith("The machine was busy while measuring: repeats varied by up "
                               "to 3.2×; orderings marked ~ may not hold")
    assert "waited for a CPU" not in items[0]
    assert flat([items[2]]).startswith("At n = 256 the step-by-step RNN") and "10.0× slower" \
        in items[2]
    assert "At n = 256 causal attention" in items[3] and "could not be determined" not in \
        flat(items)
    text = rendered_text(D06, result, "en")
    assert "512 ~" in text and " 256 " in text and "256 ~" not in text
    assert "~ rows still unsteady after 1.00 s of re-measuring: their repeats" in flat([text])
    rows = three_rows(noisy=(512,))
    rows[-1]["remeasured_s"] = 0.0
    assert ("~ rows unsteady (one more measurement would not have fitted in the 1.00 s "
            "re-measuring budget): their repeats") in flat([rendered_text(D06, fake(
                0, 0, 0, rows=rows), "en")])


@pytest.mark.parametrize("lang, unknown", [("en", "could not be determined here"),
                                           ("zh", "无法判断")])
def test_everything_noisy_claims_no_ordering(lang, unknown):
    result = fake(0, 0, 0, rows=three_rows(noisy=(64, 256), waited=(512,)))
    items = D06.observations(result, lang)
    text = flat(items)
    assert items[1 if lang == "en" else 1].count("FLOPs") >= 1
    assert unknown in items[2] and unknown in items[3]
    for verdict in ("slower", "faster, because", "as long", "慢了", "快了", "差不多"):
        assert verdict not in flat(items[2:4]), verdict
    if lang == "en":
        assert text.startswith("The machine was busy while measuring: repeats varied by up to "
                               "3.2×, and this demo's threads waited for a CPU for 90% of the "
                               "measured time (summed over threads)")
        assert "At n = 512" in items[2]  # the largest n, since none was steady
    else:
        assert text.startswith("测量时机器很忙：重复测量的结果相差最多 3.2 倍，本演示的线程等 CPU "
                               "的时间是测量时间的 90%")
    rendered = rendered_text(D06, result, lang)
    assert rendered.count("~") >= 2 * 3 + 1  # every row in both tables, and the footnote


@pytest.mark.parametrize("lang, word", [("en", "The machine's speed changed mid-demo: a "
                                               "1024×1024 float32 matmul ran at 300 GFLOP/s at "
                                               "the start and 100 GFLOP/s at the end."),
                                        ("zh", "机器的速度在演示中途变了")])
def test_a_change_in_the_machines_speed_is_reported(lang, word):
    result = fake(0, 0, 0, rows=three_rows(), peak=(300e9, 100e9))
    assert word in flat([D06.observations(result, lang)[0]])
    assert D06.busy_sentence(fake(0, 0, 0, rows=three_rows()), lang) is None


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_busy_results_render_within_80_columns(lang):
    from rich.cells import cell_len
    result = fake(0, 0, 0, rows=three_rows(noisy=(64, 256, 512)), peak=(300e9, 100e9))
    text = rendered_text(D06, result, lang)
    assert max(cell_len(line) for line in text.splitlines()) <= 80


# ---------------------------------------------------------------- compute() on scripted timings

ROW = ("loop", "matmul", "attention")


def scripted(noisy_rows=(), settle=False, slow_peak=False, waited=False):
    """Timings for compute(quick=True): rows n = 64, 256, 512 are the first three calls with
    these names; later calls re-measure the unsteady ones in order."""
    noisy_rows = set(noisy_rows)
    order = []  # which n each call with the row's names measures

    def plan(names, k):
        if names == ("fn",):  # the matmul peak, before (k = 0) and after (k = 1)
            return {"fn": jittered(21e-3 if slow_peak and k else 7e-3)}
        n = (64, 256, 512)[k] if k < 3 else [m for m in (64, 256, 512) if m in noisy_rows][
            (k - 3) % len(noisy_rows)]
        order.append(n)
        noisy = n in noisy_rows and not (settle and k >= 3)
        base = {"loop": 40e-3 * n / 512, "matmul": 4e-3 * n / 512, "attention": 10e-3 * n / 512}
        if noisy and waited:
            return {name: (jittered(s), [0.9 * x for x in jittered(s)])
                    for name, s in base.items()}
        return {name: jittered(s, 3.2 if noisy else 1.05) for name, s in base.items()}

    script = ScriptedTimings(plan)
    script.order = order
    return script


def test_compute_on_quiet_timings(monkeypatch):
    script = scripted()
    monkeypatch.setattr(measure, "run_side_by_side", script)
    result = D06.compute(quick=True)
    assert script.order == [64, 256, 512]
    assert all(m["steady"] and m["attempts"] == 1 for m in result["timings"])
    m = result["timings"][-1]
    assert m["loop_s"] == 40e-3 * 1.025 and m["spread"] == pytest.approx(1.05)
    assert not result["speed_check"]["changed"]
    assert D06.busy_sentence(result, "en") is None
    assert "10.0× slower" in D06.observations(result, "en")[1]


def test_compute_remeasures_a_noisy_row_until_it_settles(monkeypatch):
    script = scripted(noisy_rows=(512,), settle=True)
    monkeypatch.setattr(measure, "run_side_by_side", script)
    result = D06.compute(quick=True)
    assert script.order == [64, 256, 512, 512]
    assert all(m["steady"] for m in result["timings"])
    assert result["timings"][-1]["attempts"] == 2


def test_compute_marks_a_row_that_stays_noisy(monkeypatch):
    script = scripted(noisy_rows=(512,))
    monkeypatch.setattr(measure, "run_side_by_side", script)
    result = D06.compute(quick=True)
    last = result["timings"][-1]
    assert not last["steady"] and last["attempts"] >= 2 and script.order[-1] == 512
    # re-measured while another attempt fitted in the --quick budget
    attempt = sum(sum(jittered(s, 3.2)) for s in (40e-3, 4e-3, 10e-3))
    assert last["remeasured_s"] == pytest.approx((last["attempts"] - 1) * attempt)
    assert last["remeasured_s"] <= D06.QUICK_BUDGET_S < last["remeasured_s"] + attempt
    assert "At n = 256" in D06.observations(result, "en")[2]


def test_compute_on_a_machine_busy_throughout(monkeypatch):
    script = scripted(noisy_rows=(64, 256, 512), waited=True, slow_peak=True)
    monkeypatch.setattr(measure, "run_side_by_side", script)
    result = D06.compute(quick=True)
    assert not any(m["steady"] for m in result["timings"])
    assert all(m["spread"] < UNSTEADY < 1 + m["waited"] for m in result["timings"])
    assert result["speed_check"]["changed"]
    items = D06.observations(result, "en")
    assert "waited for a CPU" in items[0] and "speed changed mid-demo" in items[0]
    assert "could not be determined here" in items[2]
