"""Pipeline parallel: its schedules, as pure functions (which stage runs which micro-batch's
forward or backward when, the idle time this leaves, the bubble, and how many
micro-batches' activations each stage holds at once), and the schedule run for real.

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
    pp_shard, pipeline_loss_and_grads      the schedule run for real: a stage per rank,
                                           activations and grads sent between them

With equal stages the bubble is (p - 1) / (m + p - 1) for both kinds (bubble_formula): the
pipe fills for p - 1 steps and drains for p - 1 steps whatever the order in between. The
kinds differ in memory: gpipe holds all m micro-batches' activations, 1f1b at most p - s
on stage s.

pipeline_loss_and_grads runs a stage on each rank of comm with isend and recv. The sends
must not wait for their receivers: in 1f1b's steady state a forward's send to the next
stage faces that stage's backward sending to this one, and two blocking sends of large
messages would wait for each other for ever. With only the receives waiting, a stage waits
on an event that comes earlier in the timeline, so it always ends.
"""
from __future__ import annotations

from fractions import Fraction
from numbers import Real

import numpy as np

from ..acts import ActivationRecord
from ..model import block, check_targets, check_tokens, embed, norm
from ..ops import IGNORE
from ..params import map_params, named_params
from ..positions import rope_angles
from ..training.backward import (block_backward, embed_backward, head_loss_and_backward,
                                 norm_backward)
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


# ---------------------------------------------------------------- running it, stage per rank

def pp_shard(params, cfg, rank, size):
    """Stage `rank`'s params of a pipeline of `size` stages: its blocks (stage_layers), the
    embedding on the first stage, the final norm and the head on the last (the embedding
    there too for a tied head)."""
    a, b = stage_layers(cfg.n_layers, size)[rank]
    shard = {"blocks": params["blocks"][a:b]}
    if rank == 0:
        shard.update({k: params[k] for k in ("tok_emb", "pos_emb") if k in params})
    if rank == size - 1:
        shard.update(final_norm=params["final_norm"], lm_head=params["lm_head"])
        if cfg.tie_embeddings:
            shard["tok_emb"] = params["tok_emb"]
    return shard


def micro_batch_rows(tokens, targets, cfg, micro_batches, who, n_targets=None):
    """The checked batch and its micro-batches: (tokens, targets, each micro-batch's rows,
    n_targets), n_targets being the count the loss is a mean over (by default this
    batch's supervised positions)."""
    tokens = check_tokens(tokens, cfg)
    targets = check_targets(targets, tokens, cfg)
    m = check_int(micro_batches, f"{who}: micro_batches", low=1)
    if m > tokens.shape[0]:
        raise ValueError(f"{who}: {m} micro-batches are more than the batch's "
                         f"{tokens.shape[0]} rows")
    if n_targets is None:
        n_targets = int(np.count_nonzero(targets != IGNORE))
    if n_targets == 0:
        raise ValueError(f"every target is {IGNORE} (ignored): there is no position to "
                         f"average the loss over")
    return tokens, targets, np.array_split(np.arange(tokens.shape[0]), m), n_targets


def pipeline_loss_and_grads(shard, cfg, tokens, targets, comm, micro_batches, kind="1f1b",
                            held_stats=None):
    """(loss, grads) of the whole batch, grads in this stage's layout (pp_shard), equal to
    loss_and_grads' on one process: the batch cut into micro-batches along its rows, each
    stage running its events of pipeline_schedule, an F receiving the previous stage's
    activations [b, T, d] (the first stage embeds) and sending its own on, a B receiving
    the next stage's gradient (the last stage starts from the loss) and sending its own
    back. Every stage returns the loss. held_stats, a dict, gets "peak": the most
    micro-batches whose activations this stage held at once, measured."""
    s, p = comm.rank, comm.size
    tokens, targets, rows, n_targets = micro_batch_rows(tokens, targets, cfg, micro_batches,
                                                        "pipeline")
    a, _ = stage_layers(cfg.n_layers, p)[s]
    T = tokens.shape[1]
    rope = rope_angles(np.arange(T), cfg.rope_dim, cfg.rope_base) if cfg.pos == "rope" else None
    blocks = list(enumerate(shard["blocks"], start=a))  # (layer, its params)
    held, loss, grads, sent = {}, 0.0, {}, []  # held: micro-batch -> what its backward reads

    def forward(i):
        x = embed(shard, cfg, tokens[rows[i]]) if s == 0 else comm.recv(s - 1)  # [b, T, d]
        acts = ActivationRecord()
        for layer, bp in blocks:
            x = block(x, bp, cfg, rope=rope, layer=layer, acts=acts)
        if s < p - 1:
            sent.append(comm.isend(x, s + 1))
            held[i] = (acts, None, None)
            return 0.0
        xn = norm(x, shard["final_norm"], cfg)  # the last stage: the loss, and its gradient
        part, dxn, head = head_loss_and_backward(xn, shard, cfg, targets[rows[i]], n_targets)
        dx, g = norm_backward(dxn, x, shard["final_norm"], cfg)
        held[i] = (acts, dx, dict(head, final_norm=g))
        return part

    def backward(i):
        acts, dx, g = held.pop(i)  # this micro-batch's activations are let go here
        g = {} if g is None else g
        if s < p - 1:
            dx = comm.recv(s + 1)
        g["blocks"] = [None] * len(blocks)
        for j, (layer, bp) in reversed(list(enumerate(blocks))):
            dx, g["blocks"][j] = block_backward(dx, bp, cfg, acts, layer, rope=rope)
        if s == 0:
            g.update(embed_backward(dx, tokens[rows[i]], cfg, dtok=g.get("tok_emb")))
        else:
            sent.append(comm.isend(dx, s - 1))
        return g

    peak = 0
    for event, i in pipeline_schedule(p, len(rows), kind)[s]:
        if event == "F":
            loss += forward(i)
            peak = max(peak, len(held))
        else:
            for name, g in named_params(backward(i)):  # each micro-batch: its share of the mean
                grads[name] = grads[name] + g if name in grads else g
    for request in sent:
        request.wait()
    if held_stats is not None:
        held_stats["peak"] = peak
    if cfg.tie_embeddings and p > 1 and s in (0, p - 1):  # the table's two parts, summed
        other = p - 1 - s
        grads["tok_emb"] = grads["tok_emb"] + comm.sendrecv(grads["tok_emb"], other, other)
    loss = float(comm.broadcast(np.array([loss]), root=p - 1)[0])  # the last stage's
    return loss, map_params(lambda name, _: grads[name], shard, names=True)  # shard's layout
