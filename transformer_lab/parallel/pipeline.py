"""Pipeline parallel's schedules, as pure functions: which stage runs which micro-batch's
forward or backward when, the idle time this leaves (the bubble), and how many
micro-batches' activations each stage holds at once.

    stage_layers(n_layers, p)              the layers of each of p stages, as even as can be
    pipeline_schedule(p, m, kind)          each stage's ordered events ("F", i) and ("B", i)
                                           for micro-batches i = 0 .. m-1
        "gpipe"  all m forwards, then all m backwards (GPipe; "all forward, all backward")
        "1f1b"   stage s runs p - s - 1 forwards to fill the pipe, then alternates one
                 forward and one backward, then drains the backwards (PipeDream-flush)
    pipeline_timeline(schedule, fwd, bwd)  each event's (start, end), from unit times or
                                           given per-stage times: an event starts when its
                                           stage is free and its input is there
    bubble(timeline)                       the idle share of p stages x the whole time
    peak_in_flight(schedule)               forwards whose backward has not run yet, at most

With equal stages the bubble is (p - 1) / (m + p - 1) for both kinds (bubble_formula): the
pipe fills for p - 1 steps and drains for p - 1 steps whatever the order in between. The
kinds differ in memory: gpipe holds all m micro-batches' activations, 1f1b at most p - s
on stage s.
"""
from __future__ import annotations

from fractions import Fraction
from numbers import Real

from ..validate import check_int

KINDS = ("gpipe", "1f1b")


def stage_layers(n_layers, stages):
    """[(start, stop)] of the layers each stage holds: n_layers cut into `stages` runs whose
    lengths differ by at most one (the first stages take the extra ones)."""
    n_layers = check_int(n_layers, "pipeline: n_layers", low=1)
    stages = check_int(stages, "pipeline: stages", low=1)
    if stages > n_layers:
        raise ValueError(f"pipeline: {stages} stages are more than the {n_layers} layers; "
                         f"each stage needs at least one")
    sizes = [n_layers // stages + (1 if s < n_layers % stages else 0) for s in range(stages)]
    starts = [sum(sizes[:s]) for s in range(stages)]
    return [(a, a + n) for a, n in zip(starts, sizes)]


def pipeline_schedule(stages, micro_batches, kind="1f1b", *, n_layers=None):
    """Each stage's events in the order it runs them: [[("F", 0), ..., ("B", m - 1)], ...].
    n_layers, when given, is checked to have a layer for every stage."""
    stages = check_int(stages, "pipeline: stages", low=1)
    micro_batches = check_int(micro_batches, "pipeline: micro_batches", low=1)
    if kind not in KINDS:
        raise ValueError(f"pipeline: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if n_layers is not None:
        stage_layers(n_layers, stages)
    p, m = stages, micro_batches
    F = [("F", i) for i in range(m)]
    B = [("B", i) for i in range(m)]
    if kind == "gpipe":
        return [F + B for _ in range(p)]
    schedule = []
    for s in range(p):
        warm = min(p - s - 1, m)  # forwards before this stage's first backward can arrive
        steady = [e for i in range(m - warm) for e in (F[warm + i], B[i])]  # one F, one B
        schedule.append(F[:warm] + steady + B[m - warm:])
    return schedule


def _per_stage(times, p, name):
    values = list(times) if isinstance(times, (list, tuple)) else [times] * p
    if len(values) != p or not all(isinstance(t, Real) and not isinstance(t, bool) and t > 0
                                   for t in values):
        raise ValueError(f"pipeline_timeline: {name} must be a positive number or {p} of them "
                         f"(one per stage), got {times!r}")
    return values  # kept as given: unit (int) times keep the timeline exact


def pipeline_timeline(schedule, forward=1, backward=1):
    """For each stage, its events as (kind, micro_batch, start, end). forward and backward
    are the seconds (or units) of one micro-batch's pass on a stage: a number for every
    stage, or one per stage (measured). F(s, i) waits for F(s-1, i); B(s, i) waits for
    B(s+1, i); each stage runs its events one at a time, in the schedule's order."""
    p = len(schedule)
    cost = {"F": _per_stage(forward, p, "forward"), "B": _per_stage(backward, p, "backward")}
    done = {}  # (kind, stage, micro_batch) -> end time
    free, nxt = [0] * p, [0] * p
    timeline = [[] for _ in range(p)]
    while any(nxt[s] < len(schedule[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if nxt[s] == len(schedule[s]):
                continue
            kind, i = schedule[s][nxt[s]]
            # the input: the previous stage's forward, or the next stage's backward
            source = (kind, s - 1, i) if kind == "F" else (kind, s + 1, i)
            ready = 0 if (kind == "F" and s == 0) or (kind == "B" and s == p - 1) \
                else done.get(source)
            if ready is None:
                continue
            start = max(free[s], ready)
            free[s] = done[(kind, s, i)] = start + cost[kind][s]
            timeline[s].append((kind, i, start, free[s]))
            nxt[s] += 1
            progressed = True
        if not progressed:
            raise ValueError("pipeline_timeline: the schedule waits on itself (each stage's "
                             "next event needs one that has not run)")
    return timeline


def makespan(timeline):
    """The time from the first event's start to the last one's end."""
    return max(end for stage in timeline for _, _, _, end in stage)


def bubble(timeline):
    """The share of p stages x the whole time that the stages sit idle (summed as exact
    fractions of the times, so unit times give (p - 1) / (m + p - 1) to the last bit)."""
    busy = sum(Fraction(end) - Fraction(start) for stage in timeline for _, _, start, end in stage)
    return float(1 - busy / (len(timeline) * Fraction(makespan(timeline))))


def bubble_formula(stages, micro_batches):
    """(p - 1) / (m + p - 1): the bubble of equal stages."""
    return (stages - 1) / (micro_batches + stages - 1)


def peak_in_flight(schedule):
    """Per stage, the most micro-batches whose forward has run and whose backward has not:
    the activations the stage must keep at once."""
    peaks = []
    for events in schedule:
        held = peak = 0
        for kind, _ in events:
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        peaks.append(peak)
    return peaks
