"""Training-step benchmark: forward, backward and AdamW in NumPy, beside PyTorch eager.

One step = loss_and_grads, clip_grad_norm and AdamW.step, float32, on a
Llama-style model; PyTorch runs the same step (autograd, clip_grad_norm_,
torch.optim.AdamW) on copies of the same weights with the same threads.
"""
from __future__ import annotations

import numpy as np

from transformer_lab import (AdamW, clip_grad_norm, forward, init_params, llama_config,
                             loss_and_grads, named_params)
from transformer_lab.measure import matmul_peak, param_bytes, peak_traced_bytes
from transformer_lab.measure.flops import train_step_flops
from transformer_lab.measure import time_side_by_side as measure_side_by_side

from .bench_model import _load_torch, describe_config
from .machine import blas_threads

# d=256, 4 layers, 8 x 128 tokens: a model a student trains on 2 cores in minutes.
TRAIN_SIZE = dict(vocab=4096, d_model=256, n_heads=8, n_kv_heads=4, n_layers=4, d_ff=704,
                  max_seq=128)


def train_config(**overrides):
    return llama_config(**{**TRAIN_SIZE, "dtype": np.float32, **overrides})


def activation_bytes(params, cfg, tokens):
    """Bytes of the activation record one forward keeps for the backward (its arrays' nbytes)."""
    acts = {}
    forward(params, cfg, tokens, acts=acts)
    seen, total = set(), 0
    for value in acts.values():
        for a in (value if isinstance(value, (tuple, list)) else (value,)):
            if isinstance(a, np.ndarray) and id(a) not in seen:
                seen.add(id(a))
                total += a.nbytes
    return total, len(acts)


def peak_step_bytes(params, cfg, tokens, targets):
    """The most memory NumPy held at once during loss_and_grads, above what was held before
    (tracemalloc sees NumPy's array allocations): activations, gradients and temporaries."""
    return peak_traced_bytes(lambda: loss_and_grads(params, cfg, tokens, targets))[1]


def run_train(cfg, *, B=8, T=128, repeats=5, peak_n=2048, peak_repeats=5, use_torch=True):
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, cfg.vocab, size=(B, T))
    targets = np.roll(tokens, -1, axis=1)
    targets[:, -1] = -1
    params = init_params(cfg, seed=0)
    threads, source = blas_threads()
    result = {"config": describe_config(cfg), "B": B, "T": T, "blas_threads": threads,
              "timing": f"best of {repeats} after a warm-up"}

    torch_ref = _load_torch() if use_torch else None
    trainer = None
    if torch_ref is None:
        result["torch"] = None
        result["torch_skipped"] = ("PyTorch is not installed" if use_torch
                                   else "PyTorch comparison turned off")
    elif not torch_ref.supports(cfg):
        result["torch"] = None
        result["torch_skipped"] = "config outside what the PyTorch reference covers"
    else:
        import torch
        trainer = torch_ref.TorchTrainer(params, cfg, threads=threads)
        # The same weights give the same loss and gradients before anything is timed.
        loss, grads = loss_and_grads(params, cfg, tokens, targets)
        t_loss, t_grads = trainer.loss_and_grads(tokens, targets)
        worst = max(float(np.max(np.abs(g - t_grads[name])) / max(np.max(np.abs(t_grads[name])), 1e-30))
                    for name, g in named_params(grads))
        result["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                           "threads_set_from": source, "loss": t_loss,
                           "loss_abs_diff": abs(loss - t_loss),
                           "grads_max_rel_diff": worst,
                           "grads_agree": bool(worst <= 3e-3),
                           "agreement_rule": "per array, max |diff| / max |torch grad| <= 3e-3"}

    # The NumPy step trains its own copy, so both sides keep stepping from the same start.
    work = copy_tree(params)
    opt = AdamW(work, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

    def numpy_step():
        loss, grads = loss_and_grads(work, cfg, tokens, targets)
        clip_grad_norm(grads, 1.0)
        opt.step(grads)
        return loss

    fns = {"numpy": numpy_step}
    if trainer is not None:
        fns["torch"] = lambda: trainer.step(tokens, targets)
        result["timing"] += "; numpy and torch measured round-robin"
    timed = measure_side_by_side(fns, repeats=repeats, warmup=1)
    flops = train_step_flops(cfg, B, T)
    peak = matmul_peak(peak_n, repeats=peak_repeats)
    result["flops_per_step"] = flops
    result["flop_convention"] = ("matmuls only: 3 x forward (2 per weight per token for every "
                                 "projection and the head, plus 4*D per causal query-key pair "
                                 "per head)")
    result["matmul_peak"] = {"n": peak["n"], "gflops": peak["flops_per_s"] / 1e9}
    for name, t in timed.items():
        row = {**t, "tokens_per_s": B * T / t["best_s"], "gflops": flops / t["best_s"] / 1e9}
        row["fraction_of_peak"] = row["gflops"] * 1e9 / peak["flops_per_s"]
        if name == "numpy":
            result["numpy"] = row
        else:
            result["torch"].update(row)
    if trainer is not None:
        result["numpy_over_torch_time"] = timed["numpy"]["best_s"] / timed["torch"]["best_s"]

    acts, n_acts = activation_bytes(params, cfg, tokens)
    result["memory"] = {"activation_record_bytes": acts, "activation_record_arrays": n_acts,
                        "peak_step_bytes": peak_step_bytes(params, cfg, tokens, targets),
                        "params_bytes": param_bytes(params),
                        "peak_rule": "tracemalloc peak during loss_and_grads minus memory "
                                     "held before it (activations, grads, temporaries)"}
    return result


def copy_tree(node):
    if isinstance(node, dict):
        return {k: copy_tree(v) for k, v in node.items()}
    if isinstance(node, list):
        return [copy_tree(v) for v in node]
    return node.copy()
