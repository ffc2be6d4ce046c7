#!/usr/bin/env python3
"""Demo 18 — FlashAttention: attention one tile at a time, never the T x S scores.

The lines it teaches: the loop of transformer_lab/flash.py's flash_attention, `for s0, s1,
masked in keys:` (one tile of scores, the running max m, the running sum l, the output o
rescaled by exp(m - m_new)), the backward from the logsumexp under it, merge_attention
and the tile loop's counts (flash_tiles, flash_io). Six looks at them:
1. exactness: the tiled form (any tile sizes) and the logsumexp merge of partial
   results equal the plain attention; the backward from the lse equals the plain one;
2. peak memory, measured with tracemalloc, of the plain form (the whole score matrix),
   attention_core (a block of rows against every key) and the tiled form, T = 512-4096;
3. slow-memory traffic against the fast-memory size, counted by running the tile loop:
   doubling the fast memory about halves it, Θ(T·S·D²/M);
4. the causal tiles skipped, counted, against (n + 1) / 2n visited;
5. the time, measured: in NumPy the tiles are many small calls, not one fused kernel;
6. split-K over the serving engine's own page table: each block attended once,
   merged by logsumexp, equals attention over the gathered blocks.
"""
from __future__ import annotations

import sys

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import (fmt_bytes, fmt_pct, fmt_time, print_observations, print_section,
                     print_table, print_text)
from transformer_lab import (attention_core, attention_core_backward, attention_reference,
                             flash_attention, flash_attention_backward, flash_io, flash_tiles,
                             init_params, llama_config, merge_attention)
from transformer_lab.measure import blas_threads, peak_traced_bytes, time_side_by_side
from transformer_lab.serve import LLM, SamplingParams

NUMBER = 18
SEED = 18
TITLE = {"zh": "FlashAttention：分块的注意力", "en": "FlashAttention: attention in tiles"}

# ---------------------------------------------------------------- 1. exactness

EXACT = dict(B=2, T=200, H=8, G=2, D=64)  # GQA: 4 query heads per K/V head
ODD_BLOCKS = (37, 53)  # tiles that divide neither T nor S
SPLITS = (0, 23, 24, 101, 160, 200)  # key ranges of the merged form, one of a single key


def exact_part():
    c = EXACT
    rows = {}
    for dtype in (np.float32, np.float64):
        q, k, v = qkv(np.random.default_rng(SEED), c["B"], c["T"], c["T"], c["H"], c["G"],
                      c["D"], dtype)
        want = attention_reference(q, k, v)
        full = attention_reference(q, k, v, causal=False)
        parts = [flash_attention(q, k[:, a:b], v[:, a:b], causal=False, return_lse=True)
                 for a, b in zip(SPLITS, SPLITS[1:])]
        out, lse = flash_attention(q, k, v, return_lse=True)
        dout = np.random.default_rng(SEED + 1).standard_normal(out.shape).astype(dtype)
        got = flash_attention_backward(dout, q, k, v, out, lse)
        bwd = attention_core_backward(dout, q, k, v)
        name = np.dtype(dtype).name
        rows[name] = {
            "core": rel_err(attention_core(q, k, v), want),
            "tiled": rel_err(out, want),
            "odd": rel_err(flash_attention(q, k, v, block_q=ODD_BLOCKS[0],
                                           block_k=ODD_BLOCKS[1]), want),
            "merged": rel_err(merge_attention(parts)[0], full),
            "bwd": max(rel_err(a, b) for a, b in zip(got, bwd)),
            "dtype_kept": out.dtype == dtype and lse.dtype == dtype}
    return {**c, "odd_blocks": list(ODD_BLOCKS), "splits": len(SPLITS) - 1, **rows}


def qkv(rng, B, T, S, H, G, D, dtype=np.float32):
    q = rng.standard_normal((B, T, H, D)).astype(dtype)
    k = rng.standard_normal((B, S, G, D)).astype(dtype)
    v = rng.standard_normal((B, S, G, D)).astype(dtype)
    return q, k, v


def rel_err(a, b):
    return float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max())


# ---------------------------------------------------------------- 2. memory

# One head, D = 64, float32 (per head the score matrix is T*T*4 bytes).
MEM_T, QUICK_MEM_T = (512, 1024, 2048, 4096), (512, 1024, 2048)
MEM_D = 64
MEM_FORMS = ("plain", "core", "flash")


def memory_part(lengths):
    rows = []
    for T in lengths:
        q, k, v = qkv(np.random.default_rng(SEED + T), 1, T, T, 1, 1, MEM_D)
        peaks = {name: peak_traced_bytes(lambda f=f: f(q, k, v))[1] for name, f in
                 (("plain", attention_reference), ("core", attention_core),
                  ("flash", flash_attention))}
        scores = T * T * 4
        rows.append({"T": T, "scores": scores, **peaks, "share": peaks["flash"] / scores,
                     "plain_x": peaks["plain"] / scores, "out_bytes": T * MEM_D * 4})
    growth = {f: rows[-1][f] / rows[-2][f] for f in MEM_FORMS} if len(rows) > 1 else {}
    return {"D": MEM_D, "rows": rows, "growth": growth}


# ---------------------------------------------------------------- 3. slow-memory traffic

IO_T, IO_D, IO_SRAM = 4096, 64, tuple(16 * 1024 * 2 ** i for i in range(6))  # 16-512 KiB fast


def io_part():
    rows = []
    for m in IO_SRAM:
        causal, full = flash_io(IO_T, IO_T, IO_D, m), flash_io(IO_T, IO_T, IO_D, m, causal=False)
        rows.append({"sram": m, "block_q": causal["block_q"], "block_k": causal["block_k"],
                     "flash": causal["flash"], "full": full["flash"], "plain": causal["plain"]})
    for prev, row in zip(rows, rows[1:]):
        row["ratio"] = row["flash"] / prev["flash"]
        row["full_ratio"] = row["full"] / prev["full"]
    ratios = [r["ratio"] for r in rows[1:]]
    return {"T": IO_T, "D": IO_D, "rows": rows, "ratio_min": min(ratios), "ratio_max": max(ratios),
            "fixed": IO_T * (2 * IO_D + 1) * 4,  # Q read, O and lse written once, whatever M
            "last_tiles": -(-IO_T // rows[-1]["block_q"])}


# ---------------------------------------------------------------- 4. causal tiles skipped

SKIP_BLOCK, SKIP_N = 64, (1, 2, 4, 8, 16, 32, 64)  # n x n tiles of 64


def skip_part():
    rows = []
    for n in SKIP_N:
        t = flash_tiles(n * SKIP_BLOCK, n * SKIP_BLOCK, block_q=SKIP_BLOCK, block_k=SKIP_BLOCK)
        rows.append({"n": n, **t, "share": t["visited"] / t["total"],
                     "formula": (n + 1) / (2 * n)})
    return {"block": SKIP_BLOCK, "rows": rows,
            "all_equal": all(r["visited"] * 2 * r["n"] == r["total"] * (r["n"] + 1) for r in rows)}


# ---------------------------------------------------------------- 5. time

TIME = dict(B=1, H=8, G=2, D=64)  # float32, one BLAS thread
TIME_T, QUICK_TIME_T = 2048, 512
TIME_BLOCKS = (16, 64, 256)
REPEATS, QUICK_REPEATS = 5, 3


def time_part(T, repeats):
    c = TIME
    q, k, v = qkv(np.random.default_rng(SEED + 5), c["B"], T, T, c["H"], c["G"], c["D"])
    fns = {"core": lambda: attention_core(q, k, v)}
    for b in TIME_BLOCKS:
        fns[f"flash{b}"] = lambda b=b: flash_attention(q, k, v, block_q=b, block_k=b)
    timed = time_side_by_side(fns, repeats=repeats, warmup=1)
    rows = {name: {"best_s": s["best_s"], "median_s": s["median_s"], "steady": s["steady"]}
            for name, s in timed.items()}
    for b in TIME_BLOCKS:
        rows[f"flash{b}"]["tiles"] = flash_tiles(T, T, block_q=b, block_k=b)["visited"]
    small, big = f"flash{TIME_BLOCKS[0]}", f"flash{TIME_BLOCKS[-1]}"
    core = rows["core"]["best_s"]
    for r in rows.values():
        r["vs_core"] = r["best_s"] / core
    per_tile = ((rows[small]["best_s"] - rows[big]["best_s"])
                / (rows[small]["tiles"] - rows[big]["tiles"]))
    # What one block of scores holds: attention_core's rows against every key (it picks its
    # own block), and one tile of the tiled form, both over all heads.
    core_rows = min(T, max(-(-128 // (c["H"] // c["G"])), (1 << 19) // (c["H"] * T),
                           -(-T // 16)))
    return {**c, "T": T, "repeats": repeats, "rows": rows, "per_tile_s": per_tile,
            "core_block_bytes": c["B"] * c["H"] * core_rows * T * 4,
            "tile_bytes": c["B"] * c["H"] * 64 * 64 * 4,
            "flash_faster": rows["flash64"]["best_s"] < core}


# ---------------------------------------------------------------- 6. split-K over the engine's pages

# Demo 15's small model and blocks of 16.
MODEL = dict(vocab=2048, d_model=128, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=384, max_seq=256)
PAGE, PAGE_PROMPTS, PAGE_STEPS = 16, (70, 41), 4


def split_k(q, pool, layer, table, length):
    """Attention of q [1, 1, H, D] over the first `length` tokens of a block table, one block
    at a time (flash-decoding): each block is read once, in place, and the partial results
    are merged by their logsumexp. Returns (out [1, 1, H*D], the block ids read, in order)."""
    bs = pool.block_size
    parts, reads = [], []
    for i, block in enumerate(table[:-(-length // bs)]):
        n = min(bs, length - i * bs)  # the last block may be part full
        k, v = pool.k[layer][block, :n][None], pool.v[layer][block, :n][None]  # [1, n, G, D]
        parts.append(flash_attention(q, k, v, causal=False, return_lse=True))
        reads.append(int(block))
    return merge_attention(parts)[0], reads


def pages_part():
    cfg = llama_config(**MODEL)
    params = init_params(cfg, seed=15)
    llm = LLM.from_params(cfg, params, block_size=PAGE, num_blocks=64)
    rng = np.random.default_rng(SEED + 6)
    seqs = [llm.add_request([int(t) for t in rng.integers(0, cfg.vocab, size=n)],
                            SamplingParams(max_tokens=PAGE_STEPS + 8)) for n in PAGE_PROMPTS]
    for _ in range(PAGE_STEPS):
        llm.step()
    layer, pool = cfg.n_layers - 1, llm.pool
    rows = []
    for name, seq in zip("AB", seqs):
        n = seq.num_computed_tokens
        table = list(seq.block_table)
        q = rng.standard_normal((1, 1, cfg.n_heads, cfg.head_dim)).astype(np.float32)
        whole = attention_core(q, pool.k[layer][table].reshape(1, -1, cfg.n_kv_heads,
                                                                cfg.head_dim)[:, :n],
                               pool.v[layer][table].reshape(1, -1, cfg.n_kv_heads,
                                                            cfg.head_dim)[:, :n], offset=n - 1)
        merged, reads = split_k(q, pool, layer, table, n)
        counts = {b: reads.count(b) for b in reads}
        rows.append({"name": name, "tokens": n, "table": table, "reads": reads,
                     "once": sorted(counts.values()) == [1] * len(table) and reads == table,
                     "diff": rel_err(merged, whole),
                     "gather_bytes": 2 * len(table) * PAGE * cfg.n_kv_heads * cfg.head_dim * 4})
    return {"block_size": PAGE, "layer": layer, "rows": rows,
            "blocks": sum(len(r["table"]) for r in rows),
            "max_diff": max(r["diff"] for r in rows),
            "gather_bytes": sum(r["gather_bytes"] for r in rows)}


def compute(quick=False):
    with blas_threads(1):  # small products: a second BLAS thread only adds waiting
        return {"exact": exact_part(), "memory": memory_part(QUICK_MEM_T if quick else MEM_T),
                "io": io_part(), "skip": skip_part(),
                "time": time_part(QUICK_TIME_T if quick else TIME_T,
                                  QUICK_REPEATS if quick else REPEATS),
                "pages": pages_part()}


# ---------------------------------------------------------------- what the results say

def findings(result):
    """The facts the observations state, computed from the results."""
    ex, mem, io, sk, tm, pg = (result[k] for k in ("exact", "memory", "io", "skip", "time",
                                                   "pages"))
    last, prev, top = mem["rows"][-1], mem["rows"][-2], io["rows"][-1]
    rows, small, big = tm["rows"], f"flash{TIME_BLOCKS[0]}", f"flash{TIME_BLOCKS[-1]}"
    return {
        "odd_blocks": ex["odd_blocks"], "splits": ex["splits"],
        "tiled_err": {d: max(ex[d][k] for k in ("tiled", "odd")) for d in ("float32", "float64")},
        "merged_err": ex["float64"]["merged"], "bwd_err": ex["float64"]["bwd"],
        "mem_T": last["T"], "plain_peak": last["plain"], "plain_x": last["plain_x"],
        "flash_peak": last["flash"], "flash_share": last["share"],
        "out_share": last["out_bytes"] / last["flash"], "growth_T": (prev["T"], last["T"]),
        "growth": {f: mem["growth"][f] for f in ("plain", "flash")},
        "io_ratio": (io["ratio_min"], io["ratio_max"]), "io_plain": top["plain"],
        "io_sram": top["sram"], "io_share": top["flash"] / top["plain"], "io_fixed": io["fixed"],
        "io_tiles": io["last_tiles"], "skip": {k: sk["rows"][-1][k] for k in ("n", "visited",
                                                                              "skipped")},
        "flash_faster": tm["flash_faster"], "tile_bytes": tm["tile_bytes"],
        "core_block_bytes": tm["core_block_bytes"], "flash64_s": rows["flash64"]["best_s"],
        "flash64_x": rows["flash64"]["vs_core"], "core_s": rows["core"]["best_s"],
        "blocks": {b: (rows[k]["tiles"], rows[k]["best_s"]) for b, k in
                   ((TIME_BLOCKS[0], small), (TIME_BLOCKS[-1], big))},
        "per_tile_s": tm["per_tile_s"], "pages_n": len(pg["rows"]), "pages_blocks": pg["blocks"],
        "pages_once": all(r["once"] for r in pg["rows"]), "pages_diff": pg["max_diff"],
        "gather_bytes": pg["gather_bytes"]}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    (bq, bk), (small, big) = f["odd_blocks"], (TIME_BLOCKS[0], TIME_BLOCKS[-1])
    verdict = (t["verdict_fast"].format(tile=fmt_bytes(f["tile_bytes"]),
                                        block=fmt_bytes(f["core_block_bytes"]))
               if f["flash_faster"] else t["verdict_slow"])
    return [
        t["obs_exact"].format(bq=bq, bk=bk, e32=_err(f["tiled_err"]["float32"]),
                              e64=_err(f["tiled_err"]["float64"]), n=f["splits"],
                              m64=_err(f["merged_err"]), b64=_err(f["bwd_err"])),
        t["obs_mem"].format(T=f["mem_T"], plain=fmt_bytes(f["plain_peak"]),
                            x=f"{f['plain_x']:.1f}", flash=fmt_bytes(f["flash_peak"]),
                            share=fmt_pct(f["flash_share"]), out=fmt_pct(f["out_share"]),
                            t0=f["growth_T"][0], t1=f["growth_T"][1],
                            gp=f"{f['growth']['plain']:.1f}", gf=f"{f['growth']['flash']:.1f}"),
        t["obs_io"].format(lo=f"{f['io_ratio'][0]:.3f}", hi=f"{f['io_ratio'][1]:.3f}",
                           plain=fmt_bytes(f["io_plain"]), m=fmt_bytes(f["io_sram"]),
                           share=fmt_pct(f["io_share"]), fixed=fmt_bytes(f["io_fixed"]),
                           n=f["io_tiles"]),
        t["obs_skip"].format(n=f["skip"]["n"], v=f["skip"]["visited"], s=f["skip"]["skipped"]),
        t["obs_time"].format(verdict=verdict, b=64, t=fmt_time(f["flash64_s"]),
                             x=f"{f['flash64_x']:.2f}", tc=fmt_time(f["core_s"]), big=big,
                             small=small, nb=f["blocks"][big][0], ns=f["blocks"][small][0],
                             tb=fmt_time(f["blocks"][big][1]), ts=fmt_time(f["blocks"][small][1]),
                             per=fmt_time(f["per_tile_s"])),
        t["obs_pages"].format(n=f["pages_n"], blocks=f["pages_blocks"],
                              diff=_err(f["pages_diff"]), copy=fmt_bytes(f["gather_bytes"])),
    ]


# ---------------------------------------------------------------- render

def _err(x):
    return "0" if x == 0 else f"{x:.1e}"


def render(result, lang="zh"):
    t = TEXT[lang]
    ex = result["exact"]
    print_section(t["exact"].format(**{k: ex[k] for k in ("B", "T", "H", "G", "D")}))
    bq, bk = ex["odd_blocks"]
    print_table([t["form"], t["f32"], t["f64"]], [
        [t["core"], _err(ex["float32"]["core"]), _err(ex["float64"]["core"])],
        [t["tiled"].format(bq=64, bk=64), _err(ex["float32"]["tiled"]),
         _err(ex["float64"]["tiled"])],
        [t["tiled"].format(bq=bq, bk=bk), _err(ex["float32"]["odd"]), _err(ex["float64"]["odd"])],
        [t["merged"].format(n=ex["splits"]), _err(ex["float32"]["merged"]),
         _err(ex["float64"]["merged"])],
        [t["bwd"], _err(ex["float32"]["bwd"]), _err(ex["float64"]["bwd"])]])

    mem = result["memory"]
    print_section(t["mem"].format(D=mem["D"]))
    print_table([t["T"], t["scores"], t["plain"], t["core_col"], t["flash"], t["share"]],
                [[r["T"], fmt_bytes(r["scores"]), fmt_bytes(r["plain"]), fmt_bytes(r["core"]),
                  fmt_bytes(r["flash"]), fmt_pct(r["share"])] for r in mem["rows"]])

    io = result["io"]
    print_section(t["io"].format(T=io["T"], D=io["D"]))
    print_table([t["sram"], t["blocks"], t["flash_c"], t["ratio"], t["flash_f"], t["plain_io"]],
                [[fmt_bytes(r["sram"]), f"{r['block_q']}×{r['block_k']}", fmt_bytes(r["flash"]),
                  f"{r['ratio']:.3f}" if "ratio" in r else "", fmt_bytes(r["full"]),
                  fmt_bytes(r["plain"])] for r in io["rows"]])

    sk = result["skip"]
    print_section(t["skip"].format(b=sk["block"]))
    print_table([t["n"], t["total"], t["visited"], t["masked"], t["skipped"], t["share_v"],
                 t["formula"]],
                [[r["n"], r["total"], r["visited"], r["masked"], r["skipped"],
                  f"{r['share']:.4f}", f"{r['formula']:.4f}"] for r in sk["rows"]])

    tm = result["time"]
    print_section(t["time"].format(**{k: tm[k] for k in ("B", "T", "H", "G", "D")}))
    names = {"core": "attention_core",
             **{f"flash{b}": t["tiled"].format(bq=b, bk=b) for b in TIME_BLOCKS}}
    print_table([t["what"], t["tiles"], t["best"], t["median"], t["vs_core"]],
                [[names[k], r.get("tiles", ""), fmt_time(r["best_s"]), fmt_time(r["median_s"]),
                  f"{r['vs_core']:.2f}×"] for k, r in tm["rows"].items()])

    pg = result["pages"]
    print_section(t["pages"].format(bs=pg["block_size"], l=pg["layer"]))
    print_table([t["seq"], t["tokens"], t["table"], t["reads"], t["diff"]],
                [[r["name"], r["tokens"], " ".join(map(str, r["table"])),
                  " ".join("1" if r["once"] else "?" for _ in r["table"]), _err(r["diff"])]
                 for r in pg["rows"]])
    print_text(t["pages_note"], style="dim")

    print_observations(observations(result, lang))


def figures(result, lang="zh"):
    """Peak memory against T per form; HBM traffic against the SRAM size."""
    from _figures import new_figure, set_ticks
    t, names = FIG_TEXT[lang], TEXT[lang]
    mem = result["memory"]
    fig, ax = new_figure()
    Ts = [r["T"] for r in mem["rows"]]
    labels = {"plain": names["plain"], "core": "attention_core", "flash": names["flash"]}
    for form in MEM_FORMS:
        ax.plot(Ts, [r[form] / 2 ** 20 for r in mem["rows"]], "o-", label=labels[form],
                gid=f"mem_{form}")
    ax.plot(Ts, [r["scores"] / 2 ** 20 for r in mem["rows"]], ":", color="0.4",
            label=names["scores"], gid="mem_scores")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    set_ticks(ax, Ts)
    ax.set_xlabel(t["T"])
    ax.set_ylabel(t["bytes"])
    ax.legend()
    fig.suptitle(t["mem_title"])

    io = result["io"]
    fig2, ax2 = new_figure()
    ms = [r["sram"] / 1024 for r in io["rows"]]
    for key, label in (("flash", names["flash_c"]), ("full", names["flash_f"]),
                       ("plain", names["plain_io"])):
        ax2.plot(ms, [r[key] / 2 ** 20 for r in io["rows"]], "o-", label=label, gid=f"io_{key}")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    set_ticks(ax2, ms)
    ax2.set_xlabel(t["sram"])
    ax2.set_ylabel(t["io"])
    ax2.legend()
    fig2.suptitle(t["io_title"])
    return {"memory": fig, "traffic": fig2}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "exact": "1. 精确性：B={B}，T=S={T}，H={H}，G={G}，D={D}；与 attention_reference 的最大相对误差",
        "form": "形式", "f32": "float32", "f64": "float64",
        "core": "attention_core（按行分块）", "tiled": "分块 {bq}×{bk}",
        "merged": "{n} 段键的 lse 合并（非因果）", "bwd": "反向（由 lse 重算 P）对 attention_core_backward",
        "mem": "2. 峰值内存（tracemalloc 实测），单头，D={D}，float32，因果（core：attention_core）",
        "T": "T", "scores": "得分矩阵", "plain": "朴素（整块得分）", "core_col": "core",
        "flash": "分块 64×64", "share": "分块/得分矩阵",
        "io": "3. 慢速内存（HBM）读写字节对快速内存（SRAM）大小：T=S={T}，D={D}，float32（按分块"
              "循环计数）",
        "sram": "SRAM", "blocks": "块大小", "flash_c": "分块（因果）", "ratio": "比上一行",
        "flash_f": "分块（非因果）", "plain_io": "朴素",
        "skip": "4. 因果掩码跳过的块：n×n 个 {b}×{b} 的块（计数）",
        "n": "n", "total": "总块数", "visited": "计算的", "masked": "其中带掩码",
        "skipped": "跳过", "share_v": "计算占比", "formula": "(n+1)/2n",
        "time": "5. 用时（实测，1 个 BLAS 线程）：B={B}，T=S={T}，H={H}，G={G}，D={D}，float32，因果",
        "what": "形式", "best": "最好", "median": "中位数", "vs_core": "对 attention_core",
        "tiles": "块数",
        "pages": "6. 引擎页表上的 split-K：演示 15 的小模型，块大小 {bs}，第 {l} 层，一个随机查询",
        "seq": "序列", "tokens": "token 数", "table": "块表", "reads": "每块读取次数",
        "diff": "最大相对差",
        "pages_note": "整体注意力：像引擎那样把块表里的块拼成连续的 K/V，再用 attention_core；"
                      "split-K：每块单独 flash_attention（返回 lse），再用 merge_attention 合并。",
        "obs_exact": "分块形式与朴素形式一致：64×64 的块和不整除 T 的 {bq}×{bk} 块，float32 "
                     "最大相对误差 {e32}，float64 {e64}；把键分成 {n} 段分别算再按 logsumexp 合并，"
                     "float64 误差 {m64}；只靠 lse 和 D=rowsum(dO∘O) 的反向与 attention_core_backward "
                     "差 {b64}（float64）。",
        "obs_mem": "T={T} 时朴素形式峰值 {plain}，是 {x} 个得分矩阵（得分、掩码后的副本、softmax）；"
                   "分块形式只要 {flash}，是得分矩阵的 {share}（不超过 1/16），其中 {out} 是输出本身；"
                   "T 从 {t0} 翻倍到 {t1}，朴素形式的内存变为 {gp} 倍，分块形式 {gf} 倍。",
        "obs_io": "SRAM 每翻一倍，分块形式的 HBM 读写就乘 {lo}–{hi}（因果），即约减半："
                  "K、V 每个查询块读一遍，查询块行数与 SRAM 成正比，Θ(T·S·D²/M)；朴素形式始终"
                  "是 {plain}，SRAM={m} 时分块只有它的 {share}。查询块越少，比值离 1/2 越远：读 Q、"
                  "写 O 的 {fixed} 不随 SRAM 变，因果的 (n+1)/2n 也随 n 变小而变大（最后 n={n}）。",
        "obs_skip": "因果掩码下对角线以上的块整块跳过（不计算、不掩码）：n 个块一边时计算 n(n+1)/2 "
                    "个，占 (n+1)/2n，计数与公式在每个 n 上相等（n={n} 时 {v}，跳过 {s}）；只有对"
                    "角线上的 n 块要掩码。",
        "obs_time": "{verdict}分块 {b}×{b} 用时 {t}，是 attention_core（{tc}）的 {x} 倍。块从 "
                    "{big} 行减到 {small} 行，块数从 {nb} 增到 {ns}，用时从 {tb} 变为 {ts}：每多一块约 "
                    "{per}。NumPy 里每块都是十几次独立的数组调用，每次都把块从缓存读写一遍；GPU "
                    "内核把一块的 QK、exp 和 PV 融合在片上 SRAM 里，省下的是 HBM 流量，这正是 "
                    "NumPy 做不到的。",
        "verdict_slow": "如预期，在 NumPy 里分块形式没有更快：",
        "verdict_fast": "这次分块形式反而更快：它的一块得分只有 {tile}，attention_core 一块行对全部"
                        "键的得分有 {block}。",
        "obs_pages": "对引擎页表做 split-K：{n} 个序列共 {blocks} 个块，每块只读一次（读取次数都是 "
                     "1），各块结果按 logsumexp 合并，与拼起来一次算的注意力最大相对差 {diff}"
                     "（float32）；引擎的拼接要先复制这一层 {copy} 的 K/V，split-K 直接就地读块。",
    },
    "en": {
        "exact": "1. Exactness: B={B}, T=S={T}, H={H}, G={G}, D={D}; largest relative error "
                 "against attention_reference",
        "form": "form", "f32": "float32", "f64": "float64",
        "core": "attention_core (row blocks)", "tiled": "tiles {bq}×{bk}",
        "merged": "lse merge of {n} key ranges (not causal)",
        "bwd": "backward (P from lse) vs attention_core_backward",
        "mem": "2. Peak memory (tracemalloc, measured), one head, D={D}, float32, causal "
               "(core: attention_core)",
        "T": "T", "scores": "scores", "plain": "plain (all scores)",
        "core_col": "core", "flash": "tiles 64×64", "share": "tiles/scores",
        "io": "3. Slow-memory (HBM) bytes against the fast-memory (SRAM) size: T=S={T}, D={D}, "
              "float32 (counted by the tile loop)",
        "sram": "SRAM", "blocks": "tile", "flash_c": "tiled (causal)", "ratio": "vs above",
        "flash_f": "tiled (full)", "plain_io": "plain",
        "skip": "4. Tiles the causal mask skips: n×n tiles of {b}×{b} (counted)",
        "n": "n", "total": "tiles", "visited": "computed", "masked": "of them masked",
        "skipped": "skipped", "share_v": "computed share", "formula": "(n+1)/2n",
        "time": "5. Time (measured, one BLAS thread): B={B}, T=S={T}, H={H}, G={G}, D={D}, "
                "float32, causal",
        "what": "form", "best": "best", "median": "median", "vs_core": "vs attention_core",
        "tiles": "tiles",
        "pages": "6. Split-K over the engine's page table: demo 15's small model, blocks of {bs}, "
                 "layer {l}, one random query",
        "seq": "sequence", "tokens": "tokens", "table": "block table", "reads": "reads per block",
        "diff": "max rel. diff",
        "pages_note": "All at once: the table's blocks gathered into contiguous K/V, as the engine "
                      "does, then attention_core. Split-K: flash_attention over each block alone "
                      "(with its lse), then merge_attention.",
        "obs_exact": "The tiled form equals the plain one, in tiles of 64×64 and of {bq}×{bk} "
                     "(which divide neither T nor S): largest relative error {e32} in float32, {e64} in "
                     "float64; the keys in {n} ranges, attended apart and merged by logsumexp: "
                     "{m64} in float64; the backward from only the lse and D = rowsum(dO∘O) is "
                     "within {b64} of attention_core_backward (float64).",
        "obs_mem": "At T={T} the plain form peaked at {plain}, {x} score matrices (the scores, "
                   "their masked copy, the softmax); the tiled form at {flash}, {share} of one "
                   "score matrix (at most 1/16), {out} of it the output itself. From T={t0} to "
                   "{t1} the plain form's memory grew {gp}×, the tiled form's {gf}×.",
        "obs_io": "Each doubling of the SRAM multiplied the tiled form's HBM traffic by "
                  "{lo}–{hi} (causal), about a half: K and V are read once per query tile, and "
                  "a query tile's rows grow with the SRAM, Θ(T·S·D²/M). The plain form moves "
                  "{plain} whatever the SRAM; at SRAM={m} the tiled form moves {share} of that. "
                  "The fewer the query tiles, the further from 1/2: reading Q and writing O "
                  "({fixed}) does not shrink, and the causal (n+1)/2n grows as n falls (n={n} "
                  "at the last).",
        "obs_skip": "Causal tiles wholly above the diagonal are skipped, neither computed nor "
                    "masked: with n tiles a side n(n+1)/2 are computed, (n+1)/2n of them, and "
                    "the count equals the formula at every n (at n={n}: {v} computed, {s} "
                    "skipped); only the n diagonal tiles need a mask.",
        "obs_time": "{verdict}tiles of {b}×{b} took {t}, {x}× attention_core's {tc}. From "
                    "{big} rows a tile to {small}, the tiles went from {nb} to {ns} and the "
                    "time from {tb} to {ts}: about {per} per extra tile. In NumPy a tile is a "
                    "dozen separate array calls, each reading and writing it through the "
                    "caches; a GPU kernel fuses a tile's QK, exp and PV in on-chip SRAM, and "
                    "the HBM traffic it saves is what NumPy cannot save.",
        "verdict_slow": "As expected, the tiled form is not faster in NumPy: ",
        "verdict_fast": "This time the tiled form was faster: one tile of its scores is {tile}, "
                        "one of attention_core's row blocks against every key {block}; ",
        "obs_pages": "Split-K over the engine's page table: {n} sequences, {blocks} blocks, each "
                     "read once (every read count is 1), the blocks' results merged by "
                     "logsumexp, within {diff} (relative, float32) of attention over the "
                     "gathered blocks; the engine's gather copies this layer's {copy} of K/V "
                     "first, split-K reads the blocks where they lie.",
    },
}

FIG_TEXT = {
    "zh": {"mem_title": "峰值内存对序列长度（单头，D=64，float32）", "T": "序列长度 T",
           "bytes": "峰值内存（MiB）", "io_title": "HBM 读写对 SRAM 大小（T=S=4096，D=64）",
           "sram": "SRAM（KiB）", "io": "HBM 读写（MiB）"},
    "en": {"mem_title": "Peak memory against length (one head, D=64, float32)",
           "T": "sequence length T", "bytes": "peak memory (MiB)",
           "io_title": "HBM traffic against SRAM size (T=S=4096, D=64)", "sram": "SRAM (KiB)",
           "io": "HBM traffic (MiB)"},
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
