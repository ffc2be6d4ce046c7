"""Weight quantization of a whole model: group-wise round to nearest (RTN), AWQ's
activation-aware scales, and GGUF's block formats (pretrained/quants.py), over the
[in, out] params.

`fake_quant` is llm-awq's pseudo_quantize_tensor: round to nearest on a grid of 2^bits
levels per group of `group_size` input rows, computed in float and given back in
float ("fake": the model runs the dequantized values). `awq_scales` searches AWQ's
per-input-channel scale, and `quantize_model` applies any of these to a whole model and
reports the bytes it would take.
"""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from ..acts import ActivationRecord
from ..model import check_tokens, forward
from ..params import check_params, map_params, pack_weights
from ..precision import round_to
from ..pretrained.quants import (BLOCK, BLOCK_BYTES, KINDS, dequantize, dequantize_transposed,
                                 quantize)
from ..validate import check_int


# ---------------------------------------------------------------- group-wise RTN and AWQ

def _check_grid(w, bits, group_size, who):
    """w as a float32 [in, out] matrix; bits and the group size checked."""
    bits = check_int(bits, f"{who}: bits", low=2, high=8)
    w = np.asarray(w)
    if w.ndim != 2 or not np.issubdtype(w.dtype, np.floating):
        raise ValueError(f"{who}: w must be a float [in, out] matrix, got shape {w.shape} "
                         f"dtype {w.dtype}")
    group_size = check_int(group_size, f"{who}: group_size", low=1)
    if w.shape[0] % group_size:
        raise ValueError(f"{who}: the input dimension {w.shape[0]} is not a multiple of "
                         f"group_size {group_size}")
    return w.astype(np.float32, copy=False), bits, group_size


def fake_quant(w, bits, group_size=128, symmetric=False):
    """w [in, out] rounded to nearest on 2^bits levels per group of `group_size` input rows
    of each output column, float32 out: llm-awq's pseudo_quantize_tensor (which groups a
    torch [out, in] weight along its last axis, the same input dimension).

    Asymmetric (AWQ's default): levels 0 .. 2^bits - 1 between each group's min and max,
    with an integer zero point. Symmetric: levels -2^(bits-1) .. 2^(bits-1) - 1 scaled by
    the group's largest magnitude. Halves round to even, as torch.round does."""
    w, bits, group_size = _check_grid(w, bits, group_size, "fake_quant")
    n_in, n_out = w.shape
    g = w.reshape(n_in // group_size, group_size, n_out)  # [groups, group_size, out]
    floor = np.float32(1e-5)  # llm-awq's clamp: a constant group gets a tiny, finite scale
    if symmetric:
        lo, hi = -2 ** (bits - 1), 2 ** (bits - 1) - 1
        scale = np.maximum(np.abs(g).max(axis=1, keepdims=True), floor) / np.float32(hi)
        zero = np.float32(0)
    else:
        lo, hi = 0, 2 ** bits - 1
        low = g.min(axis=1, keepdims=True)  # [groups, 1, out]
        scale = np.maximum(g.max(axis=1, keepdims=True) - low, floor) / np.float32(hi)
        zero = np.clip(-np.rint(low / scale), lo, hi)
    q = g / scale  # one new array, then rounded, clipped and scaled back in place
    np.rint(q, out=q)
    q += zero
    np.clip(q, lo, hi, out=q)  # the integers, as floats
    q -= zero
    q *= scale
    return q.reshape(n_in, n_out)


def group_bits(bits, group_size, symmetric=False) -> float:
    """Bits per weight of the group-wise format: the codes, plus each group's float16 scale
    and (asymmetric) its zero point of `bits` bits, as AWQ's kernels store them."""
    return bits + (16 + (0 if symmetric else bits)) / group_size


def _tied_heads(x_absmean, heads, kv_heads):
    """For wo's input [H*D]: the mean over the H / G query heads that read the same value
    head, repeated for each: wv's column (g, i) feeds every head of group g at channel i,
    so one scale per (g, i) is all that can be folded into wv."""
    a = np.asarray(x_absmean, np.float32).reshape(kv_heads, heads // kv_heads, -1)  # [G, R, D]
    return np.broadcast_to(a.mean(axis=1, keepdims=True), a.shape).reshape(-1)


class ScaleSearch(NamedTuple):
    """awq_scales' answer: (scales [in], alpha, errors [grid]); .scales, .alpha, .errors."""
    scales: np.ndarray
    alpha: float
    errors: list


def awq_scales(w, x_absmean, bits, group_size=128, grid=20, x=None, symmetric=False):
    """AWQ's search (llm-awq auto_scale): the per-input-channel scale s = x_absmean^alpha,
    normalised by sqrt(max(s) * min(s)), for the alpha in 0, 1/grid, .. (grid-1)/grid whose
    scaled weight, rounded and scaled back, Q(w * s) / s, gives the smallest mean squared
    output error on the calibration inputs x [N, in]: mean((x @ w - x @ (Q(w * s) / s))^2).

    Salient input channels (large mean |x|) get large s, so their weights land on a finer
    grid relative to their size. Without x, the error is weighted per input channel by
    x_absmean^2 (as if the channels were independent). w may be several matrices that read
    the same input side by side ([d, q | k | v]): one scale for all, as AWQ does. llm-awq
    measures the error after the whole attention or MLP module; here it is this product's.
    The model keeps its function when 1/s is folded into the op before (quantize_model)."""
    w, bits, group_size = _check_grid(w, bits, group_size, "awq_scales")
    grid = check_int(grid, "awq_scales: grid", low=1)
    a = np.asarray(x_absmean, np.float32)
    if a.shape != (w.shape[0],) or not np.isfinite(a).all() or (a < 0).any():
        raise ValueError(f"awq_scales: x_absmean must be {w.shape[0]} finite values >= 0 "
                         f"(one per input channel), got shape {a.shape}")
    if x is not None:
        x = np.asarray(x, np.float32).reshape(-1, w.shape[0])  # [N, in]
    errors, best = [], None
    for step in range(grid):
        alpha = step / grid
        s = np.maximum(a ** np.float32(alpha), np.float32(1e-4))
        s = s / np.sqrt(s.max() * s.min())
        diff = fake_quant(w * s[:, None], bits, group_size, symmetric)
        diff /= s[:, None]
        np.subtract(w, diff, out=diff)  # w - Q(w * s) / s: [in, out]
        err = (float(np.mean(np.square(x @ diff))) if x is not None else
               float(np.square(a) @ np.square(diff).sum(axis=1)) / (w.shape[0] * w.shape[1]))
        errors.append(err)
        if best is None or err < errors[best[0]]:
            best = (step, s)
    return ScaleSearch(best[1].astype(np.float32), best[0] / grid, errors)


# ---------------------------------------------------------------- a whole model

FLOAT_KINDS = {"float32": 4.0, "bf16": 2.0}  # bytes per weight of every tensor
GROUP_KIND = re.compile(r"(awq_)?w([0-9]+)_g([0-9]+)")
# The token table (and an untied head) are kept at Q8_0 when the blocks are quantized, as
# in SmolLM2's shipped Q4_1 file: a smaller head costs the most quality per byte saved.
TABLE_KIND = "q8_0"


def _parse_kind(kind):
    """(what, bits, group_size): what is "float", "gguf", "rtn" or "awq"."""
    if isinstance(kind, str) and kind in FLOAT_KINDS:
        return "float", None, None
    if isinstance(kind, str) and kind.lower() in KINDS:
        return "gguf", None, None
    match = GROUP_KIND.fullmatch(kind) if isinstance(kind, str) else None
    if match is None:
        raise ValueError(f"quantize_model: unknown kind {kind!r}; choose from float32, bf16, "
                         f"{', '.join(KINDS)}, w<bits>_g<group> (round to nearest) or "
                         f"awq_w<bits>_g<group> (e.g. awq_w4_g128)")
    bits = check_int(int(match[2]), "quantize_model: bits", low=2, high=8)
    return ("awq" if match[1] else "rtn"), bits, int(match[3])


def _linear_names(cfg):
    """(group, key) of each block matrix, in the order a layer reads them."""
    names = [("attn", "wq"), ("attn", "wk"), ("attn", "wv"), ("attn", "wo")]
    if cfg.mlp != "none":
        names += [("mlp", "w_gate")] if cfg.mlp == "swiglu" else []
        names += [("mlp", "w_up"), ("mlp", "w_down")]
    return names


def _awq_fold(params, cfg, calibration, bits, group_size):
    """A float copy of the blocks with AWQ's scales applied: each searched scale multiplies
    the rows of the matrices that read the input and 1/s is folded into the op before (the
    RMSNorm gain for q/k/v and for gate/up, wv's columns for wo, w_up's columns for w_down),
    so the model's function is unchanged until the weights are rounded. The searches all
    read the float model's activations, as llm-awq's do. Returns (blocks, alphas)."""
    if not (cfg.attention != "mla" and cfg.norm == "rms" and cfg.mlp == "swiglu"
            and not cfg.bias):
        raise ValueError("quantize_model: AWQ is implemented for llama-style models (RMSNorm, "
                         "SwiGLU, standard attention, no biases)")
    if calibration is None:
        raise ValueError("quantize_model: an awq kind needs calibration tokens [B, T]")
    tokens = check_tokens(calibration, cfg)
    acts = ActivationRecord()
    forward(params, cfg, tokens, acts=acts)
    H, G = cfg.n_heads, cfg.n_kv_heads
    blocks, alphas = [], []
    for i, p in enumerate(params["blocks"]):
        a = {k: np.array(v, np.float32) for k, v in p["attn"].items()}
        m = {k: np.array(v, np.float32) for k, v in p["mlp"].items()}
        attn_gain = np.array(p["attn_norm"]["weight"], np.float32)
        mlp_gain = np.array(p["mlp_norm"]["weight"], np.float32)

        def search(w, name, tie=False):
            x = acts[f"blocks[{i}].{name}"].reshape(-1, w.shape[0])  # [N, in]
            absmean = np.abs(x).mean(axis=0)
            if tie:
                absmean = _tied_heads(absmean, H, G)
            return awq_scales(w, absmean, bits, group_size, x=x)

        qkv = search(np.concatenate([a["wq"], a["wk"], a["wv"]], axis=1), "attn_in")
        o = search(a["wo"], "attn.out", tie=True)
        gate_up = search(np.concatenate([m["w_gate"], m["w_up"]], axis=1), "mlp_in")
        down = search(m["w_down"], "mlp.hidden")
        for key in ("wq", "wk", "wv"):
            a[key] *= qkv.scales[:, None]
        attn_gain /= qkv.scales
        a["wo"] *= o.scales[:, None]
        a["wv"] /= o.scales.reshape(G, H // G, -1)[:, 0].reshape(-1)  # one per (g, i)
        for key in ("w_gate", "w_up"):
            m[key] *= gate_up.scales[:, None]
        mlp_gain /= gate_up.scales
        m["w_down"] *= down.scales[:, None]
        m["w_up"] /= down.scales
        blocks.append({"attn_norm": {"weight": attn_gain}, "attn": a,
                       "mlp_norm": {"weight": mlp_gain}, "mlp": m})
        alphas.append({"qkv": qkv.alpha, "o": o.alpha, "gate_up": gate_up.alpha,
                       "down": down.alpha})
    return blocks, alphas


def quantize_model(params, cfg, kind, calibration=None):
    """(params_q, report): the model with every block matrix stored in `kind` and given
    back dequantized (cfg's dtype), so forward runs it as it is, packed as the loader packs.

    kind: "float32" or "bf16" (every tensor in that format); "q8_0", "q4_0", "q4_1"
    (GGUF's blocks of 32 along each matrix's input dimension, byte for byte as llama.cpp
    makes them); "w<bits>_g<group>" (round to nearest per group, fake_quant) or
    "awq_w<bits>_g<group>" (the same after AWQ's scale search on `calibration`, token ids
    [B, T]). Block matrices only: norms stay float32, and the token table (and an untied
    head) Q8_0 when the blocks are quantized (TABLE_KIND), as in SmolLM2's shipped file.

    report: "kind", "params" (weights counted), "bytes" (as stored), "bytes_per_weight",
    "bytes_per_token" (what one decode step reads: every weight once, the tied table as
    the head, one row of an untied table; not the KV cache), "linear_bits" (bits per weight
    of the block matrices) and, for AWQ, "alphas" (each layer's searched exponents)."""
    what, bits, group_size = _parse_kind(kind)
    check_params(params, cfg)
    if calibration is not None and what != "awq":
        raise ValueError(f"quantize_model: calibration is used only by the awq kinds, not {kind!r}")
    if what != "float" and cfg.attention == "mla":
        raise ValueError("quantize_model: the block formats are implemented for standard "
                         "attention, not MLA")
    linears = {(i, g, k) for i in range(cfg.n_layers) for g, k in _linear_names(cfg)}
    if what == "float":
        linear_bytes = table_bytes = other_bytes = FLOAT_KINDS[kind]
        store = (lambda w, is_linear: w) if kind == "float32" else (lambda w, is_linear: round_to(w, "bf16"))
    else:
        linear_bytes = (BLOCK_BYTES[kind.upper()] / BLOCK if what == "gguf"
                        else group_bits(bits, group_size) / 8)
        table_bytes, other_bytes = BLOCK_BYTES[TABLE_KIND.upper()] / BLOCK, 4.0

        def store(w, is_linear):
            if w.ndim != 2:
                return w
            if not is_linear:  # the token table [vocab, d] or head [d, vocab]: rows along d
                table = w if w.shape[0] == cfg.vocab else w.T
                back = dequantize(quantize(table, TABLE_KIND), TABLE_KIND, table.shape)
                return back if table is w else back.T
            if what == "gguf":  # through `kind` as GGUF stores it ([out, in] rows), back [in, out]
                return dequantize_transposed(quantize(w.T, kind), kind,
                                             np.empty(w.shape, np.float32))
            return fake_quant(w, bits, group_size)
    for i, g, k in sorted(linears):  # the first bad shape, said once, before any work
        w = params["blocks"][i][g][k]
        if what in ("rtn", "awq"):
            _check_grid(w, bits, group_size, "quantize_model")
        elif what == "gguf" and w.shape[0] % BLOCK:
            raise ValueError(f"quantize_model: blocks[{i}].{g}.{k}'s input dimension "
                             f"{w.shape[0]} is not a multiple of {BLOCK} (GGUF's block)")
    alphas, source = None, params
    if what == "awq":
        blocks, alphas = _awq_fold(params, cfg, calibration, bits, group_size)
        source = {**params, "blocks": blocks}

    counted = {"params": 0, "bytes": 0.0, "per_token": 0.0}

    def one(name, w):
        w = np.asarray(w, np.float32)
        layer = re.fullmatch(r"blocks\[(\d+)\]\.(\w+)\.(\w+)", name)
        is_linear = bool(layer) and (int(layer[1]), layer[2], layer[3]) in linears
        per = (linear_bytes if is_linear else
               table_bytes if name in ("tok_emb", "lm_head.w") else other_bytes)
        counted["params"] += w.size
        counted["bytes"] += w.size * per
        # A decode step reads one row of an untied token table, all of everything else.
        untied_table = name == "tok_emb" and not cfg.tie_embeddings
        counted["per_token"] += (w.shape[1] if untied_table else w.size) * per
        return np.ascontiguousarray(store(w, is_linear), dtype=cfg.dtype)

    params_q = pack_weights(map_params(one, source, names=True), cfg)
    report = {"kind": kind, "params": counted["params"], "bytes": counted["bytes"],
              "bytes_per_weight": counted["bytes"] / counted["params"],
              "bytes_per_token": counted["per_token"], "linear_bits": linear_bytes * 8}
    if alphas is not None:
        report["alphas"] = alphas
    return params_q, report
