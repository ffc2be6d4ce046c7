#!/usr/bin/env python3
"""Demo 23 — model parallel: tensor, sequence, pipeline and context parallel, each equal to
one process, and what each costs.

Tensor parallel (Megatron-LM) cuts every block's matrices over N ranks: Q/K/V and the MLP's
up-projections by columns, wo and w_down by rows, so a block needs one all-reduce after
its attention and one after its MLP, each of B*T*d numbers, and the vocabulary-parallel
embedding one more. Sequence parallel replaces each all-reduce by a reduce-scatter and an
all-gather (the same bytes) and keeps the stream between them cut along the sequence. A
pipeline gives each rank a run of layers and sends activations on and grads back; its
schedule decides the idle time (the bubble) and how many micro-batches' activations a stage
holds. Ring attention passes K/V shards around a ring so no rank holds the whole sequence.
Serving with tensor parallel runs the engine on rank 0, broadcasts each step's batch, and
every rank runs tp_forward over its shard against a KV pool of its own K/V groups.

The lines it teaches: transformer_lab/parallel/tensor.py's tp_block (the two g's, the
all-reduces) and _f_and_g (all-reduce against reduce-scatter + all-gather), tp_saved_shapes;
parallel/pipeline.py's pipeline_schedule (gpipe: all F then all B; 1f1b: p - s - 1 warm-up
forwards, then one F one B), pipeline_timeline, bubble, peak_in_flight and
pipeline_loss_and_grads; parallel/context.py's ring_attention (return_work) and
layout_chunks (zigzag: rank r holds chunks r and 2N - 1 - r); serve/tp_runner.py's
TPModelRunner.run (broadcast the batch, then tp_forward with the StepCache), serve_worker,
and tensor.py's _plan with uneven=True (9 heads over 2 ranks: 5 and 4).

Every rank here is a thread of this one process (run_ranks), with the communicator's
interface that MPI ranks have: no mpiexec is needed. --quick uses smaller sequences and
fewer micro-batch counts; the full run the larger ones.
"""
from __future__ import annotations

import sys

import numpy as np

import _common  # (also puts the repo root on sys.path when run from a checkout)
from console import print_observations, print_section, print_table, print_text
from transformer_lab import TINY, TINY_GPT2, forward, init_params
from transformer_lab.attention import attention_reference
from transformer_lab.params import named_params
from transformer_lab.parallel import run_ranks
from transformer_lab.parallel.context import (ring_attention, ring_work, shard_sequence,
                                              unshard_sequence)
from transformer_lab.parallel.pipeline import (KINDS, bubble, bubble_formula, peak_in_flight,
                                               pipeline_loss_and_grads, pipeline_schedule,
                                               pipeline_timeline, pp_shard)
from transformer_lab.parallel.tensor import tp_forward, tp_saved_shapes, tp_shard
from transformer_lab.serve import LLM, SamplingParams
from transformer_lab.serve.tp_runner import head_split
from transformer_lab.training.backward import loss_and_grads

NUMBER = 23
SEED = 23
TITLE = {"zh": "模型并行：张量、流水线、上下文", "en": "Model parallel: tensor, pipeline, context"}
TP_CONFIGS = {"TINY (GQA)": TINY, "TINY_GPT2": TINY_GPT2}
TP_SIZES = (2, 4)
TP_BATCH = (4, 8)  # B, T: N = 2 and 4 divide both (equal parts on every rank)
PP_STAGES, PP_MICRO = 4, 8  # the timeline's pipeline
BUBBLE_M, QUICK_BUBBLE_M = (1, 2, 4, 8, 16, 32, 64), (1, 2, 4, 8, 16)
PP_CFG = TINY.replace(n_layers=4)  # a layer per stage
PP_BATCH = (8, 6)
RING_N = 4
RING_T, QUICK_RING_T = 128, 32  # 2N zigzag chunks of 16 (or 4) positions
RING_HEADS = (4, 2, 8)  # H query heads, G K/V groups, head dim
# Serving: SmolLM2's heads in small (9 query heads, 3 K/V groups), which 2 ranks split 5 + 4.
SERVE_CFG = TINY.replace(d_model=36, n_heads=9, n_kv_heads=3, d_ff=48)
SERVE_N = 2
SERVE_LENGTHS, SERVE_NEW, QUICK_SERVE_NEW = (3, 7, 12, 20), 16, 8


# ---------------------------------------------------------------- tensor and sequence parallel

def tp_case(cfg, n):
    """On n ranks: the largest logits difference against forward (float64), each rank's
    collectives (comm.stats), plain and sequence parallel; the saved activations per block
    of rank 0, one process, plain TP and sequence parallel."""
    params = init_params(cfg, seed=SEED)
    B, T = TP_BATCH
    tokens = np.random.default_rng(SEED).integers(0, cfg.vocab, (B, T))
    ref = forward(params, cfg, tokens)

    def body(c, sp):
        shard = tp_shard(params, cfg, c.rank, c.size)
        logits = tp_forward(shard, cfg, tokens, c, sequence_parallel=sp)
        stats = {k: dict(v) for k, v in c.stats.items()}
        return float(np.abs(logits - ref).max()), stats, tp_saved_shapes(shard, cfg, tokens, c, sp)
    plain, sp = run_ranks(n, body, False), run_ranks(n, body, True)
    one = run_ranks(1, body, False)[0]
    numbers = lambda shapes: sum(int(np.prod(s)) for s in shapes[0].values())  # noqa: E731
    return {"n": n, "layers": cfg.n_layers, "d": cfg.d_model, "B": B, "T": T,
            "diff": max(r[0] for r in plain), "sp_diff": max(r[0] for r in sp),
            "stats": [r[1] for r in plain], "sp_stats": [r[1] for r in sp],
            "saved_one": numbers(one[2]), "saved_tp": numbers(plain[0][2]),
            "saved_sp": numbers(sp[0][2]),
            "stream_tp": list(plain[0][2][0]["resid_pre"]),
            "stream_sp": list(sp[0][2][0]["resid_pre"])}


# ---------------------------------------------------------------- pipeline

def timelines(p=PP_STAGES, m=PP_MICRO):
    """Each kind's unit-time timeline of p stages and m micro-batches, and its peaks."""
    out = {}
    for kind in KINDS:
        schedule = pipeline_schedule(p, m, kind)
        out[kind] = {"timeline": [[list(e) for e in stage] for stage in
                                  pipeline_timeline(schedule)],
                     "peaks": peak_in_flight(schedule)}
    return out


def bubbles(ms, p=PP_STAGES):
    return [{"m": m, "formula": bubble_formula(p, m),
             **{kind: bubble(pipeline_timeline(pipeline_schedule(p, m, kind)))
                for kind in KINDS}} for m in ms]


def pipeline_run(kind, p=PP_STAGES, m=PP_MICRO):
    """The schedule run for real on p ranks: its loss and grads against one process's, and
    the activations each stage held at once, measured."""
    cfg = PP_CFG
    params = init_params(cfg, seed=SEED)
    rng = np.random.default_rng(SEED)
    tokens, targets = rng.integers(0, cfg.vocab, PP_BATCH), rng.integers(0, cfg.vocab, PP_BATCH)
    loss, grads = loss_and_grads(params, cfg, tokens, targets)

    def body(c):
        held = {}
        got = pipeline_loss_and_grads(pp_shard(params, cfg, c.rank, c.size), cfg, tokens,
                                      targets, c, m, kind, held)
        return got, held["peak"]
    stages = run_ranks(p, body)
    grad_diff = 0.0
    for s, ((_, stage_grads), _) in enumerate(stages):
        want = dict(named_params(pp_shard(grads, cfg, s, p)))
        grad_diff = max([grad_diff] + [float(np.abs(g - want[k]).max())
                                       for k, g in named_params(stage_grads)])
    return {"kind": kind, "p": p, "m": m, "loss": loss, "grad_diff": grad_diff,
            "loss_diff": max(abs(st_loss - loss) for (st_loss, _), _ in stages),
            "held": [peak for _, peak in stages],
            "schedule_peaks": peak_in_flight(pipeline_schedule(p, m, kind))}


# ---------------------------------------------------------------- ring attention

def ring_case(T, layout, n=RING_N):
    H, G, D = RING_HEADS
    rng = np.random.default_rng(SEED)
    q, k, v = (rng.standard_normal((1, T, h, D)) for h in (H, G, G))

    def body(c):
        mine = [shard_sequence(a, c.rank, c.size, layout) for a in (q, k, v)]
        return ring_attention(*mine, c, layout=layout, return_work=True)
    results = run_ranks(n, body)
    out = unshard_sequence([o for o, _ in results], layout)
    work = [w for _, w in results]
    return {"layout": layout, "T": T, "n": n,
            "diff": float(np.abs(out - attention_reference(q, k, v, causal=True)).max()),
            "work": work, "formula": ring_work(T, n, layout)}


# ---------------------------------------------------------------- serving

def serving_case(new, n=SERVE_N):
    """The engine's greedy tokens at tensor_parallel_size=1 and n (in-process ranks), and
    what tensor parallel counted: rank 0's all-reduce calls and bytes per token, the K/V
    heads of rank 0's pool."""
    cfg, params = SERVE_CFG, init_params(SERVE_CFG, seed=SEED)
    rng = np.random.default_rng(SEED)
    prompts = [[int(t) for t in rng.integers(0, cfg.vocab, length)] for length in SERVE_LENGTHS]
    greedy = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    options = dict(num_blocks=32, block_size=4, max_num_batched_tokens=16)  # chunked prefills

    def tokens(llm):
        return [o.token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    one = tokens(LLM.from_params(cfg, params, **options))
    with LLM.from_params(cfg, params, tensor_parallel_size=n,
                         distributed_executor_backend="threads", **options) as tp:
        many = tokens(tp)
        stats, pool_heads = tp.stats(), tp.pool.k[0].shape[2]
    return {"n": n, "heads": cfg.n_heads, "groups": cfg.n_kv_heads, "layers": cfg.n_layers,
            "d": cfg.d_model, "split": head_split(cfg, n), "one": one, "tp": many,
            "calls": stats["tp_all_reduce_calls"], "steps": stats["steps"],
            "bytes_per_token": stats["tp_all_reduce_bytes_per_token"],
            "pool_heads": pool_heads}


def compute(quick=False):
    T = QUICK_RING_T if quick else RING_T
    return {"quick": quick,
            "tp": [dict(tp_case(cfg, n), config=name) for name, cfg in TP_CONFIGS.items()
                   for n in TP_SIZES],
            "timelines": timelines(), "p": PP_STAGES, "m": PP_MICRO,
            "bubbles": bubbles(QUICK_BUBBLE_M if quick else BUBBLE_M),
            "runs": [pipeline_run(kind) for kind in KINDS],
            "ring": [ring_case(T, layout) for layout in ("contiguous", "zigzag")],
            "serve": serving_case(QUICK_SERVE_NEW if quick else SERVE_NEW)}


# ---------------------------------------------------------------- what the results say

def _tp_row(r):
    """The counts against the formula: 2 all-reduces per layer and the embedding's, each of
    B*T*d numbers, 2(N-1)/N of them sent per rank (float64)."""
    n, S = r["n"], r["B"] * r["T"] * r["d"] * 8
    calls = 2 * r["layers"] + 1
    want = calls * 2 * (n - 1) * S // n
    got = [s["all_reduce"] for s in r["stats"]]
    sp_bytes = [s["reduce_scatter"]["bytes"] + s["all_gather"]["bytes"] for s in r["sp_stats"]]
    plain_bytes = [s["all_reduce"]["bytes"] + s["all_gather"]["bytes"] for s in r["stats"]]
    return dict(r, calls=got[0]["calls"], calls_want=calls, bytes=got[0]["bytes"],
                bytes_want=want,
                counted=all(g["calls"] == calls and g["bytes"] == want for g in got),
                sp_same_bytes=sp_bytes == plain_bytes,
                sp_calls=r["sp_stats"][0]["reduce_scatter"]["calls"])


def findings(result):
    tp = [_tp_row(r) for r in result["tp"]]
    runs = result["runs"]
    ring = {r["layout"]: r for r in result["ring"]}
    spread = {k: max(r["work"]) / min(r["work"]) for k, r in ring.items()}
    peaks = {k: v["peaks"] for k, v in result["timelines"].items()}
    serve = result["serve"]
    # at 2 ranks rank 0 sends each all-reduce whole: 2 per block and the embedding's, d
    # float64 numbers a token each
    serve_want = (2 * serve["layers"] + 1) * serve["d"] * 8
    return {"serve_same": serve["one"] == serve["tp"],
            "serve_tokens": sum(len(t) for t in serve["one"]),
            "serve_bytes_want": serve_want,
            "serve_counted": serve["bytes_per_token"] == serve_want
            and serve["calls"] == (2 * serve["layers"] + 1) * serve["steps"],
            "serve_pool_heads": [g["g1"] - g["g0"] for g in serve["split"]],
            "tp": tp, "tp_worst": max(max(r["diff"], r["sp_diff"]) for r in tp),
            "tp_counted": all(r["counted"] for r in tp),
            "sp_same_bytes": all(r["sp_same_bytes"] for r in tp),
            "sp_shrink": [r["saved_one"] / r["saved_sp"] for r in tp],
            "sp_is_n": all(r["saved_one"] == r["n"] * r["saved_sp"] for r in tp),
            "bubble_worst": max(abs(b[k] - b["formula"]) for b in result["bubbles"]
                                for k in KINDS),
            "peaks": peaks,
            "run_worst": max(max(r["grad_diff"], r["loss_diff"]) for r in runs),
            "held_is_schedule": all(r["held"] == r["schedule_peaks"] for r in runs),
            "ring_worst": max(r["diff"] for r in ring.values()),
            "ring_formula": all(r["work"] == r["formula"] for r in ring.values()),
            "spread": spread}


def grid(timeline, width=3):
    """A stage x time table of a unit-time timeline: "F3" a forward of micro-batch 3, "B3"
    its backward, "." idle; one row per stage, `width` characters per time unit."""
    end = max(e[3] for stage in timeline for e in stage)
    rows = []
    for stage in timeline:
        cells = ["." for _ in range(end)]
        for kind, i, start, stop in stage:
            for t in range(start, stop):
                cells[t] = f"{kind}{i}"
        rows.append("".join(c.ljust(width) for c in cells).rstrip())
    return rows


def _table(headers, rows, caption):
    """A table, its caption as a paragraph under it: the width of the page, not the table's."""
    print_table(headers, rows)
    print_text(caption, style="dim")


def _ratio(x):
    return f"{x:.2f}"


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    c, z = f["spread"]["contiguous"], f["spread"]["zigzag"]
    n = result["ring"][0]["n"]
    first = f["tp"][0]
    return [
        t["obs_tp"].format(worst=f"{f['tp_worst']:.1e}",
                           verdict=t["counted" if f["tp_counted"] else "not_counted"]),
        t["obs_sp"].format(same=t["same" if f["sp_same_bytes"] else "not_same"],
                           shrink=t["is_n" if f["sp_is_n"] else "not_n"],
                           tp=first["stream_tp"], sp=first["stream_sp"]),
        t["obs_bubble"].format(p=result["p"], worst=t["exactly"] if f["bubble_worst"] == 0
                               else t["within"].format(d=f"{f['bubble_worst']:.0e}")),
        t["obs_peaks"].format(m=result["m"], g=f["peaks"]["gpipe"], o=f["peaks"]["1f1b"]),
        t["obs_run"].format(worst=f"{f['run_worst']:.1e}",
                            held=t["held_same" if f["held_is_schedule"] else "held_differs"]),
        t["obs_ring"].format(worst=f"{f['ring_worst']:.1e}", c=_ratio(c), z=_ratio(z), n=n,
                             bound=2 * n - 1),
        t["obs_serve"].format(
            n=result["serve"]["n"], h=result["serve"]["heads"], g=result["serve"]["groups"],
            split=" + ".join(str(s["h1"] - s["h0"]) for s in result["serve"]["split"]),
            kv=t["kv_join"].join(str(k) for k in f["serve_pool_heads"]),
            tokens=f["serve_tokens"], same=t["serve_same" if f["serve_same"] else "serve_differ"],
            bytes=f"{result['serve']['bytes_per_token']:,.0f}",
            counted=t["serve_counted" if f["serve_counted"] else "serve_not_counted"]),
    ]


def render(result, lang):
    t = TEXT[lang]
    f = findings(result)
    print_text(t["backend"])

    print_section(t["tp_title"])
    _table([t["config"], "N", t["max_diff"], t["sp_diff"], t["calls"], t["bytes"],
                 t["formula"]],
                [[r["config"], r["n"], f"{r['diff']:.1e}", f"{r['sp_diff']:.1e}",
                  f"{r['calls']}/{r['calls_want']}", f"{r['bytes']:,}", f"{r['bytes_want']:,}"]
                 for r in f["tp"]],
                caption=t["tp_caption"].format(B=TP_BATCH[0], T=TP_BATCH[1]))
    _table([t["config"], "N", t["sp_bytes"], t["saved_one"], t["saved_tp"], t["saved_sp"]],
                [[r["config"], r["n"], t["yes" if r["sp_same_bytes"] else "no"],
                  f"{r['saved_one']:,}", f"{r['saved_tp']:,}", f"{r['saved_sp']:,}"]
                 for r in f["tp"]], caption=t["sp_caption"])

    p, m = result["p"], result["m"]
    for kind in KINDS:
        print_section(t["timeline_title"].format(kind=kind, p=p, m=m))
        rows = grid(result["timelines"][kind]["timeline"])
        _table([t["stage"], t["time"]], [[s, row] for s, row in enumerate(rows)],
                    caption=t["timeline_caption"])

    print_section(t["bubble_title"].format(p=p))
    _table(["m", "gpipe", "1f1b", "(p-1)/(m+p-1)"],
                [[b["m"], f"{b['gpipe']:.4f}", f"{b['1f1b']:.4f}", f"{b['formula']:.4f}"]
                 for b in result["bubbles"]], caption=t["bubble_caption"])

    print_section(t["peaks_title"])
    runs = {r["kind"]: r for r in result["runs"]}
    _table([t["stage"], f"gpipe (m = {m})", f"1f1b (m = {m})",
                 f"gpipe {t['held']}", f"1f1b {t['held']}"],
                [[s, f["peaks"]["gpipe"][s], f["peaks"]["1f1b"][s], runs["gpipe"]["held"][s],
                  runs["1f1b"]["held"][s]] for s in range(p)],
                caption=t["peaks_caption"].format(m=runs["gpipe"]["m"],
                                                  B=PP_BATCH[0], T=PP_BATCH[1]))
    _table([t["kind"], t["loss"], t["loss_diff"], t["grad_diff"]],
                [[r["kind"], f"{r['loss']:.6f}", f"{r['loss_diff']:.1e}",
                  f"{r['grad_diff']:.1e}"] for r in result["runs"]],
                caption=t["run_caption"].format(layers=PP_CFG.n_layers, p=p))

    print_section(t["ring_title"].format(n=result["ring"][0]["n"], T=result["ring"][0]["T"]))
    n = result["ring"][0]["n"]
    _table([t["layout"], t["max_diff"], *[f"rank {r}" for r in range(n)], "max/min"],
                [[r["layout"], f"{r['diff']:.1e}", *r["work"],
                  _ratio(max(r["work"]) / min(r["work"]))] for r in result["ring"]],
                caption=t["ring_caption"])

    serve = result["serve"]
    print_section(t["serve_title"].format(n=serve["n"]))
    _table(["rank", t["q_heads"], t["kv_groups"]],
           [[r, f"{s['h0']}-{s['h1'] - 1}", f"{s['g0']}-{s['g1'] - 1}"]
            for r, s in enumerate(serve["split"])],
           caption=t["split_caption"].format(h=serve["heads"], g=serve["groups"]))
    _table([t["request"], t["tokens_one"], f"TP = {serve['n']}"],
           [[i, " ".join(map(str, one)), t["yes" if one == many else "no"]]
            for i, (one, many) in enumerate(zip(serve["one"], serve["tp"]))],
           caption=t["serve_caption"].format(layers=serve["layers"], d=serve["d"]))
    print_observations(observations(result, lang))


def figures(result, lang):
    import _figures
    t = TEXT[lang]
    fig, axes = _figures.new_figure(ncols=2, size=(11.0, 4.5))
    for ax, kind in zip(axes, KINDS):
        timeline = result["timelines"][kind]["timeline"]
        for s, stage in enumerate(timeline):
            for kind_, i, start, stop in stage:
                colour = "tab:blue" if kind_ == "F" else "tab:orange"
                ax.broken_barh([(start, stop - start)], (s - 0.4, 0.8), color=colour,
                               edgecolor="white", gid=f"{kind}-{s}-{kind_}{i}")
                ax.text((start + stop) / 2, s, str(i), ha="center", va="center", fontsize=8,
                        color="white")
        ax.set_yticks(range(len(timeline)), [f"{t['stage']} {s}" for s in range(len(timeline))])
        ax.invert_yaxis()
        ax.set_xlabel(t["time"])
        ax.set_title(f"{kind}: {t['figure_bubble']} {bubble_from(timeline):.0%}", fontsize=11)
        ax.grid(False)
    fig.suptitle(t["figure_title"].format(p=result["p"], m=result["m"]), fontsize=12)

    curve, ax = _figures.new_figure()
    ms = [b["m"] for b in result["bubbles"]]
    fine = np.geomspace(min(ms), max(ms), 200)
    ax.plot(fine, [bubble_formula(result["p"], m) for m in fine], color="0.5",
            label="(p-1)/(m+p-1)", gid="formula")
    for kind, mark in zip(KINDS, ("o", "x")):
        ax.plot(ms, [b[kind] for b in result["bubbles"]], mark, markersize=9,
                label=f"{kind}, {t['figure_measured']}", gid=f"measured-{kind}")
    ax.set_xscale("log", base=2)
    _figures.set_ticks(ax, ms)
    ax.set_xlabel(t["figure_m"])
    ax.set_ylabel(t["figure_bubble"])
    ax.set_title(t["figure_bubble_title"].format(p=result["p"]), fontsize=11)
    ax.legend()
    return {"timeline": fig, "bubble": curve}


def bubble_from(timeline):
    return bubble([[tuple(e) for e in stage] for stage in timeline])


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "backend": "所有 rank 都是本进程里的线程（run_ranks），通信接口与 MPI 的 rank 相同；"
                   "不需要 mpiexec。",
        "tp_title": "张量并行等于单进程，集合通信按公式计数",
        "config": "配置", "max_diff": "最大差", "sp_diff": "序列并行差", "calls": "all-reduce 次数",
        "bytes": "每 rank 发送字节", "formula": "公式",
        "tp_caption": "float64，B = {B}，T = {T}：logits 与 forward 的最大差。次数/公式为 "
                      "2·层数 + 1（每层两次，加上词表并行嵌入的一次）；字节公式为次数 × "
                      "2(N-1)/N × B·T·d × 8（comm.stats）。最后还有一次 all_gather 把 logits "
                      "收齐以便比较，不计入。",
        "sp_bytes": "字节相同", "saved_one": "单进程保存", "saved_tp": "张量并行保存",
        "saved_sp": "序列并行保存", "yes": "是", "no": "否",
        "sp_caption": "字节相同：序列并行的 reduce-scatter + all-gather 字节等于普通张量并行的 "
                      "all-reduce + all-gather 字节（每个 rank）。保存：rank 0 每个块为反向保存的"
                      "激活数个数（tp_saved_shapes，第一块）。",
        "timeline_title": "流水线时间线：{kind}，p = {p} 个阶段，m = {m} 个微批",
        "stage": "阶段", "time": "时间 →",
        "timeline_caption": "每格一个时间单位（前向、反向各 1）：F3 为微批 3 的前向，B3 为它的反向，"
                            ". 为空闲。由 pipeline_timeline 从 pipeline_schedule 算出。",
        "bubble_title": "气泡与微批数 m（p = {p}）",
        "bubble_caption": "实测：时间线上空闲的占比（bubble）；公式：(p-1)/(m+p-1)。",
        "peaks_title": "每个阶段同时持有的微批激活",
        "held": "实测",
        "peaks_caption": "前两列：peak_in_flight(schedule)，时间线的 m；实测：真实流水线（m = {m}，"
                         "batch {B}×{T}）中每个阶段同时持有激活的微批数（held_stats）。",
        "kind": "调度", "loss": "loss", "loss_diff": "loss 差", "grad_diff": "梯度最大差",
        "run_caption": "真实运行：{layers} 层 Llama 小模型切成 {p} 个阶段，每个阶段一个 rank，"
                       "激活向后发、梯度向前发；与单进程 loss_and_grads 比较（float64）。",
        "ring_title": "环形注意力：N = {n} 个 rank，T = {T}",
        "layout": "布局",
        "ring_caption": "最大差：拼回的输出与 attention_reference（因果）的最大差，float64。"
                        "rank 列：每个 rank 计算的 (查询, 键) 对数（return_work，每行每头）。",
        "counted": "正好等于公式", "not_counted": "与公式不符",
        "obs_tp": "张量并行（N = 2、4，Llama GQA 与 GPT-2）的 logits 与单进程相差至多 {worst}"
                  "（float64）；all-reduce 的次数与字节{verdict}：每层 2 次加嵌入 1 次，每次 "
                  "B·T·d 个数。",
        "same": "字节完全相同", "not_same": "字节并不相同",
        "obs_sp": "序列并行{same}，而每个块为反向保存的激活{shrink}；普通张量并行把残差流"
                  "和范数输出整份保存（{tp}），序列并行只存 {sp}。",
        "is_n": "正好是单进程的 1/N", "not_n": "并不是单进程的 1/N",
        "obs_bubble": "p = {p} 时，gpipe 与 1f1b 在每个 m 下的实测气泡都{worst} (p-1)/(m+p-1)："
                      "两种调度的气泡相同，只有增大 m 才能缩小它。",
        "exactly": "正好等于", "within": "在 {d} 以内等于",
        "obs_peaks": "m = {m} 时，gpipe 每个阶段要同时持有 {g} 个微批的激活，1f1b 只要 {o}"
                     "（第 s 阶段 min(p-s, m)）：差别在内存，不在气泡。",
        "held_same": "每个阶段实测持有的微批数正好等于调度给出的峰值",
        "held_differs": "实测持有的微批数与调度的峰值不同",
        "obs_run": "真实的流水线运行（gpipe 与 1f1b）的 loss 与梯度与单进程相差至多 {worst}；"
                   "{held}。",
        "obs_ring": "环形注意力两种布局的输出与参考实现相差至多 {worst}。因果掩码下 contiguous "
                    "布局各 rank 的工作量 max/min = {c}（接近 2N-1 = {bound}），zigzag 为 {z}："
                    "每个 rank 一早一晚两块，工作量相等。",
        "serve_title": "张量并行推理：引擎在 rank 0，tensor_parallel_size = {n}",
        "q_heads": "查询头", "kv_groups": "K/V 组",
        "split_caption": "{h} 个查询头、{g} 个 K/V 组（SmolLM2 的头数，模型缩小）：2 不能整除 "
                         "{h}，头按 np.array_split 切分；每个 rank 的 KV 池只存它的头读的组，"
                         "两个 rank 都读的组两边都存、都算。",
        "request": "请求", "tokens_one": "TP = 1 的贪心 token",
        "serve_caption": "float64、{layers} 层、d = {d} 的随机模型，引擎（调度、采样）只在 rank 0："
                         "每步广播批次，各 rank 用自己的分片和 KV 池跑 tp_forward。最后一列："
                         "与 TP = 1 的 token 是否相同。",
        "serve_same": "完全相同", "serve_differ": "并不相同", "kv_join": "、",
        "serve_counted": "正好是 (2·层数 + 1) × d × 8",
        "serve_not_counted": "与 (2·层数 + 1) × d × 8 不符",
        "obs_serve": "张量并行推理（N = {n}，{h} 个查询头按 {split} 切分，各 rank 的 KV 池存 "
                     "{kv} 个组，共 {g} 组）贪心生成的 {tokens} 个 token 与单 rank {same}；"
                     "rank 0 每个 token all-reduce {bytes} 字节，{counted}。",
        "figure_bubble": "气泡", "figure_measured": "实测", "figure_m": "微批数 m",
        "figure_bubble_title": "气泡与 m，p = {p}：实测（时间线）与公式",
        "figure_title": "流水线时间线，p = {p}，m = {m}（蓝：前向，橙：反向，数字为微批）",
    },
    "en": {
        "backend": "Every rank is a thread of this one process (run_ranks), with the same "
                   "communicator interface as MPI ranks: no mpiexec is needed.",
        "tp_title": "Tensor parallel equals one process; its collectives counted",
        "config": "config", "max_diff": "max |Δ|", "sp_diff": "SP max |Δ|",
        "calls": "all-reduces", "bytes": "bytes/rank", "formula": "formula",
        "tp_caption": "float64, B = {B}, T = {T}: the largest difference of the logits from "
                      "forward's. Calls over the formula's 2·layers + 1 (two per layer and "
                      "the vocabulary-parallel embedding's); bytes against calls × 2(N-1)/N × "
                      "B·T·d × 8 (comm.stats). One all_gather of the logits, for the "
                      "comparison, is not counted.",
        "sp_bytes": "same bytes", "saved_one": "saved, 1 process", "saved_tp": "saved, TP",
        "saved_sp": "saved, SP", "yes": "yes", "no": "no",
        "sp_caption": "Same bytes: sequence parallel's reduce-scatter + all-gather bytes equal "
                      "plain TP's all-reduce + all-gather bytes, on every rank. Saved: the "
                      "numbers rank 0 keeps for the backward of one block (tp_saved_shapes, "
                      "the first block).",
        "timeline_title": "Pipeline timeline: {kind}, p = {p} stages, m = {m} micro-batches",
        "stage": "stage", "time": "time →",
        "timeline_caption": "One time unit per cell (a forward or a backward takes 1): F3 is "
                            "micro-batch 3's forward, B3 its backward, . idle; from "
                            "pipeline_timeline over pipeline_schedule.",
        "bubble_title": "The bubble against the micro-batches m (p = {p})",
        "bubble_caption": "Measured: the idle share of the timeline (bubble); formula: "
                          "(p-1)/(m+p-1).",
        "peaks_title": "Micro-batches whose activations a stage holds at once",
        "held": "measured",
        "peaks_caption": "The first two: peak_in_flight(schedule) at the timeline's m; "
                         "measured: the most micro-batches a stage of the real pipeline (m = "
                         "{m}, batch {B}×{T}) held at once (held_stats).",
        "kind": "schedule", "loss": "loss", "loss_diff": "|Δ loss|", "grad_diff": "max |Δ grad|",
        "run_caption": "The real run: a {layers}-layer Llama-style model cut into {p} stages, a "
                       "rank each, activations sent on and grads back; against loss_and_grads "
                       "in one process (float64).",
        "ring_title": "Ring attention: N = {n} ranks, T = {T}",
        "layout": "layout",
        "ring_caption": "max |Δ|: the output put back together against attention_reference "
                        "(causal), float64. Rank columns: the (query, key) pairs each rank "
                        "scored (return_work, per batch row and head).",
        "counted": "are exactly the formula's", "not_counted": "differ from the formula",
        "obs_tp": "Tensor parallel (N = 2 and 4, Llama GQA and GPT-2) gives one process's "
                  "logits to within {worst} (float64); its all-reduces, calls and bytes, "
                  "{verdict}: two per layer and the embedding's, each of B·T·d numbers.",
        "same": "moves exactly the same bytes", "not_same": "does not move the same bytes",
        "obs_sp": "Sequence parallel {same}, and what a block saves for the backward "
                  "{shrink}; plain tensor parallel keeps the residual stream and the norms' "
                  "outputs whole ({tp}), sequence parallel {sp}.",
        "is_n": "is exactly 1/N of one process's", "not_n": "is not 1/N of one process's",
        "obs_bubble": "At p = {p}, gpipe's and 1f1b's measured bubbles are {worst} "
                      "(p-1)/(m+p-1) at every m: the two schedules have the same bubble, "
                      "and only a larger m shrinks it.",
        "exactly": "exactly", "within": "within {d} of",
        "obs_peaks": "At m = {m}, gpipe makes every stage hold {g} micro-batches' activations, "
                     "1f1b only {o} (min(p-s, m) on stage s): the schedules differ in memory, "
                     "not in the bubble.",
        "held_same": "every stage held exactly the schedule's peak of micro-batches",
        "held_differs": "the micro-batches held differ from the schedule's peaks",
        "obs_run": "The real pipeline run (gpipe and 1f1b) gives one process's loss and grads "
                   "to within {worst}; {held}.",
        "obs_ring": "Ring attention gives the reference's output to within {worst} in both "
                    "layouts. Under the causal mask the contiguous layout's work per rank has "
                    "max/min = {c} (near 2N-1 = {bound}), zigzag's {z}: each rank holds an "
                    "early and a late chunk, so the work is equal.",
        "serve_title": "Serving with tensor parallel: the engine on rank 0, "
                       "tensor_parallel_size = {n}",
        "q_heads": "query heads", "kv_groups": "K/V groups",
        "split_caption": "{h} query heads in {g} K/V groups (SmolLM2's heads, the model made "
                         "small): 2 does not divide {h}, so the heads split as np.array_split "
                         "splits them; each rank's KV pool holds only the groups its heads "
                         "read, and a group read on both ranks is kept and computed on both.",
        "request": "request", "tokens_one": "greedy tokens, TP = 1",
        "serve_caption": "A random float64 model, {layers} layers, d = {d}; the engine "
                         "(scheduler, sampling) runs on rank 0 alone, broadcasts each step's "
                         "batch, and every rank runs tp_forward over its shard and its own KV "
                         "pool. Last column: the same tokens as TP = 1.",
        "serve_same": "the same as one rank's", "serve_differ": "not the same as one rank's",
        "kv_join": " and ",
        "serve_counted": "exactly (2·layers + 1) × d × 8",
        "serve_not_counted": "not (2·layers + 1) × d × 8",
        "obs_serve": "Serving with tensor parallel (N = {n}, {h} query heads split {split}, "
                     "each rank's KV pool {kv} of the {g} groups) greedy-decoded {tokens} "
                     "tokens, {same}; rank 0 all-reduced {bytes} bytes a token, {counted}.",
        "figure_bubble": "bubble", "figure_measured": "measured",
        "figure_m": "micro-batches m",
        "figure_bubble_title": "The bubble against m, p = {p}: measured on the timeline, and "
                               "the formula",
        "figure_title": "Pipeline timelines, p = {p}, m = {m} (blue forward, orange backward, "
                        "numbers the micro-batch)",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
