"""The memory ledger of a training step: what params, grads, optimizer state and
activations occupy, counted from the config the way Korthikanti et al. (2022, "Reducing
Activation Recomputation in Large Transformer Models") count them: numbers per layer and
per token, times the bytes of a number. Tested against tracemalloc's peak of one
loss_and_grads call (tests/training/test_memory.py); per rank of data parallel with ZeRO
against tracemalloc in each rank under mpiexec (tests/parallel/test_memory_dp.py).
"""
from __future__ import annotations

import numpy as np

from ..config import Config
from ..params import named_params, param_shapes
from ..validate import check_int

OPTIMIZERS = {"adamw": 2, "sgd": 0}  # state arrays per trainable number: AdamW's m and v


def training_memory(cfg: Config, batch, seq, *, lora=None, checkpoint=False,
                    optimizer="adamw", dtype=np.float32, supervised=None, dp=1,
                    zero=0) -> dict:
    """Bytes of one training step of loss_and_grads on [batch, seq] tokens, packed params
    as load_gguf and pack_weights give them; `supervised` positions have a target (the
    rest -1, as a chat fine-tune's prompt; default every position):

    b = bytes per number (dtype); N = batch * seq tokens, S of them supervised; L layers;
    d model width; H, G query and K/V heads of size D; F the MLP width; V the
    vocabulary; P the params.

    - "params" = P * b.
    - "grads" = P * b, or with a LoRA only its adapters', L * sum over targets of
      r * (in + out) numbers.
    - "optimizer" = 2 * (trainable numbers) * b for AdamW (m and v), 0 for SGD.
    - "activations": the most that one loss_and_grads holds besides the grads. The head
      runs first, when only its own grad exists, and the blocks' backward after, when
      the grads fill up, so the peak is the larger of two phases:
        head phase   = kept + head + (V * d, the head's grad, unless LoRA)
        blocks phase = kept + recomputed + transient + (all the grads),
      less the grads, where
        kept, what the backward reads, held from the forward to the end: without
          checkpointing, per layer per token
            4d (attn_in, resid_mid, mlp_in, resid_post)
          + (H + 2G)D (the packed Q/K/V product: q, k and v are views of it, RoPE
            and the LoRA updates done in place)  + HD (the merged heads)
          + 3F (the packed gate/up product and silu(gate) * up),
          plus d per token (the embedding) and 3d per token (the final norm's input,
          output and gradient);
          with checkpointing only d per layer per token (each block's input) + 3d;
        recomputed: with checkpointing, one layer's kept numbers (the block recomputed
          just before its backward), else 0;
        transient: the larger of the attention backward's 2 * batch * H * seq^2
          numbers (the weights P and dS) + (H / G) * seq^2 bytes of the mask (its
          negation is gone before dS is made)
          + 6 * N * HD numbers, and the MLP backward's 6 * N * F numbers;
        head: one chunk of min(S, LOSS_ROWS) rows of logits, [rows, V] (its gradient
          is made in the same buffer), and when there is more than one chunk, a full
          step's [8192, d] slice of a later chunk's head grad.
    - "total" = the sum of the four.

    Per rank of data parallel over dp ranks (parallel/data.py): the rank runs its share of
    the batch, ceil(batch / dp) rows (rank 0's, the largest; `supervised` shared in the
    same proportion), and ZeRO stage `zero` (parallel/zero.py) shards the model states of
    the T trainable numbers over the ranks, a share being ceil(T / dp) numbers:

        zero 0   params P b      grads T b        optimizer 2 T b      (every rank all)
        zero 1   params P b      grads T b        optimizer 2 T b / dp
        zero 2   params P b      grads T b / dp   optimizer 2 T b / dp
        zero 3   params (P - T) b + T b / dp, grads and optimizer as zero 2

    so for fp32 AdamW over every weight (T = P = Psi, b = 4) params + grads + optimizer are
    16 Psi, (8 + 8/dp) Psi, (4 + 12/dp) Psi and 16 Psi / dp bytes. ZeRO cuts each unit (the
    embeddings, each block, the head) apart, so a rank's share differs from ceil(T / dp)
    by fewer numbers than there are units. Left out: the all-reduce's buckets (a flat copy
    of up to bucket_mb of grads at a time), a unit's whole grads in the moment before
    ZeRO-2 reduce-scatters them, ZeRO-3's gathered params (the embeddings and head for the
    step, one block at a time).

    What is left out (each under 1 % of SmolLM2's total at T >= 96): norms' and
    RoPE's small tables, the AdamW block scratch, Python objects.
    """
    from ..training.backward import LOSS_ROWS, VOCAB_SLICE

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if cfg.attention == "mla":
        raise ValueError("training_memory counts standard attention, not attention='mla'")
    dp = check_int(dp, "dp", low=1)
    zero = check_int(zero, "zero", low=0, high=3)
    if zero == 3 and lora is not None:
        raise ValueError("zero=3 shards the params the forward reads; with a LoRA those are "
                         "the frozen weights, whole on every rank: give zero 0, 1 or 2")
    b = np.dtype(dtype).itemsize
    batch, seq = check_int(batch, "batch", low=1), check_int(seq, "seq", low=1)
    S_all = batch * seq if supervised is None else \
        check_int(supervised, "supervised", low=0, high=batch * seq)
    rows = -(-batch // dp)  # this rank's rows: rank 0's share, the largest
    N = rows * seq
    S = min(N, -(-S_all * rows // batch))
    d, H, G, D, F, V, L = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
                           cfg.vocab, cfg.n_layers)
    P = sum(int(np.prod(s)) for _, s in named_params(param_shapes(cfg)))
    trainable = P if lora is None else sum(a.size for _, a in named_params(lora.adapters))

    qkv = (H + 2 * G) * D
    mlp = 0 if cfg.mlp == "none" else 3 * F if cfg.mlp == "swiglu" else 2 * F
    norms = 4 * d if cfg.mlp != "none" else 2 * d
    per_layer = norms + qkv + H * D + mlp  # numbers per token
    kept = N * (4 * d + (L * per_layer if not checkpoint else L * d)) * b
    recomputed = N * per_layer * b if checkpoint else 0
    attention = 2 * int(batch) * H * int(seq) ** 2 * b + (H // G) * int(seq) ** 2 \
        + 6 * N * H * D * b
    transient = max(attention, 6 * N * F * b)
    head = min(S, LOSS_ROWS) * V * b  # only supervised rows reach the head
    if S > LOSS_ROWS and lora is None:
        head += min(V, VOCAB_SLICE) * d * b
    share = -(-trainable // dp)  # the trainable numbers in one rank's 1/dp
    grads = (share if zero >= 2 else trainable) * b
    peak = max(kept + head + (0 if lora is not None else V * d * b),
               kept + recomputed + transient + grads)
    ledger = {"params": (P - trainable + share if zero == 3 else P) * b, "grads": grads,
              "optimizer": OPTIMIZERS[optimizer] * (share if zero >= 1 else trainable) * b,
              "activations": peak - grads}
    ledger["total"] = sum(ledger.values())
    return ledger
