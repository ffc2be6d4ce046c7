"""Pipeline schedules (parallel/pipeline.py), exactly: the events of gpipe and 1f1b, the
timeline's dependencies, the bubble against (p - 1) / (m + p - 1) for equal stages and by
hand for unequal ones, the peak in-flight micro-batches per stage, and bad input; and the
schedule run for real, a stage per rank, on 1-3 in-process ranks and under `mpiexec -n 2`
where MPI is installed: loss and grads equal one process's."""
import pytest
from hypothesis import given, settings, strategies as st

from transformer_lab.parallel.pipeline import (bubble, bubble_formula, makespan,
                                               peak_in_flight, pipeline_schedule,
                                               pipeline_timeline, stage_layers)

KINDS = st.sampled_from(["gpipe", "1f1b"])


def test_the_events_of_each_kind():
    assert pipeline_schedule(2, 3, "gpipe") == [
        [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]] * 2
    assert pipeline_schedule(3, 4, "1f1b") == [
        [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)],
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]]
    # fewer micro-batches than the pipe is deep: the warm-up is all of them
    assert pipeline_schedule(4, 2, "1f1b")[0] == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


@settings(max_examples=40)
@given(p=st.integers(1, 6), m=st.integers(1, 12), kind=KINDS)
def test_every_timeline_respects_its_dependencies(p, m, kind):
    schedule = pipeline_schedule(p, m, kind)
    timeline = pipeline_timeline(schedule, forward=[1 + s for s in range(p)], backward=2)
    end = {(k, s, i): e for s, events in enumerate(timeline) for k, i, _, e in events}
    for s, events in enumerate(timeline):
        assert sorted((k, i) for k, i, _, _ in events) == sorted(schedule[s])
        assert [(k, i) for k, i, _, _ in events] == schedule[s]  # in the schedule's order
        for (k, i, start, stop), later in zip(events, events[1:]):
            assert stop <= later[2]  # one event at a time
        for k, i, start, _ in events:
            if k == "F" and s > 0:
                assert start >= end[("F", s - 1, i)]
            if k == "B":
                assert start >= end[("F", s, i)]
                if s < p - 1:
                    assert start >= end[("B", s + 1, i)]


@settings(max_examples=40)
@given(p=st.integers(1, 6), m=st.integers(1, 40), kind=KINDS)
def test_the_bubble_of_equal_stages_is_the_formula(p, m, kind):
    timeline = pipeline_timeline(pipeline_schedule(p, m, kind))
    assert bubble(timeline) == bubble_formula(p, m) == (p - 1) / (m + p - 1)
    assert makespan(timeline) == 2 * (m + p - 1)  # unit forward and backward


def test_the_lecture_figures():
    for kind in ("gpipe", "1f1b"):
        assert round(100 * bubble(pipeline_timeline(pipeline_schedule(4, 8, kind))), 1) == 27.3
        assert round(100 * bubble(pipeline_timeline(pipeline_schedule(4, 32, kind))), 1) == 8.6
        # backward twice the forward, as it costs: the same share
        assert bubble(pipeline_timeline(pipeline_schedule(4, 8, kind), 1, 2)) == 3 / 11


def test_unequal_stages_by_hand():
    # stage 1 twice as slow: stage 0 runs F0 [0,1] F1 [1,2], then waits for stage 1's
    # F0 [1,3] F1 [3,5] B0 [5,7] B1 [7,9]; its own B0 [7,8], B1 [9,10]. Busy 4 + 8 of 2 x 10.
    timeline = pipeline_timeline(pipeline_schedule(2, 2, "gpipe"), [1, 2], [1, 2])
    assert timeline == [[("F", 0, 0, 1), ("F", 1, 1, 2), ("B", 0, 7, 8), ("B", 1, 9, 10)],
                        [("F", 0, 1, 3), ("F", 1, 3, 5), ("B", 0, 5, 7), ("B", 1, 7, 9)]]
    assert bubble(timeline) == 0.4 > bubble_formula(2, 2)


@settings(max_examples=30)
@given(p=st.integers(1, 6), m=st.integers(1, 12))
def test_peak_in_flight(p, m):
    assert peak_in_flight(pipeline_schedule(p, m, "gpipe")) == [m] * p
    assert peak_in_flight(pipeline_schedule(p, m, "1f1b")) == [min(p - s, m) for s in range(p)]


def test_stage_layers():
    assert stage_layers(5, 2) == [(0, 3), (3, 5)]
    assert stage_layers(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_bad_input():
    with pytest.raises(ValueError, match="5 stages are more than the 4 layers"):
        pipeline_schedule(5, 8, "1f1b", n_layers=4)
    with pytest.raises(ValueError, match="5 stages are more than the 4 layers"):
        stage_layers(4, 5)
    with pytest.raises(ValueError, match="micro_batches must be"):
        pipeline_schedule(2, 0, "gpipe")
    with pytest.raises(ValueError, match="stages must be"):
        pipeline_schedule(0, 4, "gpipe")
    with pytest.raises(ValueError, match="kind must be one of gpipe, 1f1b, got 'zb'"):
        pipeline_schedule(2, 4, "zb")
    with pytest.raises(ValueError, match="forward must be a positive number or 2 of them"):
        pipeline_timeline(pipeline_schedule(2, 4, "gpipe"), forward=[1, 2, 3])
    with pytest.raises(ValueError, match="backward must be a positive number"):
        pipeline_timeline(pipeline_schedule(2, 4, "gpipe"), backward=0)
    with pytest.raises(ValueError, match="waits on itself"):
        pipeline_timeline([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])


# ---------------------------------------------------------------- run for real, a stage per rank

def _run_pipeline(cfg, p, m, kind, seed=0):
    """(one process's loss and grads, every stage's (loss, grads, stats), the params)."""
    import numpy as np

    from transformer_lab import init_params
    from transformer_lab.parallel import run_ranks
    from transformer_lab.parallel.pipeline import pipeline_loss_and_grads, pp_shard
    from transformer_lab.training.backward import loss_and_grads
    params = init_params(cfg, seed=seed)
    rng = np.random.default_rng(seed)
    tokens, targets = rng.integers(0, cfg.vocab, (4, 6)), rng.integers(0, cfg.vocab, (4, 6))
    targets[0, :3] = -1  # a prompt the loss ignores

    def body(c):
        shard, held = pp_shard(params, cfg, c.rank, c.size), {}
        loss, grads = pipeline_loss_and_grads(shard, cfg, tokens, targets, c, m, kind, held)
        return loss, grads, dict(c.stats, held=held["peak"])
    return loss_and_grads(params, cfg, tokens, targets), run_ranks(p, body)


@settings(max_examples=10, derandomize=True, deadline=None)
@given(name=st.sampled_from(["llama", "gpt2-tied", "llama-3-layers"]), p=st.integers(1, 3),
       m=st.sampled_from([1, 2, 3, 4]), kind=KINDS)
def test_loss_and_grads_equal_one_process(name, p, m, kind):
    import numpy as np

    from transformer_lab import TINY, TINY_GPT2
    from transformer_lab.params import named_params
    from transformer_lab.parallel.pipeline import pp_shard
    cfg = {"llama": TINY, "gpt2-tied": TINY_GPT2, "llama-3-layers": TINY.replace(n_layers=3)}[name]
    p = min(p, cfg.n_layers)
    (loss, grads), stages = _run_pipeline(cfg, p, m, kind)
    for s, (stage_loss, stage_grads, stats) in enumerate(stages):
        assert stage_loss == pytest.approx(loss, abs=1e-12)
        want = dict(named_params(pp_shard(grads, cfg, s, p)))  # the same cut of the grads
        assert sorted(want) == sorted(dict(named_params(stage_grads)))
        for key, g in named_params(stage_grads):
            np.testing.assert_allclose(g, want[key], rtol=0, atol=1e-10, err_msg=key)
        # m activations sent on (but by the last stage), m grads sent back (but by the first)
        sends = m * ((s < p - 1) + (s > 0))
        assert stats.get("send", {"calls": 0})["calls"] == sends
    # the activations held at once, measured: m for gpipe, min(p - s, m) for 1f1b
    assert [stats["held"] for _, _, stats in stages] == \
        peak_in_flight(pipeline_schedule(p, m, kind))


def test_run_errors():
    import numpy as np

    from transformer_lab import TINY, init_params
    from transformer_lab.parallel import run_ranks
    from transformer_lab.parallel.pipeline import pipeline_loss_and_grads, pp_shard
    params, tokens = init_params(TINY), np.zeros((2, 4), dtype=np.int64)

    def body(c, m, targets):
        return pipeline_loss_and_grads(pp_shard(params, TINY, c.rank, c.size), TINY, tokens,
                                       targets, c, m)
    with pytest.raises(ValueError, match="3 micro-batches are more than the batch's 2 rows"):
        run_ranks(2, body, 3, tokens)
    with pytest.raises(ValueError, match="micro_batches"):
        run_ranks(2, body, 0, tokens)
    with pytest.raises(ValueError, match="every target is -1"):
        run_ranks(2, body, 1, np.full((2, 4), -1))
    with pytest.raises(ValueError, match="3 stages are more than the 2 layers"):
        pp_shard(params, TINY, 0, 3)


def test_under_mpiexec():
    from mpi import mpi_run
    out = mpi_run(2, ["tests/parallel/mpi_pipeline_checks.py"], timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("pipeline ok") == 2, out.stdout
