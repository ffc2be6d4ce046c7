"""A mixture of experts at decode: the experts a step reads, and its time, against the batch.

- experts read: a decode step of B sequences multiplies by every distinct expert its B
  tokens chose, measured on a random MoE model (measure.expert_load.decode_experts_read)
  beside E(1 - (1 - k/E)^B) under uniform routing, and the weight bytes a step reads from
  that count (decode_weight_bytes), beside its dense twin's (measure.moe_study.dense_twin:
  the same FLOPs per token, E/k times fewer MLP weights);
- time: one decode step of the MoE model and of the dense twin at each B, taking turns
  (measure.time_side_by_side), B new tokens after a short prompt in a KVCache, both with
  packed weights as the engine holds them.

Run it with `python -m benchmarks --only moe`.
"""
from __future__ import annotations

import numpy as np

from transformer_lab import KVCache, forward, init_params, llama_config, pack_weights
from transformer_lab.measure import time_side_by_side
from transformer_lab.measure.expert_load import decode_experts_read, decode_weight_bytes
from transformer_lab.measure.moe_study import dense_twin

MOE_MODEL = dict(vocab=4096, d_model=512, n_heads=8, n_kv_heads=4, n_layers=4, d_ff=1408,
                 max_seq=128, n_experts=8, experts_per_token=2, moe_d_ff=704)
QUICK_MODEL = dict(MOE_MODEL, d_model=256, n_layers=2, d_ff=704, moe_d_ff=352)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
QUICK_BATCHES = (1, 4, 16, 64)
PROMPT = 8  # tokens in each sequence's cache before the timed step


def moe_config(**fields):
    return llama_config(**{**MOE_MODEL, **fields}, dtype=np.float32)


def decode_step(params, cfg, batch, seed=0):
    """A zero-argument call that runs one decode step of `batch` sequences (a KVCache of
    PROMPT tokens each) and rolls the cache back, so it can be repeated."""
    rng = np.random.default_rng(seed)
    cache = KVCache(cfg, batch, PROMPT + 1)
    forward(params, cfg, rng.integers(0, cfg.vocab, (batch, PROMPT)), cache=cache)
    nxt = rng.integers(0, cfg.vocab, (batch, 1))

    def step():
        forward(params, cfg, nxt, cache=cache, check=False)
        cache.truncate(PROMPT)
    return step


def run_moe(quick=False, *, cfg=None, batches=None, repeats=None, seed=0):
    """Per batch size: the experts read (measured, expected), the bytes a step reads (MoE,
    the formula's, dense), and both models' decode step timed side by side."""
    cfg = cfg or moe_config(**(QUICK_MODEL if quick else {}))
    batches = batches or (QUICK_BATCHES if quick else BATCHES)
    repeats = repeats or (3 if quick else 7)
    dense_cfg = dense_twin(cfg)
    moe = pack_weights(init_params(cfg, seed=seed), cfg)
    dense = pack_weights(init_params(dense_cfg, seed=seed), dense_cfg)
    rows = []
    for B in batches:
        read = decode_experts_read(moe, cfg, B, seed=seed + B)
        t = time_side_by_side({"moe": decode_step(moe, cfg, B, seed),
                               "dense": decode_step(dense, dense_cfg, B, seed)},
                              repeats=repeats)
        rows.append({"B": B, "experts_read": read["mean"], "expected": read["expected"],
                     "bytes_moe": decode_weight_bytes(cfg, read["mean"]),
                     "bytes_formula": decode_weight_bytes(cfg, read["expected"]),
                     "bytes_dense": decode_weight_bytes(dense_cfg), **t})
    return {"config": {k: getattr(cfg, k) for k in MOE_MODEL}, "dense_d_ff": dense_cfg.d_ff,
            "repeats": repeats, "rows": rows}


def print_moe(out, r):
    c = r["config"]
    out.header(f"Mixture of experts at decode ({c['n_experts']} experts, top-"
               f"{c['experts_per_token']}, float32)")
    mib = 2 ** 20
    rows = [[row["B"], f"{row['experts_read']:.2f}", f"{row['expected']:.2f}",
             f"{row['bytes_moe'] / mib:.1f}", f"{row['bytes_dense'] / mib:.1f}", out.time(row["moe"]["median_s"]),
             out.time(row["dense"]["median_s"]),
             f"{row['moe']['median_s'] / row['dense']['median_s']:.2f}x"] for row in r["rows"]]
    out.table(["B", "read", "uniform", "MiB", "dense MiB", "MoE step",
               "dense step", "MoE/dense"], rows,
              caption=f"d={c['d_model']}, {c['n_layers']} layers, experts of width "
                      f"{c['moe_d_ff']}, vocab {c['vocab']}; the dense twin's d_ff "
                      f"{r['dense_d_ff']} gives a token the same FLOPs. Read: the distinct "
                      f"experts a step read, the mean over 4 greedy decode steps and the layers, "
                      f"on random weights; uniform: E(1-(1-k/E)^B). MiB: the weight matrices "
                      f"one step reads (the uniform case's in the JSON). Steps: medians of {r['repeats']} "
                      f"repeats, the two models taking turns, packed weights.")
    last = r["rows"][-1]
    out.observations([f"At B = {last['B']} a decode step reads {last['experts_read']:.1f} of "
                      f"{c['n_experts']} experts per layer "
                      f"({last['bytes_moe'] / last['bytes_dense']:.1f}x the dense twin's "
                      f"weight bytes); at B = 1 it reads {r['rows'][0]['experts_read']:.0f}."])
