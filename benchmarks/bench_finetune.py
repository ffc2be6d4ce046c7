"""Fine-tuning SmolLM2-135M: a full step and a LoRA step in NumPy beside PyTorch eager, the
AdamW update beside one bare pass over its arrays, and the memory ledger beside tracemalloc.

A full step = loss_and_grads + AdamW.step (float32, no clipping); PyTorch runs the same
(autograd + torch.optim.AdamW) on copies of the same weights with the same threads. The
LoRA step trains rank-8 adapters on every linear layer. Needs the installed model.
"""
from __future__ import annotations

import numpy as np

from transformer_lab import AdamW, loss_and_grads, named_params
from transformer_lab.measure import peak_traced_bytes, time_side_by_side, training_memory
from transformer_lab.training import LoRA

from .bench_model import _load_torch
from .bench_train import copy_tree
from .machine import blas_threads

B, T = 2, 96
RANK = 8


def _tokens(cfg, B, T, seed=5):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab, size=(B, T))
    targets = np.roll(tokens, -1, axis=1)
    targets[:, -1] = -1
    return tokens, targets


def _bare_pass(p, g, m, v):
    """One read of p, g, m, v and one write of p, m, v, in AdamW's blocks: the least memory
    traffic an update can have (m += g, v += g, p += g), the yardstick for AdamW.step."""
    from transformer_lab.training.optim import _blocks
    for pb, gb, mb, vb in _blocks(p, g, m, v):
        mb += gb
        vb += gb
        pb += gb


def run_finetune(*, repeats=3, use_torch=True, model=None, B=B, T=T):
    """The section's figures; model = (cfg, params, name) instead of SmolLM2 (for tests)."""
    if model is None:
        try:
            from transformer_lab import find_model, load_gguf
            path = find_model()
        except (ImportError, FileNotFoundError) as exc:
            return {"skipped": f"needs the gguf package and SmolLM2 ({exc})"}
        cfg, params, _ = load_gguf(path)
        name = path.name
    else:
        cfg, params, name = model
    tokens, targets = _tokens(cfg, B, T)
    threads, _ = blas_threads()
    result = {"model": name, "B": B, "T": T,
              "rank": RANK, "blas_threads": threads,
              "timing": f"best of {repeats} after a warm-up, round-robin"}

    work = copy_tree(params)  # the full step trains its own copy
    opt = AdamW(work, lr=1e-5)
    lora = LoRA.init(params, cfg, rank=RANK, alpha=2 * RANK, targets=LoRA.ALL_LINEAR)
    lora_opt = AdamW(lora.adapters, lr=2e-4)
    grads_box = {}

    def full_grads():
        grads_box["full"] = loss_and_grads(work, cfg, tokens, targets)[1]

    def full_step():
        _, grads = loss_and_grads(work, cfg, tokens, targets)
        opt.step(grads)

    def lora_step():
        _, grads = loss_and_grads(params, cfg, tokens, targets, lora=lora)
        lora_opt.step(grads)

    full_grads()
    by_name = dict(named_params(grads_box["full"]))
    leaves = [(np.zeros_like(p), by_name[n], np.zeros_like(p), np.zeros_like(p))
              for n, p in named_params(work)]
    fns = {"full": full_step, "lora": lora_step,
           "grads": full_grads, "adamw": lambda: opt.step(grads_box["full"]),
           "bare": lambda: [_bare_pass(*a) for a in leaves]}
    torch_ref = _load_torch() if use_torch else None
    if torch_ref is not None and torch_ref.supports(cfg):
        import torch
        trainer = torch_ref.TorchTrainer(params, cfg, lr=1e-5, betas=(0.9, 0.999),
                                         weight_decay=0.01, threads=threads)
        fns["torch"] = lambda: trainer.step(tokens, targets, clip=False)
        result["torch_version"] = torch.__version__
    else:
        result["torch_skipped"] = "PyTorch is not installed" if use_torch else "turned off"
    timed = time_side_by_side(fns, repeats=repeats, warmup=1)
    del leaves
    for name, t in timed.items():
        result[name] = {**t, "tokens_per_s": B * T / t["best_s"]}
    if "torch" in timed:
        result["full_over_torch"] = timed["full"]["best_s"] / timed["torch"]["best_s"]
    result["lora_over_full"] = timed["lora"]["best_s"] / timed["full"]["best_s"]
    result["adamw_over_bare"] = timed["adamw"]["best_s"] / timed["bare"]["best_s"]
    result["params"] = sum(a.size for _, a in named_params(params))
    result["lora_params"] = lora.n_params()

    ledger = []
    for use_lora in (False, True):
        for checkpoint in (False, True):
            adapters = lora if use_lora else None
            predicted = training_memory(cfg, B, T, lora=adapters, checkpoint=checkpoint,
                                        supervised=int((targets >= 0).sum()))
            _, peak = peak_traced_bytes(lambda: loss_and_grads(
                params, cfg, tokens, targets, lora=adapters, checkpoint=checkpoint))
            ledger.append({"lora": use_lora, "checkpoint": checkpoint, **predicted,
                           "traced_peak": peak})
    result["ledger"] = ledger
    return result


def print_finetune(out, r):
    out.header(f"Fine-tuning {r.get('model', 'SmolLM2')} (B={r.get('B')}, T={r.get('T')}, "
               f"float32)")
    if "skipped" in r:
        out.observations([f"Skipped: {r['skipped']}."])
        return
    rows = [["transformer_lab full (loss_and_grads + AdamW.step)", out.time(r["full"]["best_s"]),
             out.num(r["full"]["tokens_per_s"]), "1.00x"]]
    if "torch" in r:
        rows.append([f"PyTorch {r['torch_version']} eager + torch.optim.AdamW",
                     out.time(r["torch"]["best_s"]), out.num(r["torch"]["tokens_per_s"]),
                     f"{r['full_over_torch']:.2f}x"])
    rows.append([f"transformer_lab LoRA r={r['rank']}, all linear layers",
                 out.time(r["lora"]["best_s"]), out.num(r["lora"]["tokens_per_s"]),
                 f"{r['full']['best_s'] / r['lora']['best_s']:.2f}x"])
    rows.append(["  of the full step: loss_and_grads", out.time(r["grads"]["best_s"]), "", ""])
    rows.append(["  of the full step: AdamW.step", out.time(r["adamw"]["best_s"]), "", ""])
    rows.append(["  one bare read + write of AdamW's arrays", out.time(r["bare"]["best_s"]), "", ""])
    out.table(["step", "time", "tokens/s", "full / this"], rows,
              caption=f"{r['params']:,} params, {r['lora_params']:,} in the adapters. BLAS "
                      f"threads {r['blas_threads']}. Timing: {r['timing']}.")
    mib = lambda b: f"{b / 2**20:,.1f}"  # noqa: E731
    lrows = [[("LoRA" if e["lora"] else "full") + (" + ckpt" if e["checkpoint"] else ""),
              mib(e["params"]), mib(e["grads"]), mib(e["optimizer"]), mib(e["activations"]),
              mib(e["activations"] + e["grads"]), mib(e["traced_peak"]),
              f"{(e['activations'] + e['grads']) / e['traced_peak']:.2f}"]
             for e in r["ledger"]]
    out.table(["step", "params", "grads", "AdamW", "activations", "acts + grads",
               "traced peak", "ratio"], lrows,
              caption="MiB. ckpt: checkpoint=True. Predicted by measure.training_memory; traced "
                      "peak: tracemalloc during one loss_and_grads call, above what was held "
                      "before.")
    notes = [f"AdamW.step takes {r['adamw_over_bare']:.2f}x one bare pass over its four arrays.",
             f"A LoRA step takes {r['lora_over_full']:.2f} of a full step's time."]
    if "torch" in r:
        notes.insert(0, f"The full step takes {r['full_over_torch']:.2f}x PyTorch's "
                        f"(target at most 1.5x).")
    else:
        notes.insert(0, f"PyTorch row skipped: {r['torch_skipped']}.")
    out.observations(notes)
