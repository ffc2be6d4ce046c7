"""Model-level benchmarks: forward tokens/s (and PyTorch eager beside it), KV-cache decode, memory."""
from __future__ import annotations

import time

import numpy as np

from transformer_lab import (KVCache, forward, init_params, llama_config, map_params, named_params,
                             pack_weights, param_shapes)

from transformer_lab.measure import peak_rss_bytes
from transformer_lab.measure import time_call as measure
from transformer_lab.measure import time_side_by_side as measure_side_by_side

from .machine import blas_threads

# The mid-size float32 model: d_ff = 8/3 * d rounded up to a multiple of 64, Llama's rule;
# a Llama-sized vocabulary. max_seq leaves room for a 2048-token context plus new tokens.
MID_SIZE = dict(vocab=32000, d_model=512, n_heads=8, n_kv_heads=2, n_layers=6, d_ff=1408,
                max_seq=4096)


def mid_config(**overrides):
    """The mid-size Llama-style float32 config (RMSNorm, SwiGLU, RoPE, GQA)."""
    return llama_config(**{**MID_SIZE, "dtype": np.float32, **overrides})


def describe_config(cfg):
    return {"vocab": cfg.vocab, "d_model": cfg.d_model, "n_heads": cfg.n_heads,
            "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "n_layers": cfg.n_layers,
            "d_ff": cfg.d_ff, "max_seq": cfg.max_seq, "norm": cfg.norm, "mlp": cfg.mlp,
            "pos": cfg.pos, "dtype": cfg.dtype.name,
            "params": int(sum(np.prod(s) for s in _leaf_shapes(cfg)))}


def _leaf_shapes(cfg):
    return [shape for _, shape in named_params(param_shapes(cfg))]


def _tokens(cfg, B, T, seed=1):
    return np.random.default_rng(seed).integers(0, cfg.vocab, size=(B, T))


def _load_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    from . import torch_ref
    return torch_ref


def run_forward(cfg, params, *, B=4, T=512, repeats=5, use_torch=True):
    """tokens/s of forward() on [B, T]; with PyTorch installed, the same model in torch eager too."""
    tokens = _tokens(cfg, B, T)
    threads, source = blas_threads()
    result = {"config": describe_config(cfg), "B": B, "T": T, "blas_threads": threads,
              "timing": f"best of {repeats} after a warm-up"}
    torch_ref = _load_torch() if use_torch else None
    # The same weights packed as load_gguf packs a model (params.pack_weights: packed Q/K/V
    # and gate/up, each matrix with its longer side contiguous), the form inference runs.
    packed = pack_weights(map_params(np.copy, params), cfg)
    fns = {"numpy": lambda: forward(params, cfg, tokens),
           "numpy_packed": lambda: forward(packed, cfg, tokens)}
    if torch_ref is None:
        result["torch"] = None
        result["torch_skipped"] = ("PyTorch is not installed" if use_torch
                                   else "PyTorch comparison turned off")
    elif not torch_ref.supports(cfg):
        torch_ref, result["torch"] = None, None
        result["torch_skipped"] = "config outside what the PyTorch reference covers"
    else:
        import torch
        model = torch_ref.TorchModel(params, cfg, threads=threads)
        ours, theirs = forward(params, cfg, tokens), model.forward(tokens)
        diff = float(np.max(np.abs(ours.astype(np.float64) - theirs)))
        scale = float(np.max(np.abs(theirs)))
        result["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                           "threads_set_from": source,
                           "logits_max_abs_diff": diff, "logits_max_abs": scale,
                           "logits_agree": bool(diff <= 1e-3 * scale + 1e-6),
                           "agreement_rule": "max |diff| <= 1e-3 * max |logits| + 1e-6"}
        fns["torch"] = lambda: model.forward(tokens)
        result["timing"] += "; numpy and torch measured round-robin"
    timed = measure_side_by_side(fns, repeats=repeats, warmup=1)
    for name in ("numpy", "numpy_packed"):
        result[name] = {**timed[name], "tokens_per_s": B * T / timed[name]["best_s"]}
    if "torch" in timed:
        result["torch"].update(timed["torch"], tokens_per_s=B * T / timed["torch"]["best_s"])
        result["numpy_over_torch_time"] = timed["numpy"]["best_s"] / timed["torch"]["best_s"]
        result["packed_over_torch_time"] = (timed["numpy_packed"]["best_s"]
                                            / timed["torch"]["best_s"])
    return result


def run_decode(cfg, params, *, contexts=(128, 512, 2048), repeats_cached=20, repeats_recompute=3):
    """ms per generated token at each context, B = 1: with a filled KVCache, and recomputing the prefix.

    Cached: forward() of 1 token with a KVCache that already holds `context` tokens
    (its length is set back to `context` before each call). Recompute: forward() of
    the context + 1 tokens with no cache.
    """
    rss_before = peak_rss_bytes()
    rows = []
    for context in contexts:
        tokens = _tokens(cfg, 1, context + 1, seed=context)
        prompt, nxt = tokens[:, :context], tokens[:, context:]
        cache = KVCache(cfg, 1, context + 1)
        forward(params, cfg, prompt, cache=cache)  # prefill

        def cached_step():
            cache.truncate(context)
            return forward(params, cfg, nxt, cache=cache)

        cached = measure(cached_step, repeats=repeats_cached, warmup=2)
        recompute = measure(lambda: forward(params, cfg, tokens), repeats=repeats_recompute,
                            warmup=1)
        # The cached step's last logits must match the recomputed ones.
        cache.truncate(context)
        diff = float(np.max(np.abs(cached_step()[:, -1] - forward(params, cfg, tokens)[:, -1])))
        rows.append({"context": context,
                     "cached_ms": cached["best_s"] * 1e3, "cached_median_ms": cached["median_s"] * 1e3,
                     "recompute_ms": recompute["best_s"] * 1e3,
                     "recompute_median_ms": recompute["median_s"] * 1e3,
                     "speedup": recompute["best_s"] / cached["best_s"],
                     "cached_spread": cached["spread"], "cached_waited": cached["waited"],
                     "cached_steady": cached["steady"],
                     "recompute_spread": recompute["spread"],
                     "recompute_waited": recompute["waited"],
                     "recompute_steady": recompute["steady"],
                     "cached_vs_recompute_max_abs_diff": diff})
    result = {"config": describe_config(cfg), "B": 1, "rows": rows,
              "timing": f"best of {repeats_cached} (cached) / {repeats_recompute} (recompute) "
                        "after a warm-up"}
    contexts_arr = np.array([r["context"] for r in rows], dtype=np.float64)
    cached_ms = np.array([r["cached_ms"] for r in rows])
    if len(rows) >= 2:
        slope, intercept = np.polyfit(contexts_arr, cached_ms, 1)
        result["fit"] = {"slope_ms_per_1k_context": float(slope) * 1e3,
                         "intercept_ms": float(intercept),
                         "method": "np.polyfit(context, cached ms, 1) over all contexts"}
    if len(rows) >= 3:
        # Linear or better: the largest context must not sit above the line through the
        # first two (slope floored at 0) by more than 15 %, which leaves room for noise.
        c0, c1, cn = contexts_arr[0], contexts_arr[1], contexts_arr[-1]
        slope01 = max(0.0, (cached_ms[1] - cached_ms[0]) / (c1 - c0))
        predicted = cached_ms[0] + slope01 * (cn - c0)
        result["linearity"] = {"predicted_ms_at_largest": float(predicted),
                               "measured_ms_at_largest": float(cached_ms[-1]),
                               "ratio": float(cached_ms[-1] / predicted),
                               "rule": "measured <= 1.15 x the line through the first two contexts"}
    result["peak_rss_bytes_before"] = rss_before
    result["peak_rss_bytes_after"] = peak_rss_bytes()
    return result


def memory_report(cfg, decode=None):
    """KV-cache bytes per token (2 * layers * G * D * itemsize) and the decode run's peak RSS."""
    per_token = KVCache(cfg, 1, 1).bytes_per_token()
    formula = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * cfg.dtype.itemsize
    out = {"kv_bytes_per_token": per_token, "kv_bytes_per_token_formula": formula,
           "formula": f"2 * {cfg.n_layers} layers * {cfg.n_kv_heads} K/V heads * "
                      f"{cfg.head_dim} head_dim * {cfg.dtype.itemsize} bytes",
           "params_bytes": describe_config(cfg)["params"] * cfg.dtype.itemsize}
    if decode:
        out["kv_bytes_at_context"] = {str(r["context"]): per_token * r["context"]
                                      for r in decode["rows"]}
        out["peak_rss_bytes_decode"] = decode["peak_rss_bytes_after"]
        out["peak_rss_bytes_before_decode"] = decode["peak_rss_bytes_before"]
        out["peak_rss_note"] = ("ru_maxrss is the whole process's peak so far: it includes "
                                "the parameters, the earlier sections and the recompute runs")
    return out


def make_params(cfg, seed=0):
    return init_params(cfg, seed=seed)


# ---------------------------------------------------------------- SmolLM2 at batch 1

DECODE_QUESTION = "Explain in three sentences why the sky is blue."


def run_smollm2_decode(*, new_tokens=32, rounds=5, use_hf=True, threads=None, profile_steps=20):
    """SmolLM2-135M greedy decode at batch 1: tokens/s of the decode steps (the prefill
    left out) for the packed params load_gguf gives (params.packed_order), the same weights
    as plain row-major [in, out] arrays, and HF transformers on the same GGUF (where torch
    and transformers are installed), one round of each in turn; and the read bound: the
    params' bytes per token at the best read bandwidth measured beside the rounds; and
    where one packed decode step's time goes (op_profile over `profile_steps` steps, 0:
    not run). None without the model."""
    from transformer_lab import generate_stream
    from transformer_lab.measure import bandwidth_matrix, param_bytes, read_bandwidth
    from transformer_lab.pretrained.chat_template import encode_chat
    from transformer_lab.pretrained.gguf import find_model, load_gguf
    try:
        path = find_model()
        cfg, packed, tokenizer = load_gguf(path)
    except (FileNotFoundError, ImportError, ValueError) as exc:
        return {"skipped": str(exc).splitlines()[0]}
    threads = threads or blas_threads()[0]
    prompt = encode_chat(tokenizer, [{"role": "user", "content": DECODE_QUESTION}])
    variants = {"packed": packed, "plain": map_params(np.ascontiguousarray, packed)}

    def ours(params):
        def run():
            stamps = []
            for token in generate_stream(params, cfg, np.array([prompt]), new_tokens, greedy=True):
                stamps.append((time.perf_counter(), int(token[0])))
            return stamps
        return run
    runs = {name: ours(p) for name, p in variants.items()}
    hf = _hf_decoder(path, prompt, new_tokens, threads) if use_hf else None
    if hf is not None:
        runs["hf"] = hf
    per_token = {name: [] for name in runs}
    tokens = {}
    # The read bandwidth is taken in every round, beside the decode runs: on a shared VM it
    # moves by 1.5x between minutes, so one reading after the runs may be taken at another
    # speed than theirs. The bound is the best of them, the machine at its fastest.
    matrix, bandwidths = bandwidth_matrix(), []
    for _ in range(rounds + 1):  # the first round warms up
        for name, run in runs.items():
            stamps = run()
            per_token[name].append((stamps[-1][0] - stamps[0][0]) / (len(stamps) - 1))
            tokens[name] = [t for _, t in stamps]
        bandwidths.append(read_bandwidth(matrix=matrix, repeats=3)["bytes_per_s"])
    del matrix
    nbytes = param_bytes(packed)
    tps = {name: 1.0 / float(np.median(v[1:])) for name, v in per_token.items()}
    bound = max(bandwidths[1:]) / nbytes
    result = {"new_tokens": new_tokens, "rounds": rounds, "threads": threads,
              "prompt_tokens": len(prompt), "tokens_per_s": tps,
              "step_ms_rounds": {k: [s * 1e3 for s in v[1:]] for k, v in per_token.items()},
              "param_bytes": nbytes, "read_bytes_per_s": max(bandwidths[1:]),
              "read_bytes_per_s_rounds": bandwidths[1:],
              "read_bound_tokens_per_s": bound,
              "of_read_bound": tps["packed"] / bound,
              "same_tokens": {k: tokens[k] == tokens["packed"] for k in tokens}}
    if "hf" in tps:
        result["vs_hf"] = tps["packed"] / tps["hf"]
    if profile_steps:
        result["step_profile"] = _decode_step_profile(cfg, packed, prompt, tokens["packed"][0],
                                                      profile_steps)
    return result


def _decode_step_profile(cfg, params, prompt, token, steps):
    """op_profile of one decode step: `token` after the prompt, the cache rolled back to the
    prompt before each step."""
    from .op_profile import op_profile
    cache = KVCache(cfg, 1, len(prompt) + 1)
    forward(params, cfg, np.array([prompt]), cache=cache, check=False)
    step_tokens = np.array([[token]])

    def step():
        cache.truncate(len(prompt))
        return forward(params, cfg, step_tokens, cache=cache, check=False)
    return op_profile(step, steps)


def _hf_decoder(path, prompt, new_tokens, threads):
    """A function running HF transformers' greedy generate on the GGUF, returning
    (time, token) after each new token; None without torch and transformers."""
    try:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        from .torch_ref import hf_model_from_gguf
    except ImportError:
        return None
    model = hf_model_from_gguf(path, threads)
    ids = torch.tensor([prompt])

    class Stamp(StoppingCriteria):
        def __init__(self):
            self.stamps = []

        def __call__(self, input_ids, scores, **kwargs):
            self.stamps.append((time.perf_counter(), int(input_ids[0, -1])))
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    def run():
        stamp = Stamp()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                           stopping_criteria=StoppingCriteriaList([stamp]),
                           pad_token_id=model.config.eos_token_id)
        return stamp.stamps
    return run
