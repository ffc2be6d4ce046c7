#!/usr/bin/env python3
"""Demo 25 — mixture of experts: routing, the balance loss, capacity, decode bytes and
expert parallel.

A mixture of experts replaces a block's MLP by E experts and a router that sends each token
to k of them, weighted: a token costs k experts' FLOPs while the model holds E experts'
parameters. Here: one addition row's routing (each token's experts and weights); a tiny MoE
trained on addition beside a dense model of the same active parameters, its held-out loss
against steps and FLOPs; the load over the experts with and without Switch's balance loss;
the choices a capacity factor drops; the experts (and bytes) a decode step reads as the
batch grows, beside E(1 - (1 - k/E)^B); and expert parallel on 2 and 4 ranks equal to one
process, its all-to-all bytes counted.

The lines it teaches: transformer_lab/moe.py's route (softmax then top-k, or DeepSeek's
sigmoid within the best groups) and moe_forward (the pairs sorted by expert, expert_blocks
one product per expert, capacity keeping each expert's earliest); balance_loss (E Σ f_i
P_i); measure/moe_study.py's dense_twin and moe_study; measure/expert_load.py's load_cv,
decode_experts_read and decode_weight_bytes; parallel/expert.py's ep_moe_forward (counts,
then rows, through all_to_all; the local experts; all_to_all back; combine).

Every rank here is a thread of this one process (run_ranks). --quick trains fewer steps.
"""
from __future__ import annotations

import sys

import numpy as np

import _common  # (also puts the repo root on sys.path when run from a checkout)
from console import fmt_pct, print_observations, print_section, print_table, print_text
from transformer_lab import forward, get_task, init_params, llama_config
from transformer_lab.measure.expert_load import (decode_experts_read, decode_weight_bytes,
                                                 expected_experts_read)
from transformer_lab.measure.moe_study import moe_study
from transformer_lab.parallel import run_ranks
from transformer_lab.parallel.expert import ep_all_to_all_bytes, ep_forward, ep_shard

NUMBER = 25
SEED = 25
TITLE = {"zh": "混合专家：路由、负载均衡、容量、专家并行",
         "en": "Mixture of experts: routing, balance, capacity, expert parallel"}
MODEL = dict(d_model=32, n_heads=2, n_layers=2, d_ff=64, n_experts=8, experts_per_token=2)
STEPS, QUICK_STEPS = 300, 60
BATCH, LR, BALANCE_COEF = 16, 1e-2, 0.01
CAPACITY_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
CURVE_ROWS = 5  # rows of the loss table
SAME_LOSS = 0.02  # final losses within 2 % of each other are called the same
# Decode: a random model with more experts, so the distinct experts grow over several B.
DECODE_MODEL = dict(vocab=64, d_model=64, n_heads=4, n_layers=2, d_ff=128, max_seq=16,
                    n_experts=16, experts_per_token=2, moe_d_ff=64)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
EP_MODELS = {
    "Mixtral": dict(),
    "DeepSeek-V3": dict(router="sigmoid", n_group=4, topk_group=2, routed_scaling_factor=2.5,
                        n_shared_experts=1, first_dense_layers=1),
    "capacity 0.75": dict(capacity_factor=0.75),
}
EP_SIZES = (2, 4)
EP_ROWS, EP_T = 2, 6  # rows per rank, tokens per row


# ---------------------------------------------------------------- compute

def study(quick):
    task = get_task("addition")
    cfg = llama_config(vocab=task.vocab, max_seq=task.seq, dtype=np.float32, **MODEL)
    result = moe_study(cfg, task, steps=QUICK_STEPS if quick else STEPS, batch=BATCH,
                       seed=SEED, lr=LR, balance_coef=BALANCE_COEF,
                       capacity_factors=CAPACITY_FACTORS)
    result["routing"]["text"] = [task.decode([t]) for t in result["routing"]["tokens"]]
    return result


def decode_bytes():
    """Per batch size: the distinct experts a decode step read (measured, the formula) and
    the weight bytes that makes, on a random model (near-uniform routing)."""
    cfg = llama_config(**DECODE_MODEL, dtype=np.float32)
    params = init_params(cfg, seed=SEED)
    rows = []
    for B in DECODE_BATCHES:
        read = decode_experts_read(params, cfg, B, seed=SEED + B)
        rows.append({"B": B, "read": read["mean"], "expected": read["expected"],
                     "bytes": decode_weight_bytes(cfg, read["mean"]),
                     "bytes_formula": decode_weight_bytes(cfg, read["expected"])})
    # One expert read in every MoE layer: its gate, up and down, what each expert adds.
    expert = decode_weight_bytes(cfg, 1) - decode_weight_bytes(cfg, 0)
    return {"E": cfg.n_experts, "k": cfg.experts_per_token, "d": cfg.d_model,
            "moe_d_ff": cfg.expert_d_ff, "rows": rows, "floor": decode_weight_bytes(cfg, 0),
            "expert_bytes": expert}


def ep_model(fields):
    cfg = llama_config(vocab=40, d_model=16, n_heads=4, n_kv_heads=2, n_layers=3, d_ff=32,
                       max_seq=16, n_experts=8, experts_per_token=2, moe_d_ff=12,
                       dtype=np.float64, **fields)
    params = init_params(cfg, seed=SEED)
    rng = np.random.default_rng(SEED)
    for p in params["blocks"][cfg.first_dense_layers:]:
        p["moe"]["router"] *= 30.0  # routing far from uniform
        if "e_score_correction_bias" in p["moe"]:
            p["moe"]["e_score_correction_bias"][:] = rng.normal(0, 0.1, cfg.n_experts)
    return cfg, params


def ep_case(name, n):
    """On n ranks, each with EP_ROWS rows: the largest logits difference from forward on
    every row, and each rank's all_to_all calls and bytes beside the routing's count."""
    cfg, params = ep_model(EP_MODELS[name])
    tokens = np.random.default_rng(SEED + n).integers(0, cfg.vocab, (n * EP_ROWS, EP_T))
    acts = {}
    ref = forward(params, cfg, tokens, acts=acts)

    def body(c):
        mine = np.array_split(tokens, c.size)[c.rank]
        logits = ep_forward(ep_shard(params, cfg, c.rank, c.size), cfg, mine, c)
        return logits, {k: dict(v) for k, v in c.stats.items()}
    runs = run_ranks(n, body)
    layers = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
    want = [sum(ep_all_to_all_bytes(cfg, np.array_split(acts[f"blocks[{i}].moe.experts"], n),
                                    r) for i in layers) for r in range(n)]
    return {"model": name, "n": n, "moe_layers": len(layers),
            "capacity": cfg.capacity_factor is not None,
            "diff": float(np.abs(np.concatenate([r[0] for r in runs]) - ref).max()),
            "calls": [r[1]["all_to_all"]["calls"] for r in runs],
            "all_reduces": [r[1].get("all_reduce", {"calls": 0})["calls"] for r in runs],
            "bytes": [r[1]["all_to_all"]["bytes"] for r in runs], "bytes_want": want}


def compute(quick=False):
    return {"quick": quick, "study": study(quick), "decode": decode_bytes(),
            "ep": [ep_case(name, n) for name in EP_MODELS for n in EP_SIZES]}


# ---------------------------------------------------------------- what the results say

def findings(result):
    s = result["study"]
    runs = s["runs"]
    final = {name: r["curve"][-1]["loss"] for name, r in runs.items()}
    cv = {name: float(np.mean(list(runs[name]["cv"].values()))) for name in ("moe", "moe_plain")}
    layers = s["routing"]["layers"]
    weights = [sum(row) for lay in layers.values() for row in lay["weights"]]
    caps = s["capacity"]
    at_one = next(c for c in caps if c["factor"] == 1.0)
    dec = result["decode"]["rows"]
    ep = result["ep"]
    return {
        "route_distinct": {i: len({e for row in lay["experts"] for e in row})
                           for i, lay in layers.items()},
        "weights_sum_one": bool(np.allclose(weights, 1.0, atol=1e-5)),
        "flops_ratio": runs["moe"]["flops_per_step"] / runs["dense"]["flops_per_step"],
        "params_ratio": runs["moe"]["params"] / runs["dense"]["params"],
        "final": final, "moe_vs_dense": final["moe"] / final["dense"] - 1,
        "start": runs["moe"]["curve"][0]["loss"],
        "cv": cv, "balance_lowers": cv["moe"] < cv["moe_plain"],
        "drop_at_one": {k: at_one[k] for k in ("moe", "moe_plain")},
        "drops_fall": all(a[k] >= b[k] for a, b in zip(caps, caps[1:])
                          for k in ("moe", "moe_plain")),
        "fewer_dropped": at_one["moe"] < at_one["moe_plain"],
        "read_at_one": dec[0]["read"], "read_last": dec[-1]["read"],
        "read_worst": max(abs(r["read"] - r["expected"]) / r["expected"] for r in dec),
        "read_below": all(r["read"] <= r["expected"] + 1e-9 for r in dec),
        "bytes_growth": dec[-1]["bytes"] / dec[0]["bytes"],
        "ep_worst": max(r["diff"] for r in ep),
        "ep_calls": all(c == 3 * r["moe_layers"] for r in ep for c in r["calls"])
        and all(a == (r["moe_layers"] if r["capacity"] else 0) for r in ep
                for a in r["all_reduces"]),
        "ep_bytes": all(r["bytes"] == r["bytes_want"] for r in ep),
    }


def observations(result, lang):
    t, f, s = TEXT[lang], findings(result), result["study"]
    d = result["decode"]
    out = [t["obs_route"].format(k=s["k"], E=s["experts"], T=len(s["routing"]["tokens"]),
                                 used=", ".join(str(v) for v in f["route_distinct"].values()),
                                 sums=t["sum_one" if f["weights_sum_one"] else "sum_not"])]
    gap = f["moe_vs_dense"]
    verdict = "beats" if gap < -SAME_LOSS else "loses" if gap > SAME_LOSS else "same"
    out.append(t["obs_train"].format(
        ratio=f"{f['flops_ratio']:.3f}", params=f"{f['params_ratio']:.1f}", steps=s["steps"],
        moe=f"{f['final']['moe']:.3f}", dense=f"{f['final']['dense']:.3f}",
        plain=f"{f['final']['moe_plain']:.3f}", start=f"{f['start']:.2f}",
        verdict=t[verdict].format(gap=fmt_pct(abs(gap)))))
    out.append(t["obs_balance"].format(
        coef=s["balance_coef"], cv=f"{f['cv']['moe']:.2f}", plain=f"{f['cv']['moe_plain']:.2f}",
        verdict=t["lowers" if f["balance_lowers"] else "not_lowers"]))
    out.append(t["obs_capacity"].format(
        moe=fmt_pct(f["drop_at_one"]["moe"]), plain=fmt_pct(f["drop_at_one"]["moe_plain"]),
        fall=t["falls" if f["drops_fall"] else "not_falls"],
        fewer=t["fewer" if f["fewer_dropped"] else "not_fewer"]))
    out.append(t["obs_decode"].format(
        k=d["k"], E=d["E"], one=f"{f['read_at_one']:.2f}", B=d["rows"][-1]["B"],
        last=f"{f['read_last']:.2f}", worst=fmt_pct(f["read_worst"]),
        below=t["below" if f["read_below"] else "around"], growth=f"{f['bytes_growth']:.1f}"))
    out.append(t["obs_ep"].format(
        worst=t["exactly"] if f["ep_worst"] == 0 else t["within"].format(d=f"{f['ep_worst']:.1e}"), sizes=" / ".join(map(str, EP_SIZES)),
        calls=t["calls_ok" if f["ep_calls"] else "calls_not"],
        bytes=t["bytes_ok" if f["ep_bytes"] else "bytes_not"]))
    return out


# ---------------------------------------------------------------- render

def _routes(lay, pos):
    return "  ".join(f"e{e} {w:.2f}" for e, w in zip(lay["experts"][pos], lay["weights"][pos]))


def curve_rows(curve, points=CURVE_ROWS):
    """About `points` evaluations, evenly spaced, the first and the last among them."""
    picks = sorted({round(i * (len(curve) - 1) / (points - 1)) for i in range(points)})
    return [curve[i] for i in picks]


def render(result, lang):
    t, s, f = TEXT[lang], result["study"], findings(result)
    r = s["routing"]
    print_text(t["backend"])
    print_section(t["route_title"].format(k=s["k"], E=s["experts"]))
    layers = sorted(r["layers"], key=int)
    print_table([t["pos"], t["token"]] + [t["layer"].format(i=i) for i in layers],
                [[p, repr(r["text"][p])] + [_routes(r["layers"][i], p) for i in layers]
                 for p in range(len(r["tokens"]))])
    print_text(t["route_caption"], style="dim")

    print_section(t["train_title"].format(steps=s["steps"]))
    runs = s["runs"]
    print_table([t["run"], t["params"], t["active"], t["flops_step"]],
                [[t["names"][name], f"{runs[name]['params']:,}", f"{runs[name]['active']:,}",
                  f"{runs[name]['flops_per_step']:.3e}"] for name in runs])
    rows = []
    for points in zip(*(curve_rows(runs[name]["curve"]) for name in runs)):
        rows.append([points[0]["step"], f"{points[0]['flops']:.2e}"]
                    + [f"{p['loss']:.3f}" for p in points])
    print_table([t["step"], "FLOPs"] + [t["names"][name] for name in runs], rows)
    print_text(t["train_caption"].format(E=s["experts"], k=s["k"], I=s["moe_d_ff"],
                                         F=s["dense_d_ff"], B=s["batch"], T=s["seq"],
                                         coef=s["balance_coef"]), style="dim")

    print_section(t["load_title"].format(n=s["held_out_tokens"]))
    print_table([t["run"], t["layer_col"], "CV"] + [f"e{e}" for e in range(s["experts"])],
                [[t["names"][name], i, f"{runs[name]['cv'][i]:.2f}", *runs[name]["load"][i]]
                 for name in ("moe", "moe_plain") for i in sorted(runs[name]["load"], key=int)])
    print_text(t["load_caption"].format(k=s["k"]), style="dim")

    print_section(t["cap_title"])
    print_table([t["factor"], t["capacity"], t["names"]["moe"], t["names"]["moe_plain"]],
                [[f"{c['factor']:g}", c["capacity"], fmt_pct(c["moe"]), fmt_pct(c["moe_plain"])]
                 for c in s["capacity"]])
    print_text(t["cap_caption"].format(n=s["held_out_tokens"], k=s["k"], E=s["experts"]),
               style="dim")

    d = result["decode"]
    print_section(t["decode_title"].format(E=d["E"], k=d["k"]))
    print_table(["B", t["read"], "E(1-(1-k/E)^B)", t["kib"], t["kib_formula"]],
                [[row["B"], f"{row['read']:.2f}", f"{row['expected']:.2f}",
                  f"{row['bytes'] / 1024:.1f}", f"{row['bytes_formula'] / 1024:.1f}"]
                 for row in d["rows"]])
    print_text(t["decode_caption"].format(d=d["d"], I=d["moe_d_ff"],
                                          floor=f"{d['floor'] / 1024:.1f}"), style="dim")

    print_section(t["ep_title"])
    print_table([t["model"], "N", t["max_diff"], t["calls"], t["bytes"], t["formula"]],
                [[e["model"], e["n"], f"{e['diff']:.1e}", e["calls"][0],
                  f"{e['bytes'][0]:,}", f"{e['bytes_want'][0]:,}"] for e in result["ep"]])
    print_text(t["ep_caption"].format(rows=EP_ROWS, T=EP_T), style="dim")
    print_observations(observations(result, lang))


def figures(result, lang):
    import _figures
    t, d = TEXT[lang], result["decode"]
    fig, ax = _figures.new_figure()
    bs = [row["B"] for row in d["rows"]]
    fine = np.geomspace(min(bs), max(bs), 200)
    kib = 1024
    ax.plot(fine, [(d["floor"] + expected_experts_read(d["E"], d["k"], b) * d["expert_bytes"])
                   / kib for b in fine], color="0.5", label=t["figure_formula"], gid="formula")
    ax.plot(bs, [row["bytes"] / kib for row in d["rows"]], "o", markersize=8,
            label=t["figure_measured"], gid="measured")
    ax.set_xscale("log", base=2)
    _figures.set_ticks(ax, bs)
    ax.set_xlabel(t["figure_batch"])
    ax.set_ylabel(t["figure_kib"])
    ax.set_title(t["figure_bytes_title"].format(E=d["E"], k=d["k"]), fontsize=11)
    ax.legend()

    curves, ax = _figures.new_figure()
    for name, run in result["study"]["runs"].items():
        ax.plot([p["flops"] for p in run["curve"]], [p["loss"] for p in run["curve"]],
                marker=".", label=t["names"][name], gid=f"curve-{name}")
    ax.set_xlabel(t["figure_flops"])
    ax.set_ylabel(t["figure_loss"])
    ax.set_title(t["figure_loss_title"], fontsize=11)
    ax.legend()
    return {"bytes": fig, "loss": curves}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "backend": "专家并行的所有 rank 都是本进程里的线程（run_ranks），通信接口与 MPI 的 rank 相同。",
        "route_title": "一行加法的路由：每个 token 选 {E} 个专家中的 {k} 个",
        "pos": "位置", "token": "token", "layer": "第 {i} 层：专家 权重",
        "route_caption": "带均衡损失训练后的模型，留出的一行：每格是该层为这个 token 选的专家（按分数从高到低）"
                         "和它们的权重（softmax 后取 top-k 再归一化，和为 1）。",
        "train_title": "混合专家与激活参数相同的稠密模型，训练 {steps} 步",
        "run": "模型", "params": "参数", "active": "每 token 乘的权重", "flops_step": "每步 FLOPs",
        "names": {"moe": "MoE+均衡", "moe_plain": "MoE", "dense": "稠密"},
        "step": "步",
        "train_caption": "加法任务，batch {B}×{T}。MoE：每层 {E} 个宽 {I} 的 SwiGLU 专家，每个 token 选 "
                         "{k} 个；“+均衡”加上 {coef} 倍的 Switch 负载均衡损失。稠密：d_ff = {F}，它的 MLP "
                         "权重等于 MoE 一层中一个 token 乘到的权重（路由器加 k 个专家），所以每步 FLOPs 相同"
                         "（measure/flops.py）。loss：留出 batch 上的交叉熵（不含均衡损失），同一批数据、同一个种子。",
        "load_title": "专家负载：留出的 {n} 个 token，有无均衡损失",
        "layer_col": "层",
        "load_caption": "e0…：每个专家收到的选择数（每个 token {k} 个）；CV = 标准差/均值，0 为完全均匀。",
        "cap_title": "容量因子与丢弃的选择",
        "factor": "容量因子", "capacity": "每专家容量",
        "cap_caption": "容量 = ceil(因子 × N × k / E)，N = {n}，k = {k}，E = {E}；每个专家只收按批次顺序"
                       "最早的那些，其余被丢弃（该 token 只走残差）。表中为被丢弃的选择占比，两种训练后的路由。",
        "decode_title": "解码一步读到的专家与字节：随 batch 增长（E = {E}，k = {k}）",
        "read": "实测专家数", "kib": "实测 KiB", "kib_formula": "公式 KiB",
        "decode_caption": "随机权重（路由接近均匀）的模型，d = {d}，专家宽 {I}：每层每步读到的不同专家数，"
                          "4 步贪心解码与各层的平均；KiB = 一步要读的权重矩阵（decode_weight_bytes），"
                          "其中与专家无关的部分为 {floor} KiB。",
        "ep_title": "专家并行等于单进程",
        "model": "模型", "max_diff": "最大差", "calls": "all_to_all 次数", "bytes": "rank 0 字节",
        "formula": "按路由计",
        "ep_caption": "float64，每个 rank {rows} 行 × {T} 个 token：拼回的 logits 与单进程 forward 的最大差。"
                      "每个 MoE 层 3 次 all_to_all（计数、token、输出返回）；字节 = 计数 (N-1)·E/N × 8，"
                      "加上发往其他 rank 的每个选择和返还给其他 rank 的每个输出各 d 个数（comm.stats）。"
                      "DeepSeek-V3 式：sigmoid 路由、分组、共享专家、第一层稠密；容量 0.75 时多一次 all_reduce"
                      "（全批次的 token 数）。",
        "sum_one": "每个 token 的权重和都是 1", "sum_not": "权重和并不都是 1",
        "obs_route": "每个 token 从 {E} 个专家中选 {k} 个，{sums}；这一行的 {T} 个 token 在各层分别用到了 "
                     "{used} 个不同的专家：不同的 token 走不同的专家。",
        "beats": "MoE+均衡低 {gap}：相同计算量下，更多的参数学得更快。",
        "loses": "这次 MoE+均衡反而高 {gap}。",
        "same": "两者只差 {gap}，这么短的训练还分不出高下。",
        "obs_train": "MoE 与稠密模型每步的 FLOPs 之比为 {ratio}，参数却是 {params} 倍。{steps} 步后留出 loss"
                     "（起点 {start}）：MoE+均衡 {moe}，稠密 {dense}，不加均衡的 MoE {plain}。{verdict}",
        "lowers": "均衡损失让负载更均匀。", "not_lowers": "这次均衡损失没有让负载更均匀。",
        "obs_balance": "负载的 CV（各层平均）：加 {coef} 倍均衡损失时 {cv}，不加时 {plain}。{verdict}",
        "falls": "因子越大丢得越少", "not_falls": "丢弃并不随因子单调减少",
        "fewer": "均衡过的路由丢得更少", "not_fewer": "均衡过的路由并没有丢得更少",
        "obs_capacity": "容量因子 1 时，均衡训练的路由丢弃 {moe} 的选择，未均衡的丢弃 {plain}；{fall}，"
                        "{fewer}：容量按均匀负载定，负载越偏，溢出越多。",
        "below": "每个 B 都不高于公式：随机路由并不完全均匀，token 之间共用的专家更多",
        "around": "有高有低",
        "obs_decode": "batch 1 时一步只读 {one} 个专家（正好 k = {k}）；B = {B} 时读 {last} 个（共 {E} 个），"
                      "与 E(1-(1-k/E)^B) 最多差 {worst}，{below}；一步要读的权重字节随之增长到 {growth} 倍："
                      "MoE 解码的访存随 batch 上升，直到所有专家都被读到。",
        "calls_ok": "每个 MoE 层正好 3 次 all_to_all", "calls_not": "all_to_all 次数与预期不符",
        "bytes_ok": "字节数与按路由算出的完全相同", "bytes_not": "字节数与按路由算出的不同",
        "exactly": "完全相同", "within": "相差至多 {d}",
        "obs_ep": "专家并行（N = {sizes}，Mixtral、DeepSeek-V3 式和带容量）的 logits 与单进程{worst}"
                  "（float64）；{calls}，{bytes}。",
        "figure_formula": "公式 E(1-(1-k/E)^B)", "figure_measured": "实测",
        "figure_batch": "batch B", "figure_kib": "每步读取的权重 (KiB)",
        "figure_bytes_title": "解码一步读取的权重随 batch 增长（E = {E}，k = {k}）",
        "figure_flops": "训练 FLOPs", "figure_loss": "留出 loss",
        "figure_loss_title": "留出 loss 与训练 FLOPs：MoE 与激活参数相同的稠密模型",
    },
    "en": {
        "backend": "Every rank of expert parallel is a thread of this one process (run_ranks), "
                   "with the same communicator interface as MPI ranks.",
        "route_title": "One addition row's routing: each token chooses {k} of {E} experts",
        "pos": "pos", "token": "token", "layer": "layer {i}: expert weight",
        "route_caption": "The model trained with the balance loss, on a held-out row: each cell "
                         "holds the experts that layer chose for the token (best score first) "
                         "and their weights (softmax, the top k, renormalised to sum to 1).",
        "train_title": "A mixture of experts beside a dense model of the same active parameters, "
                       "{steps} steps",
        "run": "model", "params": "params", "active": "weights per token",
        "flops_step": "FLOPs/step",
        "names": {"moe": "MoE+balance", "moe_plain": "MoE", "dense": "dense"},
        "step": "step",
        "train_caption": "The addition task, batches of {B}×{T}. MoE: per layer {E} SwiGLU "
                         "experts of width {I}, {k} chosen per token; +balance adds {coef} times "
                         "Switch's load-balancing loss. Dense: d_ff = {F}, its MLP as many "
                         "weights as a token multiplies by in a MoE layer (the router and k "
                         "experts), so a step costs the same FLOPs (measure/flops.py). Loss: the "
                         "cross-entropy on a held-out batch (no balance term), the same batches "
                         "and seed for all three.",
        "load_title": "Expert load on {n} held-out tokens, with and without the balance loss",
        "layer_col": "layer",
        "load_caption": "e0…: the choices each expert received ({k} per token); CV = std / "
                        "mean, 0 for an even load.",
        "cap_title": "The capacity factor and the choices it drops",
        "factor": "factor", "capacity": "per expert",
        "cap_caption": "Capacity = ceil(factor × N × k / E), N = {n}, k = {k}, E = {E}; each "
                       "expert takes its earliest choices in the batch's order and drops the "
                       "rest (that token passes on the residual alone). The table: the share of "
                       "choices dropped, under both trained routers.",
        "decode_title": "The experts and bytes a decode step reads, against the batch (E = {E}, "
                        "k = {k})",
        "read": "experts read", "kib": "KiB", "kib_formula": "formula KiB",
        "decode_caption": "A model with random weights (routing near uniform), d = {d}, experts "
                          "of width {I}: the distinct experts a step read per layer, the mean "
                          "over 4 greedy decode steps and the layers; KiB: the weight matrices "
                          "a step reads (decode_weight_bytes), {floor} KiB of them not experts.",
        "ep_title": "Expert parallel equals one process",
        "model": "model", "max_diff": "max |Δ|", "calls": "all_to_alls", "bytes": "rank 0 bytes",
        "formula": "from routing",
        "ep_caption": "float64, {rows} rows × {T} tokens per rank: the logits put back "
                      "together against forward in one process. Three all_to_alls per MoE layer "
                      "(the counts, the tokens, the outputs back); bytes: the counts, (N-1)·E/N "
                      "× 8, and d numbers for each choice sent to another rank and each output "
                      "returned to one (comm.stats). DeepSeek-V3-style: the sigmoid router, "
                      "groups, a shared expert, a dense first layer; capacity 0.75 adds an "
                      "all_reduce (the whole batch's tokens).",
        "sum_one": "each token's weights sum to 1", "sum_not": "the weights do not all sum to 1",
        "obs_route": "Each token chooses {k} of {E} experts and {sums}; the row's {T} tokens use "
                     "{used} distinct experts in the layers: different tokens take different "
                     "experts.",
        "beats": "MoE+balance is {gap} lower: at the same compute, more parameters learn "
                 "faster.",
        "loses": "This time MoE+balance is {gap} higher.",
        "same": "They are only {gap} apart: a run this short does not tell them apart.",
        "obs_train": "The MoE's FLOPs per step over the dense model's: {ratio}, with {params}x "
                     "the parameters. After {steps} steps the held-out loss (from {start}) is "
                     "{moe} for MoE+balance, {dense} dense, {plain} for the MoE without the "
                     "balance loss. {verdict}",
        "lowers": "The balance loss evens the load.",
        "not_lowers": "This time the balance loss did not even the load.",
        "obs_balance": "The load's CV (mean over the layers): {cv} with {coef} times the balance "
                       "loss, {plain} without. {verdict}",
        "falls": "a larger factor drops fewer", "not_falls": "the drops do not fall with the factor",
        "fewer": "the balanced router drops fewer",
        "not_fewer": "the balanced router does not drop fewer",
        "obs_capacity": "At capacity factor 1 the balanced router drops {moe} of the choices, the "
                        "unbalanced one {plain}; {fall}, and {fewer}: capacity is set for an "
                        "even load, and the more skewed the load the more overflows.",
        "below": "at no B above it: a random router is not quite uniform, so the tokens "
                 "share more experts",
        "around": "above it at some B and below at others",
        "obs_decode": "At batch 1 a step reads {one} experts (k = {k}); at B = {B} it reads "
                      "{last} of {E}, at most {worst} off E(1-(1-k/E)^B), {below}; the weight bytes a "
                      "step reads grow {growth}x: MoE decode reads more as the batch grows, "
                      "until every expert is read.",
        "calls_ok": "exactly 3 all_to_alls per MoE layer",
        "calls_not": "the all_to_all calls differ from the count",
        "bytes_ok": "the bytes are exactly the routing's count",
        "bytes_not": "the bytes differ from the routing's count",
        "exactly": "exactly", "within": "to within {d}",
        "obs_ep": "Expert parallel (N = {sizes}; Mixtral, DeepSeek-V3-style and with a "
                  "capacity) gives one process's logits {worst} (float64); {calls}, and "
                  "{bytes}.",
        "figure_formula": "formula E(1-(1-k/E)^B)", "figure_measured": "measured",
        "figure_batch": "batch B", "figure_kib": "weights read per step (KiB)",
        "figure_bytes_title": "The weights a decode step reads, against the batch (E = {E}, "
                              "k = {k})",
        "figure_flops": "training FLOPs", "figure_loss": "held-out loss",
        "figure_loss_title": "Held-out loss against training FLOPs: MoE and a dense model of "
                             "the same active parameters",
    },
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
