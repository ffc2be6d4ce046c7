"""transformer_lab.measure: the figures are well-formed, and every branch of the steadiness
rules and the re-measuring runs on scripted timings (no assertion on how fast anything is)."""
import numpy as np
import pytest

from transformer_lab import TINY, init_params, named_params
from transformer_lab import measure
from transformer_lab.measure import (UNSTEADY, WAIT_LIMIT, Budget, bandwidth_matrix, cpu_wait_s,
                                     matmul_peak, param_bytes, peak_rss_bytes, read_bandwidth,
                                     row_summary,
                                     speed_check, summarize, time_call, time_rows,
                                     time_side_by_side, timed, unsteadiness)

QUIET = [1.00e-3, 1.02e-3, 1.05e-3, 1.01e-3, 1.03e-3]
NOISY = [1.0e-3, 3.2e-3, 1.1e-3, 2.0e-3, 1.0e-3]  # slowest / fastest = 3.2


class Script:
    """A stand-in for measure.run_side_by_side: each figure's repeats come from a plan.

    plan: figure name -> list of attempts, each a list of seconds (or a (seconds, waits)
    pair); the last attempt repeats once the list is used up. Records every call.
    """

    def __init__(self, plan):
        self.plan = plan
        self.calls = []

    def __call__(self, fns, *, repeats=5, warmup=1):
        self.calls.append(tuple(fns))
        out = {}
        for name in fns:
            attempts = self.plan[name]
            n = sum(1 for call in self.calls if name in call) - 1
            attempt = attempts[min(n, len(attempts) - 1)]
            times, waits = attempt if isinstance(attempt, tuple) else (attempt, [0.0] * len(attempt))
            out[name] = {"times": list(times), "waits": waits}
        return out


# ---------------------------------------------------------------- real calls, shapes only

def test_time_side_by_side_runs_each_function_warmup_plus_repeats_times():
    calls = {"a": 0, "b": 0}

    def make(name):
        def fn():
            calls[name] += 1
        return fn

    stats = time_side_by_side({"a": make("a"), "b": make("b")}, repeats=4, warmup=2)
    assert calls == {"a": 6, "b": 6}
    for s in stats.values():
        assert s["repeats"] == 4 and 0 <= s["best_s"] <= s["median_s"] <= s["max_s"]
        assert s["spread"] >= 1 and isinstance(s["steady"], bool)
        assert s["waited"] is None or s["waited"] >= 0


def test_run_side_by_side_keeps_every_repeat():
    raw = measure.run_side_by_side({"x": lambda: None, "y": lambda: None}, repeats=3, warmup=0)
    for r in raw.values():
        assert len(r["times"]) == 3
        assert r["waits"] is None or (len(r["waits"]) == 3 and min(r["waits"]) >= 0)


def test_cpu_wait_is_known_on_linux_or_none():
    first = cpu_wait_s()
    if first is not None:
        assert first >= 0 and cpu_wait_s() >= first


def test_timed_returns_the_value_and_its_time():
    value, seconds = timed(lambda: 42)
    assert value == 42 and seconds >= 0


def test_matmul_peak_and_bandwidth_report_positive_rates():
    peak = matmul_peak(64, repeats=2)
    assert peak["flops"] == 2 * 64 ** 3 and peak["flops_per_s"] > 0 and peak["spread"] >= 1
    bw = read_bandwidth(4 * 2**20, repeats=2)
    assert bw["bytes"] == 4 * 2**20 and bw["bytes_per_s"] > 0 and "steady" in bw
    assert time_call(lambda: None, repeats=2)["repeats"] == 2


def test_bandwidth_streams_the_matrix_it_is_given():
    matrix = bandwidth_matrix(2 * 2**20)
    assert matrix.dtype == np.float32 and matrix.shape == (128, 4096)
    assert read_bandwidth(repeats=2, matrix=matrix)["bytes"] == matrix.nbytes == 2 * 2**20


def test_param_bytes_counts_every_array():
    params = init_params(TINY)
    leaves = [a for _, a in named_params(params)]
    assert param_bytes(params) == sum(a.nbytes for a in leaves) == sum(a.size for a in leaves) * 8
    assert peak_rss_bytes() is None or peak_rss_bytes() > 1e6


# ---------------------------------------------------------------- one figure

def test_a_quiet_figure_is_steady():
    s = summarize(QUIET, [0.0] * 5)
    assert s["best_s"] == 1.00e-3 and s["median_s"] == 1.02e-3 and s["max_s"] == 1.05e-3
    assert s["spread"] == pytest.approx(1.05) and s["waited"] == 0 and s["steady"]


def test_repeats_that_disagree_make_a_figure_unsteady():
    s = summarize(NOISY)
    assert s["spread"] == pytest.approx(3.2) and s["waited"] is None and not s["steady"]
    assert summarize([1.0, UNSTEADY])["steady"]  # the limit itself still counts as steady


def test_waiting_for_a_cpu_makes_a_figure_unsteady_even_when_repeats_agree():
    # Slowed alike in every repeat: the spread cannot see it, the wait can.
    s = summarize(QUIET, [0.5e-3] * 5)
    assert s["spread"] < UNSTEADY and s["waited"] == pytest.approx(0.49, abs=0.01)
    assert not s["steady"]
    assert summarize(QUIET, [0.99 * WAIT_LIMIT * t for t in QUIET])["steady"]


def test_zero_times_do_not_divide_by_zero():
    assert summarize([0.0, 0.0])["spread"] == 1.0
    assert summarize([0.0, 1.0])["spread"] == float("inf")


# ---------------------------------------------------------------- rows and re-measuring

def rows_of(*keys):
    """Rows with two figures each, named after the row: a1, a2 for row a."""
    return {k: {f"{k}1": lambda: None, f"{k}2": lambda: None} for k in keys}


def test_quiet_rows_are_measured_once(monkeypatch):
    script = Script({name: [QUIET] for name in ("a1", "a2", "b1", "b2")})
    monkeypatch.setattr(measure, "run_side_by_side", script)
    out = time_rows(rows_of("a", "b"), budget=2.0)
    assert len(script.calls) == 2
    for row in out.values():
        assert row["steady"] and row["attempts"] == 1 and row["remeasured_s"] == 0
        assert row["spread"] == pytest.approx(1.05) and row["waited"] == 0
        assert set(row["figures"]) <= {"a1", "a2", "b1", "b2"}


def test_one_noisy_row_is_remeasured_and_settles(monkeypatch):
    script = Script({"a1": [QUIET], "a2": [QUIET], "b1": [NOISY, QUIET], "b2": [QUIET]})
    monkeypatch.setattr(measure, "run_side_by_side", script)
    out = time_rows(rows_of("a", "b"), budget=2.0)
    assert script.calls == [("a1", "a2"), ("b1", "b2"), ("b1", "b2")]
    assert out["a"]["attempts"] == 1 and out["b"]["attempts"] == 2
    assert out["b"]["steady"] and out["b"]["figures"]["b1"]["median_s"] == QUIET[1]
    assert out["b"]["remeasured_s"] > 0


def test_a_row_that_stays_noisy_is_remeasured_while_another_attempt_fits_the_budget(monkeypatch):
    slow = [t * 100 for t in NOISY]  # 0.83 s per attempt of row b, with b2's 5 ms: 0.835 s
    script = Script({"a1": [QUIET], "a2": [QUIET], "b1": [slow], "b2": [QUIET]})
    monkeypatch.setattr(measure, "run_side_by_side", script)
    budget = Budget(2.0)
    out = time_rows(rows_of("a", "b"), budget=budget)
    assert out["a"]["steady"] and not out["b"]["steady"]
    # Two more attempts fit in 2 s (1.67 s); a third would end at 2.51 s.
    assert out["b"]["attempts"] == 3 and out["b"]["remeasured_s"] == budget.spent
    assert budget.spent == pytest.approx(2 * (sum(slow) + sum(QUIET)))
    assert out["b"]["spread"] == pytest.approx(3.2) and not budget.fits(0.835)


def test_an_attempt_that_would_overrun_the_budget_is_not_started(monkeypatch):
    # A machine so slow that one attempt costs more than the whole budget: measured once.
    script = Script({"b1": [[3.0, 1.0, 1.0]], "b2": [[1.0, 1.0, 1.0]]})
    monkeypatch.setattr(measure, "run_side_by_side", script)
    budget = Budget(2.0)
    row = time_rows(rows_of("b"), budget=budget)["b"]
    assert row["attempts"] == 1 and not row["steady"] and budget.spent == 0


def test_the_steadier_attempt_is_kept(monkeypatch):
    worse = [1e-3, 9e-3, 1e-3, 1e-3, 1e-3]
    better = [1e-3, 2e-3, 1e-3, 1e-3, 1e-3]
    script = Script({"b1": [NOISY, worse, better, worse], "b2": [QUIET]})
    monkeypatch.setattr(measure, "run_side_by_side", script)
    # Attempts cost 18, 11 and 18 ms (with b2's 5 ms): all three fit in 50 ms, a fourth not.
    out = time_rows(rows_of("b"), budget=0.05)
    assert out["b"]["attempts"] == 4 and out["b"]["spread"] == pytest.approx(2.0)


def test_everything_noisy_shares_one_budget(monkeypatch):
    script = Script({name: [[t * 100 for t in NOISY]] for name in ("a1", "a2", "b1", "b2")})
    monkeypatch.setattr(measure, "run_side_by_side", script)
    budget = Budget(2.0)
    out = time_rows(rows_of("a", "b"), budget=budget)
    assert not out["a"]["steady"] and not out["b"]["steady"]
    # 1.66 s per attempt of a row: one re-measurement fits, for the first row only.
    assert [row["attempts"] for row in out.values()] == [2, 1]
    assert time_rows(rows_of("a"), budget=budget)["a"]["attempts"] == 1  # nothing left


def test_a_busy_machine_that_slows_every_repeat_alike_is_caught(monkeypatch):
    waited = (QUIET, [0.8e-3] * 5)
    script = Script({"a1": [waited], "a2": [QUIET]})
    monkeypatch.setattr(measure, "run_side_by_side", script)
    row = time_rows(rows_of("a"), budget=0.0)["a"]
    assert row["spread"] < UNSTEADY and row["waited"] > WAIT_LIMIT and not row["steady"]
    assert row["attempts"] == 1  # no budget: measured once


def test_instant_functions_stop_after_max_attempts(monkeypatch):
    script = Script({"a1": [[0.0, 0.0, 1e-9]], "a2": [[0.0]]})
    monkeypatch.setattr(measure, "run_side_by_side", script)
    row = time_rows(rows_of("a"), budget=1e9)["a"]
    assert row["attempts"] == measure.MAX_ATTEMPTS and not row["steady"]


def test_unknown_waits_leave_the_spread_to_decide():
    row = row_summary({"x": summarize(QUIET), "y": summarize(QUIET, [0.0] * 5)})
    assert row["waited"] is None and row["steady"] and unsteadiness(row) <= 1


def test_speed_check():
    same = speed_check(300e9, 280e9, "matmul peak")
    assert not same["changed"] and same["ratio"] == pytest.approx(280 / 300)
    assert speed_check(300e9, 100e9, "matmul peak")["changed"]
    assert speed_check(100e9, 300e9, "matmul peak")["changed"]
