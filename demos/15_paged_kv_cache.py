#!/usr/bin/env python3
"""Demo 15 — the paged KV cache, prefix caching and preemption.

Four looks at the serving engine's memory (transformer_lab.serve), on a small
random model:
1. a contiguous reservation of max_seq positions per sequence against blocks of
   16: the memory each design holds at the workload's peak, and how many
   sequences the engine runs at once in the memory of a few reservations;
2. the block tables of two sequences that share a prompt prefix: logical block →
   physical block, the shared blocks and their reference counts;
3. prefix caching on requests that share a long system prompt: the hit rate
   from llm.stats() and the time to first token with and without it;
4. preemption in a small pool: it happens, and the outputs equal a run with a
   big pool.

The lines it teaches: transformer_lab/serve/block_manager.py's BlockManager (blocks
allocated, freed and shared by prefix hash, chain_hash).
"""
from __future__ import annotations

import sys
import time

import numpy as np

import _common  # noqa: F401  (puts the repo root on sys.path when run from a checkout)
from console import fmt_pct, fmt_time, print_observations, print_section, print_table, print_text
from transformer_lab import init_params, llama_config
from transformer_lab.measure import blas_threads
from transformer_lab.serve import LLM, SamplingParams

NUMBER = 15
SEED = 15
MODEL = dict(vocab=2048, d_model=128, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=384, max_seq=256)
BLOCK = 16
# 1. the workload: prompts uniform in [8, 64), outputs geometric with mean 16, capped at 96
REQUESTS, QUICK_REQUESTS = 48, 24
PROMPT_RANGE, OUT_MEAN, OUT_CAP = (8, 64), 16, 96
RESERVATIONS = 8  # the "same memory": this many contiguous max_seq reservations
# 2. the block-table picture: small blocks so that a short prefix spans several
PIC_BLOCK, PIC_PREFIX, PIC_SUFFIXES, PIC_DECODES = 4, 10, (3, 5), 5
# 3. prefix caching: a long system prompt, short user turns
SYSTEM, QUICK_SYSTEM = 224, 160
USERS, QUICK_USERS = 16, 8
USER_RANGE = (8, 17)
PREFIX_OUT = 4
# 4. preemption: requests that outgrow a small pool
PRE_REQUESTS, PRE_PROMPT, PRE_OUT, PRE_BLOCKS = 8, 20, 40, 12

TITLE = {"zh": "分页 KV 缓存与前缀缓存", "en": "The paged KV cache and prefix caching"}

DESIGNS = ("contig", "exact", "paged")


def model(dtype=np.float32):
    cfg = llama_config(**MODEL, dtype=dtype)
    return cfg, init_params(cfg, seed=SEED)


def random_ids(rng, n, vocab):
    return [int(t) for t in rng.integers(0, vocab, size=n)]


def workload(n, vocab, seed=SEED):
    rng = np.random.default_rng(seed)
    prompt_lengths = rng.integers(*PROMPT_RANGE, size=n)
    outs = np.minimum(rng.geometric(1 / OUT_MEAN, size=n), OUT_CAP)
    return [random_ids(rng, int(p), vocab) for p in prompt_lengths], [int(o) for o in outs]


# ---------------------------------------------------------------- 1. memory per design

def memory_part(params, cfg, prompts, outs):
    """Step the engine through the workload with a big pool; after each step, what the
    running sequences hold, what their blocks take, and what contiguous designs would."""
    llm = LLM.from_params(cfg, params, block_size=BLOCK, max_num_seqs=len(prompts),
                          num_blocks=len(prompts) * cfg.max_seq // BLOCK,
                          enable_prefix_caching=False)
    seqs = [llm.add_request(p, SamplingParams(max_tokens=o)) for p, o in zip(prompts, outs)]
    best = None
    while llm.has_unfinished_requests():
        llm.step()
        running = llm.scheduler.running
        row = {"running": len(running), "tokens": sum(s.num_computed_tokens for s in running),
               "paged": llm.block_manager.blocks_in_use * BLOCK,
               "contig": len(running) * cfg.max_seq,
               "exact": sum(s.num_prompt_tokens + s.params.max_tokens for s in running)}
        assert row["tokens"] == llm.step_log[-1].tokens_in_cache
        if best is None or row["paged"] > best["paged"]:
            best = row
    assert all(s.is_finished for s in seqs)
    for d in DESIGNS:
        best[f"{d}_waste"] = 1 - best["tokens"] / best[d]
    best["paged_blocks"] = best["paged"] // BLOCK
    best["bytes_per_token"] = llm.pool.bytes_per_token(cfg)
    return best


def fit_part(params, cfg, prompts, outs):
    """The workload in the memory of RESERVATIONS max_seq reservations, twice: capped at
    RESERVATIONS sequences (all that contiguous reservations let run), and paged with no
    cap but the blocks."""
    blocks = RESERVATIONS * cfg.max_seq // BLOCK
    rows = {}
    for name, cap in (("contig", RESERVATIONS), ("paged", len(prompts))):
        llm = LLM.from_params(cfg, params, block_size=BLOCK, num_blocks=blocks,
                              max_num_seqs=cap, enable_prefix_caching=False)
        results = llm.generate(prompts, [SamplingParams(max_tokens=o) for o in outs],
                               use_tqdm=False)
        running = [r.num_seqs for r in llm.step_log]
        rows[name] = {"max_running": max(running), "mean_running": float(np.mean(running)),
                      "steps": len(running), "preemptions": llm.stats()["preemptions"],
                      "lengths_ok": [len(r.token_ids) for r in results] == list(outs)}
    return {"reservations": RESERVATIONS, "blocks": blocks, **rows,
            "gain": rows["paged"]["max_running"] / rows["contig"]["max_running"],
            "mean_gain": rows["paged"]["mean_running"] / rows["contig"]["mean_running"]}


# ---------------------------------------------------------------- 2. the block-table picture

def picture_part(params, cfg):
    """A runs its prefill; then B, with the same prefix, joins; both decode a few steps."""
    rng = np.random.default_rng(SEED + 2)
    prefix = random_ids(rng, PIC_PREFIX, cfg.vocab)
    llm = LLM.from_params(cfg, params, block_size=PIC_BLOCK, num_blocks=64)
    sp = SamplingParams(max_tokens=2 * PIC_DECODES + 4)
    a = llm.add_request(prefix + random_ids(rng, PIC_SUFFIXES[0], cfg.vocab), sp)
    llm.step()
    b = llm.add_request(prefix + random_ids(rng, PIC_SUFFIXES[1], cfg.vocab), sp)
    for _ in range(PIC_DECODES):
        llm.step()
    blocks = llm.block_manager.blocks
    rows = []
    for i in range(max(len(a.block_table), len(b.block_table))):
        ids = [t[i] if i < len(t) else None for t in (a.block_table, b.block_table)]
        refs = [blocks[x].ref_count if x is not None else None for x in ids]
        rows.append({"logical": i, "a": ids[0], "b": ids[1], "refs": refs,
                     "shared": ids[0] is not None and ids[0] == ids[1],
                     "first": i * PIC_BLOCK, "last": (i + 1) * PIC_BLOCK - 1})
    shared = [r["a"] for r in rows if r["shared"]]
    return {"block_size": PIC_BLOCK, "prefix": PIC_PREFIX, "len_a": len(a), "len_b": len(b),
            "computed_a": a.num_computed_tokens, "computed_b": b.num_computed_tokens,
            "hit_b": b.num_cached_tokens, "table_a": list(a.block_table),
            "table_b": list(b.block_table), "rows": rows, "shared": shared,
            "prefix_rest": PIC_PREFIX - len(shared) * PIC_BLOCK}


# ---------------------------------------------------------------- 3. prefix caching

def prefix_part(params, cfg, system, users):
    rng = np.random.default_rng(SEED + 3)
    sys_ids = random_ids(rng, system, cfg.vocab)
    prompts = [sys_ids + random_ids(rng, int(rng.integers(*USER_RANGE)), cfg.vocab)
               for _ in range(users)]
    rows = {}
    for on in (False, True):
        llm = LLM.from_params(cfg, params, block_size=BLOCK, enable_prefix_caching=on,
                              max_num_seqs=users)
        start = time.perf_counter()
        results = llm.generate(prompts, SamplingParams(max_tokens=PREFIX_OUT), use_tqdm=False)
        wall = time.perf_counter() - start
        st = llm.stats()
        ttfts = [r.metrics.ttft for r in results]
        rows["on" if on else "off"] = {
            "hit_tokens": st["prefix_hit_tokens"], "query_tokens": st["prefix_query_tokens"],
            "hit_rate": st["prefix_hit_tokens"] / st["prefix_query_tokens"]
            if st["prefix_query_tokens"] else 0.0,
            "prefill_computed": st["prefill_tokens_computed"],
            "ttft_p50": float(np.median(ttfts)), "ttft_max": float(max(ttfts)), "wall": wall,
            "tokens": [r.token_ids for r in results]}
    return {"system": system, "users": users, "user_range": [USER_RANGE[0], USER_RANGE[1] - 1],
            "out": PREFIX_OUT, "prompt_tokens": sum(len(p) for p in prompts), **rows,
            "same_tokens": rows["on"]["tokens"] == rows["off"]["tokens"],
            "saving": rows["off"]["prefill_computed"] / rows["on"]["prefill_computed"],
            "ttft_better": rows["on"]["ttft_p50"] < rows["off"]["ttft_p50"]}


# ---------------------------------------------------------------- 4. preemption

def preemption_part():
    """Greedy on a float64 copy of the model: a small pool against a big one."""
    cfg, params = model(np.float64)
    rng = np.random.default_rng(SEED + 4)
    prompts = [random_ids(rng, PRE_PROMPT, cfg.vocab) for _ in range(PRE_REQUESTS)]
    sp = SamplingParams(max_tokens=PRE_OUT)
    rows = {}
    for name, blocks in (("small", PRE_BLOCKS), ("big", None)):
        llm = LLM.from_params(cfg, params, block_size=BLOCK, num_blocks=blocks,
                              max_num_seqs=PRE_REQUESTS)
        results = llm.generate(prompts, sp, use_tqdm=False)
        st = llm.stats()
        rows[name] = {"blocks": llm.num_blocks, "preemptions": st["preemptions"],
                      "steps": st["steps"],
                      "recomputed": st["prefill_tokens_computed"] - PRE_REQUESTS * PRE_PROMPT,
                      "hits": st["prefix_hit_tokens"],
                      "prefill_computed": st["prefill_tokens_computed"],
                      "tokens": [r.token_ids for r in results]}
    differ = sum(a != b for a, b in zip(rows["small"]["tokens"], rows["big"]["tokens"]))
    return {"requests": PRE_REQUESTS, "prompt": PRE_PROMPT, "out": PRE_OUT, **rows,
            "differ": int(differ), "extra_steps": rows["small"]["steps"] - rows["big"]["steps"]}


def compute(quick=False):
    cfg, params = model()
    n = QUICK_REQUESTS if quick else REQUESTS
    prompts, outs = workload(n, cfg.vocab)
    with blas_threads(1):
        mem = memory_part(params, cfg, prompts, outs)
        fit = fit_part(params, cfg, prompts, outs)
        pic = picture_part(params, cfg)
        pre_cache = prefix_part(params, cfg, QUICK_SYSTEM if quick else SYSTEM,
                                QUICK_USERS if quick else USERS)
        pre = preemption_part()
    return {"model": {"layers": cfg.n_layers, "d_model": cfg.d_model, "max_seq": cfg.max_seq},
            "block_size": BLOCK,
            "workload": {"requests": n, "prompt_range": [PROMPT_RANGE[0], PROMPT_RANGE[1] - 1],
                         "out_mean": OUT_MEAN},
            "memory": mem, "fit": fit, "picture": pic, "prefix": pre_cache, "preemption": pre}


# ---------------------------------------------------------------- render

def render(result, lang="zh"):
    t = TEXT[lang]
    m, w, mem, fit = result["model"], result["workload"], result["memory"], result["fit"]
    print_text(t["setup"].format(L=m["layers"], d=m["d_model"], S=m["max_seq"],
                                 bpt=mem["bytes_per_token"],
                                 bs=result["block_size"]))

    print_section(t["mem"].format(n=w["requests"], p0=w["prompt_range"][0],
                                  p1=w["prompt_range"][1], om=w["out_mean"]))
    print_table([t["design"], t["slots"], t["held"], t["waste"], t["bytes"]],
                [[t[d], mem[d], mem["tokens"], fmt_pct(mem[f"{d}_waste"]),
                  mem[d] * mem["bytes_per_token"]] for d in DESIGNS])
    print_text(t["mem_note"].format(r=mem["running"], t=mem["tokens"]), style="dim")
    print_section(t["fit"].format(k=fit["reservations"], blocks=fit["blocks"]))
    print_table([t["fit_design"], t["fit_max"], t["fit_mean"], t["steps"], t["pre"]],
                [[t[k], fit[k]["max_running"], f"{fit[k]['mean_running']:.1f}", fit[k]["steps"],
                  fit[k]["preemptions"]] for k in ("contig", "paged")])
    print_text(t["fit_note"].format(k=fit["reservations"]), style="dim")

    pic = result["picture"]
    print_section(t["pic"].format(bs=pic["block_size"], p=pic["prefix"]))

    def cell(block_id, shared):
        return "—" if block_id is None else f"{block_id}{'*' if shared else ''}"

    print_table([t["logical"], t["tokens"], t["seq"].format(name="A"), t["seq"].format(name="B"),
                 t["ref"]],
                [[r["logical"], f"{r['first']}–{r['last']}", cell(r["a"], r["shared"]),
                  cell(r["b"], r["shared"]),
                  " / ".join("—" if x is None else str(x) for x in r["refs"])
                  if not r["shared"] else str(r["refs"][0])] for r in pic["rows"]])
    print_text(t["pic_note"].format(la=pic["len_a"], lb=pic["len_b"], hit=pic["hit_b"]),
               style="dim")

    pc = result["prefix"]
    print_section(t["prefix"].format(n=pc["users"], s=pc["system"], u0=pc["user_range"][0],
                                     u1=pc["user_range"][1], o=pc["out"]))
    print_table([t["pc"], t["hit"], t["computed"], t["ttft50"], t["ttft_max"], t["wall"]],
                [[t[k], fmt_pct(pc[k]["hit_rate"]), pc[k]["prefill_computed"],
                  fmt_time(pc[k]["ttft_p50"]), fmt_time(pc[k]["ttft_max"]), fmt_time(pc[k]["wall"])]
                 for k in ("off", "on")])

    pre = result["preemption"]
    print_section(t["preempt"].format(n=pre["requests"], p=pre["prompt"], o=pre["out"],
                                      small=pre["small"]["blocks"], big=pre["big"]["blocks"]))
    print_table([t["pool"], t["blocks"], t["pre"], t["recomputed"], t["steps"], t["same"]],
                [[t[k], pre[k]["blocks"], pre[k]["preemptions"], pre[k]["recomputed"],
                  pre[k]["steps"], "" if k == "big" else t["yes" if not pre["differ"] else "no"]]
                 for k in ("small", "big")])

    print_observations(observations(result, lang))


def findings(result):
    """The facts the observations state, from the computed result."""
    mem, fit, pc, pre = result["memory"], result["fit"], result["prefix"], result["preemption"]
    return {"running": mem["running"], "tokens": mem["tokens"],
            "slots": {d: mem[d] for d in DESIGNS},
            "waste": {d: mem[f"{d}_waste"] for d in DESIGNS},
            "max_running": fit["paged"]["max_running"], "gain": fit["gain"],
            "fit_preemptions": fit["paged"]["preemptions"], "shared": result["picture"]["shared"],
            "hit_rate": pc["on"]["hit_rate"],
            "prefill_computed": (pc["on"]["prefill_computed"], pc["off"]["prefill_computed"]),
            "ttft_better": pc["ttft_better"], "preemptions": pre["small"]["preemptions"],
            "outputs_differ": pre["differ"], "extra_steps": pre["extra_steps"]}


def observations(result, lang):
    t, f = TEXT[lang], findings(result)
    mem, fit, pc, pre = result["memory"], result["fit"], result["prefix"], result["preemption"]
    paged, pic, waste = fit["paged"], result["picture"], f["waste"]
    fit_pre = t["obs_fit_pre"].format(p=f["fit_preemptions"]) if f["fit_preemptions"] else ""
    same = (t["obs_pre_same"].format(n=pre["requests"], big=pre["big"]["blocks"])
            if not f["outputs_differ"] else t["obs_pre_diff"].format(d=f["outputs_differ"]))
    return [
        t["obs_waste"].format(r=f["running"], t=f["tokens"], c=mem["contig"],
                              cw=fmt_pct(waste["contig"]), e=mem["exact"],
                              ew=fmt_pct(waste["exact"]), p=mem["paged"], pb=mem["paged_blocks"],
                              pw=fmt_pct(waste["paged"]), bm=result["block_size"] - 1),
        t["obs_fit"].format(k=fit["reservations"], blocks=fit["blocks"], m=f["max_running"],
                            mean=f"{paged['mean_running']:.1f}",
                            cmean=f"{fit['contig']['mean_running']:.1f}",
                            x=f"{f['gain']:.1f}", s=paged["steps"], cs=fit["contig"]["steps"],
                            pre=fit_pre),
        t["obs_pic"].format(n=len(f["shared"]), ids=f["shared"], rest=pic["prefix_rest"],
                            ta=pic["table_a"], tb=pic["table_b"]),
        t["obs_hit" if f["ttft_better"] else "obs_hit_slow"].format(
            rate=fmt_pct(f["hit_rate"]), h=pc["on"]["hit_tokens"], q=pc["on"]["query_tokens"],
            con=f["prefill_computed"][0], coff=f["prefill_computed"][1], x=f"{pc['saving']:.1f}",
            t_off=fmt_time(pc["off"]["ttft_p50"]), t_on=fmt_time(pc["on"]["ttft_p50"])),
        t["obs_pre"].format(small=pre["small"]["blocks"], p=f["preemptions"],
                            rc=pre["small"]["recomputed"], hits=pre["small"]["hits"],
                            ds=f["extra_steps"], same=same),
    ]


def figures(result, lang="zh"):
    """The KV slots each design holds at the peak: real tokens and waste, stacked."""
    from _figures import new_figure
    t, names = FIG_TEXT[lang], TEXT[lang]
    mem = result["memory"]
    fig, ax = new_figure()
    x = np.arange(len(DESIGNS))
    held = [mem["tokens"]] * len(DESIGNS)
    wasted = [mem[d] - mem["tokens"] for d in DESIGNS]
    ax.bar(x, held, color="tab:blue", label=t["held"], gid="held")
    ax.bar(x, wasted, bottom=held, color="0.75", label=t["wasted"], gid="wasted")
    for i, d in enumerate(DESIGNS):
        ax.text(i, mem[d], fmt_pct(mem[f"{d}_waste"]), ha="center", va="bottom")
    ax.set_xticks(x, [names[d] for d in DESIGNS])
    ax.set_ylabel(t["y"])
    ax.legend()
    fig.suptitle(t["title"].format(r=mem["running"]))
    return {"memory": fig}


# ---------------------------------------------------------------- the text, zh and en

TEXT = {
    "zh": {
        "setup": "随机初始化的 Llama 式小模型（{L} 层，d={d}，max_seq={S}），每个 token 的 K/V"
                 "（所有层）占 {bpt} 字节（float32）。块大小 {bs}。",
        "mem": "1. 连续预留对分页：{n} 个请求（提示 {p0}–{p1}，输出均值 {om}），峰值时刻",
        "design": "设计", "slots": "占用槽位", "held": "其中真实 token", "waste": "浪费",
        "bytes": "字节",
        "contig": "连续：每序列 max_seq", "exact": "连续：提示+max_tokens", "paged": "分页：块",
        "mem_note": "峰值时刻（分页块数最多的一步之后）有 {r} 个序列在运行，共持有 {t} 个 token "
                    "的 K/V。",
        "fit": "同样的内存（{k} 个 max_seq 预留 = {blocks} 块）里能同时跑几个序列",
        "fit_design": "设计", "fit_max": "一步最多", "fit_mean": "每步平均", "pre": "抢占",
        "pic": "2. 两个共享前缀的序列的块表（块大小 {bs}，共享前缀 {p} 个 token）",
        "logical": "逻辑块", "seq": "序列 {name}", "ref": "引用数", "tokens": "token 位置",
        "shared": "共享", "pic_note": "物理块号后的 * 表示共享块。A 有 {la} 个 token，B 有 {lb} "
                                      "个；B 的前 {hit} 个 token 命中前缀缓存。",
        "prefix": "3. 前缀缓存：{n} 个请求共享 {s} 个 token 的系统提示，用户部分 {u0}–{u1} 个 "
                  "token，各生成 {o} 个",
        "pc": "前缀缓存", "on": "开", "off": "关", "hit": "命中率", "computed": "预填充计算",
        "ttft50": "TTFT p50", "ttft_max": "TTFT 最大", "wall": "总用时",
        "preempt": "4. 小池子里的抢占：{n} 个请求（提示 {p}，生成 {o}），{small} 块对 {big} 块"
                   "（float64）",
        "pool": "池子", "blocks": "块数", "steps": "步数", "recomputed": "重算 token",
        "same": "输出与大池子相同", "small": "小", "big": "大", "yes": "是", "no": "否",
        "obs_waste": "峰值时刻 {r} 个序列真正持有 {t} 个 token：按 max_seq 连续预留要 {c} 个槽位，"
                     "{cw} 浪费；按提示+max_tokens 预留要 {e} 个，{ew} 浪费；分页只占 {p} 个"
                     "（{pb} 块），{pw} 浪费，每个序列最多空着最后一块里的 {bm} 个槽位。",
        "obs_fit": "在 {k} 个 max_seq 预留的内存（{blocks} 块）里，连续预留最多同时跑 {k} 个序列"
                   "（每步平均 {cmean} 个，{cs} 步跑完）；分页引擎一步最多跑了 {m} 个，是 {x} 倍"
                   "（每步平均 {mean} 个，{s} 步跑完{pre}）。",
        "obs_fit_pre": "，期间抢占 {p} 次",
        "obs_pic": "A 和 B 的前 {n} 个逻辑块指向同样的物理块 {ids}，引用数为 2，只存一份；共享的"
                   "是完整的块：前缀的最后 {rest} 个 token 所在的块没有写满，B 自己算了一遍。之后"
                   "每个序列只在写满一块时才拿新块，所以两者交替解码时物理块号是交错的"
                   "（A：{ta}；B：{tb}）。",
        "obs_hit": "前缀缓存的命中率 {rate}（{h}/{q} 个 token），预填充只算了 {con} 个 token，"
                   "不开时要算 {coff} 个（{x} 倍）；TTFT 的 p50 从 {t_off} 降到 {t_on}（实测）。",
        "obs_hit_slow": "前缀缓存的命中率 {rate}（{h}/{q} 个 token），预填充只算了 {con} 个 token，"
                        "不开时要算 {coff} 个（{x} 倍）；但这次实测的 TTFT p50 没有变好"
                        "（{t_off} 对 {t_on}），机器太忙。",
        "obs_pre": "{small} 块的小池子里发生了 {p} 次抢占：被抢占的序列释放全部块，之后把提示和"
                   "已生成的 token 重新预填充（重算了 {rc} 个 token，另有 {hits} 个命中它留在前缀缓存里的块；"
                   "多用了 {ds} 步）；{same}",
        "obs_pre_same": "{n} 个输出与 {big} 块大池子的逐 token 相同。这里用 float64，重算时不同的"
                        "累加顺序带来的差异小到不足以翻转贪心选择；float32 下接近平局处就可能翻转"
                        "（见演示 14）。",
        "fit_note": "“连续”一行是引擎限定 max_num_seqs={k}：{k} 个 max_seq 预留最多容纳这么多序列。",
        "obs_pre_diff": "但 {d} 个输出与大池子的不同。",
    },
    "en": {
        "setup": "A small random Llama-style model ({L} layers, d={d}, max_seq={S}); a token's "
                 "K/V take {bpt} bytes over all layers (float32). Blocks of {bs}.",
        "mem": "1. Contiguous reservations vs pages: {n} requests (prompts {p0}–{p1}, outputs "
               "of mean {om}), at the peak",
        "design": "design", "slots": "slots held", "held": "of them real", "waste": "waste",
        "bytes": "bytes",
        "contig": "contiguous: max_seq each", "exact": "contiguous: prompt+max_tok",
        "paged": "paged: blocks",
        "mem_note": "At the peak (after the step with the most blocks in use) {r} sequences run, "
                    "holding the K/V of {t} tokens.",
        "fit": "How many sequences run at once in the same memory ({k} max_seq reservations = "
               "{blocks} blocks)",
        "fit_design": "design", "fit_max": "most in a step", "fit_mean": "mean per step",
        "pre": "preempted",
        "pic": "2. The block tables of two sequences sharing a prefix (blocks of {bs}, a "
               "{p}-token prefix)",
        "logical": "logical", "seq": "seq {name}", "ref": "refs", "tokens": "positions",
        "shared": "shared", "pic_note": "A * after a physical block id marks a shared block. A "
                                        "holds {la} tokens, B {lb}; B's first {hit} tokens hit "
                                        "the prefix cache.",
        "prefix": "3. Prefix caching: {n} requests sharing a {s}-token system prompt, user turns "
                  "of {u0}–{u1} tokens, {o} tokens generated each",
        "pc": "prefix cache", "on": "on", "off": "off", "hit": "hit rate",
        "computed": "prefill computed", "ttft50": "TTFT p50", "ttft_max": "TTFT max",
        "wall": "wall",
        "preempt": "4. Preemption in a small pool: {n} requests (prompt {p}, {o} generated), "
                   "{small} blocks vs {big} (float64)",
        "pool": "pool", "blocks": "blocks", "steps": "steps", "recomputed": "recomputed",
        "same": "same as big pool", "small": "small", "big": "big", "yes": "yes", "no": "no",
        "obs_waste": "At the peak {r} sequences hold {t} tokens: contiguous max_seq reservations "
                     "take {c} slots, {cw} of them wasted; reserving prompt + max_tokens takes "
                     "{e}, {ew} wasted; pages take {p} ({pb} blocks), {pw} wasted: at most {bm} "
                     "empty slots per sequence, in its last block.",
        "obs_fit": "In the memory of {k} max_seq reservations ({blocks} blocks) contiguous "
                   "allocation runs {k} sequences at most ({cmean} per step on average, done "
                   "in {cs} steps); the paged engine ran up to {m} in a step, {x}× as many "
                   "({mean} per step on average, done in {s} steps{pre}).",
        "obs_fit_pre": ", preempting {p} times on the way",
        "obs_pic": "A's and B's first {n} logical blocks map to the same physical blocks {ids}, "
                   "ref count 2, stored once; only full blocks are shared: the block holding the "
                   "prefix's last {rest} tokens was not full, so B computed it itself. After "
                   "that each sequence takes a new block only when one fills, so decoding in "
                   "turn interleaves their physical ids (A: {ta}; B: {tb}).",
        "obs_hit": "The prefix cache hit {rate} of the prompt tokens ({h} of {q}), so prefill "
                   "computed {con} tokens instead of {coff} ({x}× fewer); the TTFT p50 fell "
                   "from {t_off} to {t_on} (measured).",
        "obs_hit_slow": "The prefix cache hit {rate} of the prompt tokens ({h} of {q}), so "
                        "prefill computed {con} tokens instead of {coff} ({x}× fewer); this run's "
                        "TTFT p50, though, was no better ({t_off} vs {t_on}): a busy machine.",
        "obs_pre": "The {small}-block pool preempted {p} times: a preempted sequence frees all "
                   "its blocks and is later prefilled again, prompt and generated tokens ({rc} "
                   "tokens computed again, {hits} more found in the blocks it left in the prefix "
                   "cache; {ds} more steps); {same}",
        "obs_pre_same": "all {n} outputs equal, token for token, those of the {big}-block pool. "
                        "The model runs in float64 here, so that the recomputation's different "
                        "summation order is far too small to flip a greedy pick; in float32 a "
                        "near-tie could flip (demo 14).",
        "fit_note": "The contiguous row is the engine capped at max_num_seqs={k}: all that {k} "
                    "max_seq reservations can hold.",
        "obs_pre_diff": "but {d} outputs differ from the big pool's.",
    },
}

FIG_TEXT = {
    "zh": {"title": "峰值时刻占用的 KV 槽位（{r} 个序列）", "y": "token 槽位", "held": "真实 token",
           "wasted": "浪费"},
    "en": {"title": "KV slots held at the peak ({r} sequences)", "y": "token slots",
           "held": "real tokens", "wasted": "wasted"},
}


if __name__ == "__main__":
    sys.exit(_common.run_demo(sys.modules[__name__]))
