"""attention_core throughput beside two hand-written formulations, the tiled FlashAttention form
(time and peak memory) and the float32 matmul peak."""
from __future__ import annotations

import math

import numpy as np

from transformer_lab import attention_core, flash_attention

from transformer_lab.measure import matmul_peak as measure_matmul_peak
from transformer_lab.measure import peak_traced_bytes
from transformer_lab.measure import time_call as measure
from transformer_lab.measure import time_side_by_side as measure_side_by_side
from transformer_lab.measure.flops import attention_flops, causal_attention_flops

FLOP_CONVENTION = (
    "4*T*S*H*D per call: the QK^T and PV matmuls (2*T*S*D each, per query head) counted over "
    "the full T x S score matrix, although the causal mask makes about half of it unneeded; "
    "mask and softmax are not counted. The same count for every implementation and size, so "
    "GFLOP/s ratios equal time ratios.")


def make_qkv(T, H, G, D, *, B=1, S=None, dtype=np.float32, seed=0):
    """Random q [B, T, H, D] and k, v [B, S, G, D] (S = T by default)."""
    rng = np.random.default_rng(seed)
    S = T if S is None else S
    q = rng.standard_normal((B, T, H, D)).astype(dtype)
    k = rng.standard_normal((B, S, G, D)).astype(dtype)
    v = rng.standard_normal((B, S, G, D)).astype(dtype)
    return q, k, v


def attention_bmm(q, k, v, offset=0):
    """Causal attention written as batched matmuls over the whole T x S score matrix.

    K/V stay grouped: the R = H // G query heads of a group are extra rows of
    one [R*T, D] @ [D, S] product. Scores, mask, softmax (in place), then @ V.
    """
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    R = H // G
    qg = (q * (1.0 / math.sqrt(D))).reshape(B, T, G, R, D).transpose(0, 2, 3, 1, 4)
    qg = qg.reshape(B, G, R * T, D)  # [B, G, R*T, D], scaled
    scores = (qg @ k.transpose(0, 2, 3, 1)).reshape(B, G, R, T, S)  # [B, G, R, T, S]
    visible = np.arange(S)[None, :] <= offset + np.arange(T)[:, None]  # [T, S]
    np.copyto(scores, -np.inf, where=~visible)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    out = scores.reshape(B, G, R * T, S) @ v.transpose(0, 2, 1, 3)  # [B, G, R*T, D]
    return out.reshape(B, G, R, T, D).transpose(0, 3, 1, 2, 4).reshape(B, T, H * D)


def attention_einsum(q, k, v, offset=0):
    """The same causal attention with np.einsum (no optimize) and K/V expanded per query head."""
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    R = H // G
    kx = np.repeat(k, R, axis=2)  # [B, S, H, D]: query head h reads K/V head h // R
    vx = np.repeat(v, R, axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, kx) * (1.0 / math.sqrt(D))  # [B, H, T, S]
    visible = np.arange(S)[None, :] <= offset + np.arange(T)[:, None]
    scores = np.where(visible, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", weights, vx).reshape(B, T, H * D)


def matmul_peak(n=2048, *, repeats=5, dtype=np.float32):
    """Best GFLOP/s of one n x n @ n x n product (2 n^3 FLOPs), as transformer_lab.measure times it."""
    peak = measure_matmul_peak(n, dtype=dtype, repeats=repeats)
    return {**peak, "gflops": peak["flops_per_s"] / 1e9}


def _with_gflops(stats, flops):
    return {**stats, "gflops": flops / stats["best_s"] / 1e9,
            "gflops_median": flops / stats["median_s"] / 1e9}


def run_attention(sizes=(128, 512, 2048), groups=(8, 2), *, H=8, D=64, B=1, einsum_max_T=2048,
                  repeats=7, einsum_repeats=2, peak_n=2048, peak_repeats=7, dtype=np.float32,
                  flash_block=64):
    """attention_core, attention_bmm, flash_attention (tiles flash_block x flash_block) and
    attention_einsum at each (T, G), plus the matmul peak.

    attention_core, attention_bmm and flash_attention are timed round-robin in the same
    loop; einsum (much slower) on its own, and only for T <= einsum_max_T. The peak memory
    of core, bmm and flash is measured once each, with tracemalloc, beside the B*H*T*S
    float scores a plain form holds.
    """
    peak_before = matmul_peak(peak_n, repeats=peak_repeats, dtype=dtype)
    rows = []
    for T in sizes:
        for G in groups:
            q, k, v = make_qkv(T, H, G, D, B=B, dtype=dtype)
            flops = B * attention_flops(T, T, H, D)
            fns = {"attention_core": lambda: attention_core(q, k, v),
                   "bmm": lambda: attention_bmm(q, k, v),
                   "flash": lambda: flash_attention(q, k, v, block_q=flash_block,
                                                    block_k=flash_block)}
            timed = measure_side_by_side(fns, repeats=repeats, warmup=1)
            row = {"T": T, "S": T, "G": G, "flops": flops,
                   "causal_flops": B * causal_attention_flops(T, H, D),
                   "attention_core": _with_gflops(timed["attention_core"], flops),
                   "bmm": _with_gflops(timed["bmm"], flops),
                   "flash": _with_gflops(timed["flash"], flops), "einsum": None,
                   "score_bytes": B * H * T * T * np.dtype(dtype).itemsize,
                   "peak_bytes": {name: peak_traced_bytes(fn)[1] for name, fn in fns.items()}}
            if T <= einsum_max_T:
                row["einsum"] = _with_gflops(
                    measure(lambda: attention_einsum(q, k, v), repeats=einsum_repeats, warmup=1),
                    flops)
            row["core_vs_bmm"] = timed["bmm"]["best_s"] / timed["attention_core"]["best_s"]
            row["flash_vs_core"] = timed["flash"]["best_s"] / timed["attention_core"]["best_s"]
            rows.append(row)
    # The peak is measured before and after the attention runs; the better of the two counts.
    peak_after = matmul_peak(peak_n, repeats=peak_repeats, dtype=dtype)
    peak = max(peak_before, peak_after, key=lambda p: p["gflops"])
    for row in rows:
        row["core_fraction_of_peak"] = row["attention_core"]["gflops"] / peak["gflops"]
        # The same time against only the visible (causal) pairs' FLOPs, for reference.
        row["core_causal_gflops"] = row["causal_flops"] / row["attention_core"]["best_s"] / 1e9
        row["core_causal_fraction_of_peak"] = row["core_causal_gflops"] / peak["gflops"]
    return {"dtype": np.dtype(dtype).name, "B": B, "H": H, "D": D, "offset": 0, "causal": True,
            "flop_convention": FLOP_CONVENTION,
            "flash_block": flash_block,
            "timing": f"best of {repeats} after a warm-up (einsum: best of {einsum_repeats}); "
                      "attention_core, bmm and flash measured round-robin",
            "matmul_peak": peak,
            "matmul_peak_runs_gflops": [peak_before["gflops"], peak_after["gflops"]],
            "rows": rows}
