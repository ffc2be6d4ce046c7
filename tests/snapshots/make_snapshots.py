"""Write the PyTorch reference snapshots that tests/core/test_snapshots.py compares against.

Run from the repo root, in an environment that has torch (CI does not need it):

    python tests/snapshots/make_snapshots.py

Every reference below is computed by PyTorch (the exact GELU also by mpmath), written here from scratch in
torch (the models) or taken from torch.nn.functional (the ops); only the
initial weights come from transformer_lab.init_params. Each .npz holds the
inputs and torch's outputs, in transformer_lab's layouts ([B, T, H, D] for
q, [B, S, G, D] for k/v, [B, T, H*D] for attention outputs, W [in, out] for
weights). Everything is float64 except the deliberately float32 cases, whose
keys end in "32". Seeds are fixed, so rerunning with the same torch rewrites
the same numbers.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import mpmath  # torch depends on it (through sympy): the exact GELU reference below
import numpy as np
import torch
import torch.nn.functional as F

import transformer_lab as tl

HERE = Path(__file__).resolve().parent
F64 = torch.float64


def t(a):
    """NumPy -> torch, keeping the dtype."""
    return torch.from_numpy(np.ascontiguousarray(a))


def n(x):
    """torch -> NumPy."""
    return x.detach().cpu().numpy()


def save(name, **arrays):
    path = HERE / f"{name}.npz"
    np.savez_compressed(path, **arrays)
    print(f"wrote {path.relative_to(HERE.parent.parent)} ({path.stat().st_size / 1024:.1f} KiB)")


# ---------------------------------------------------------------- norms

def make_norms():
    rng = np.random.default_rng(1001)
    d = 48
    x = rng.normal(0.5, 2.0, size=(2, 7, d))  # a non-zero mean, so centring matters
    ln_w = 1.0 + 0.3 * rng.normal(size=d)
    ln_b = 0.2 * rng.normal(size=d)
    rms_w = 1.0 + 0.3 * rng.normal(size=d)
    ln_eps, rms_eps = 1e-5, 1e-6
    ln_out = F.layer_norm(t(x), (d,), t(ln_w), t(ln_b), eps=ln_eps)
    if hasattr(F, "rms_norm"):
        rms_out = F.rms_norm(t(x), (d,), t(rms_w), eps=rms_eps)
    else:
        xt = t(x)
        rms_out = xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + rms_eps) * t(rms_w)
    # A float32 LayerNorm, to check the dtype is kept and the rounding is float32's.
    x32, w32, b32 = x.astype(np.float32), ln_w.astype(np.float32), ln_b.astype(np.float32)
    ln_out32 = F.layer_norm(t(x32), (d,), t(w32), t(b32), eps=ln_eps)
    save("norms", x=x, ln_weight=ln_w, ln_bias=ln_b, ln_eps=ln_eps, ln_out=n(ln_out),
         rms_weight=rms_w, rms_eps=rms_eps, rms_out=n(rms_out),
         x32=x32, ln_weight32=w32, ln_bias32=b32, ln_out32=n(ln_out32))


# ---------------------------------------------------------------- activations and MLP

def make_activations():
    rng = np.random.default_rng(1002)
    # A dense grid over [-10, 10] (both tails included) plus random points, some far out.
    x = np.concatenate([np.linspace(-10.0, 10.0, 1001), rng.normal(0.0, 3.0, size=300),
                        rng.uniform(-10.0, 10.0, size=100)])
    xt = t(x)
    gelu = F.gelu(xt)
    gelu_tanh = F.gelu(xt, approximate="tanh")
    x32 = x.astype(np.float32)
    gelu32 = F.gelu(t(x32))
    # torch's float64 GELU forms 1 + erf(x / sqrt 2), which cancels in the negative
    # tail; x * Phi(x) at 40 digits, rounded once, is the reference for relative error.
    with mpmath.workdps(40):
        gelu_exact = np.array([float(mpmath.mpf(v) * mpmath.ncdf(mpmath.mpf(v))) for v in x])

    # SwiGLU MLP: down(silu(x @ W_gate) * (x @ W_up)).
    d, f = 32, 64
    xm = rng.normal(size=(2, 8, d))
    w_gate = rng.normal(0.0, 1.0 / math.sqrt(d), size=(d, f))
    w_up = rng.normal(0.0, 1.0 / math.sqrt(d), size=(d, f))
    w_down = rng.normal(0.0, 1.0 / math.sqrt(f), size=(f, d))
    swiglu = (F.silu(t(xm) @ t(w_gate)) * (t(xm) @ t(w_up))) @ t(w_down)
    save("activations", x=x, gelu=n(gelu), gelu_exact=gelu_exact, gelu_tanh=n(gelu_tanh),
         x32=x32, gelu32=n(gelu32),
         mlp_x=xm, w_gate=w_gate, w_up=w_up, w_down=w_down, swiglu=n(swiglu))


# ---------------------------------------------------------------- attention

def torch_attention(q, k, v, offset):
    """Causal SDPA in torch from our layouts: q [B,T,H,D], k/v [B,S,G,D] -> [B,T,H*D]."""
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    qt = t(q).transpose(1, 2)  # [B, H, T, D]
    # Query head h reads K/V group h // (H // G): repeat each group H // G times in place.
    kt = t(k).transpose(1, 2).repeat_interleave(H // G, dim=1)  # [B, H, S, D]
    vt = t(v).transpose(1, 2).repeat_interleave(H // G, dim=1)
    if offset == 0 and S == T:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    else:
        # Query i sits at absolute position offset + i and sees keys 0..offset + i.
        mask = torch.arange(S)[None, :] <= (offset + torch.arange(T))[:, None]  # [T, S]
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
    return n(out.transpose(1, 2).reshape(B, T, H * D))  # head 0's D values first


def make_attention():
    rng = np.random.default_rng(1003)
    cases = {
        # name: (B, T, S, H, G, D, offset)
        "mha": (2, 9, 9, 4, 4, 8, 0),
        "gqa": (2, 10, 10, 8, 2, 8, 0),
        "offset": (2, 5, 12, 4, 2, 8, 7),
    }
    arrays = {}
    for name, (B, T, S, H, G, D, offset) in cases.items():
        # Spread of 1.5 so the softmax is far from uniform (scores of order several units).
        q = rng.normal(0.0, 1.5, size=(B, T, H, D))
        k = rng.normal(0.0, 1.5, size=(B, S, G, D))
        v = rng.normal(size=(B, S, G, D))
        arrays.update({f"{name}_q": q, f"{name}_k": k, f"{name}_v": v,
                       f"{name}_offset": offset, f"{name}_out": torch_attention(q, k, v, offset)})
    save("attention", **arrays)


# ---------------------------------------------------------------- RoPE

def torch_rope(x, positions, base=10000.0):
    """Rotate interleaved pairs (2i, 2i+1) of x [B,T,H,D] by pos * base^(-2i/D), as complex numbers."""
    D = x.shape[-1]
    xt = t(x)
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=F64) / D))  # [D/2]
    angle = torch.as_tensor(positions, dtype=F64)[:, None] * inv_freq[None, :]  # [T, D/2]
    rot = torch.polar(torch.ones_like(angle), angle)[:, None, :]  # [T, 1, D/2]
    z = torch.view_as_complex(xt.reshape(*xt.shape[:-1], D // 2, 2).contiguous())
    return n(torch.view_as_real(z * rot).reshape(xt.shape))


def make_rope():
    rng = np.random.default_rng(1004)
    B, T, H, D = 2, 8, 3, 16
    x = rng.normal(size=(B, T, H, D))
    pos_far = np.arange(10000, 10000 + T)
    pos_zero = np.arange(T)
    save("rope", x=x, base=10000.0, pos_far=pos_far, out_far=torch_rope(x, pos_far),
         pos_zero=pos_zero, out_zero=torch_rope(x, pos_zero))


# ---------------------------------------------------------------- whole models

def flatten(tree, prefix=""):
    """Nested params -> {"blocks.0.attn.wq": array, ...}."""
    flat = {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def perturbed_params(cfg, seed):
    """init_params' weights with norm gains, norm biases and biases made non-trivial.

    wq and wk are also scaled x8: at init std 0.02 every attention score is ~0.01
    and the softmax is almost uniform, which would hide head-order or mask mistakes.
    """
    params = tl.init_params(cfg, seed)
    rng = np.random.default_rng(seed + 500)
    flat = flatten(params)
    for key, value in flat.items():
        last = key.split(".")[-1]
        if last == "weight":  # norm gains
            flat[key] = value + 0.1 * rng.normal(size=value.shape)
        elif last == "bias" and "norm" in key:  # norm biases
            flat[key] = value + 0.1 * rng.normal(size=value.shape)
        elif last.startswith("b"):  # linear biases
            flat[key] = value + 0.02 * rng.normal(size=value.shape)
        elif last in ("wq", "wk"):
            flat[key] = value * 8.0
    return {k: v.astype(np.float64) for k, v in flat.items()}


class TorchModel:
    """A pre-norm decoder written directly in torch, reading the flat weights."""

    def __init__(self, flat, cfg):
        self.w = {k: t(v) for k, v in flat.items()}
        self.cfg = cfg

    def norm(self, x, prefix):
        c, w = self.cfg, self.w
        if c.norm == "layer":
            return F.layer_norm(x, (c.d_model,), w[f"{prefix}.weight"], w[f"{prefix}.bias"],
                                eps=c.norm_eps)
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps)
        return x / rms * w[f"{prefix}.weight"]

    def linear(self, x, weight, bias):
        y = x @ self.w[weight]
        return y + self.w[bias] if bias in self.w else y

    def rope(self, x, start):
        """Interleaved RoPE on x [B, T, heads, D] at positions start..start+T-1."""
        D, T = x.shape[-1], x.shape[1]
        inv_freq = 1.0 / (self.cfg.rope_base ** (torch.arange(0, D, 2, dtype=F64) / D))
        angle = torch.arange(start, start + T, dtype=F64)[:, None] * inv_freq[None, :]
        rot = torch.polar(torch.ones_like(angle), angle)[:, None, :]  # [T, 1, D/2]
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], D // 2, 2).contiguous())
        return torch.view_as_real(z * rot).reshape(x.shape)

    def attention(self, x, p):
        c = self.cfg
        B, T, _ = x.shape
        H, G, D = c.n_heads, c.n_kv_heads, c.head_dim
        q = self.linear(x, f"{p}.wq", f"{p}.bq").reshape(B, T, H, D)
        k = self.linear(x, f"{p}.wk", f"{p}.bk").reshape(B, T, G, D)
        v = self.linear(x, f"{p}.wv", f"{p}.bv").reshape(B, T, G, D)
        if c.pos == "rope":
            q, k = self.rope(q, 0), self.rope(k, 0)
        q = q.transpose(1, 2)  # [B, H, T, D]
        k = k.transpose(1, 2).repeat_interleave(H // G, dim=1)  # [B, H, T, D]
        v = v.transpose(1, 2).repeat_interleave(H // G, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, D]
        return self.linear(out.transpose(1, 2).reshape(B, T, H * D), f"{p}.wo", f"{p}.bo")

    def mlp(self, x, p):
        c = self.cfg
        up = self.linear(x, f"{p}.w_up", f"{p}.b_up")
        if c.mlp == "swiglu":
            hidden = F.silu(self.linear(x, f"{p}.w_gate", f"{p}.b_gate")) * up
        else:
            hidden = F.gelu(up, approximate="tanh" if c.mlp == "gelu_tanh" else "none")
        return self.linear(hidden, f"{p}.w_down", f"{p}.b_down")

    def __call__(self, tokens):
        c, w = self.cfg, self.w
        tokens = torch.as_tensor(tokens)
        x = w["tok_emb"][tokens]  # [B, T, d]
        if c.pos == "learned":
            x = x + w["pos_emb"][: tokens.shape[1]]
        for i in range(c.n_layers):
            x = x + self.attention(self.norm(x, f"blocks.{i}.attn_norm"), f"blocks.{i}.attn")
            x = x + self.mlp(self.norm(x, f"blocks.{i}.mlp_norm"), f"blocks.{i}.mlp")
        x = self.norm(x, "final_norm")
        head = w["tok_emb"].T if c.tie_embeddings else w["lm_head.w"]  # [d, vocab]
        logits = x @ head
        return logits + w["lm_head.b"] if "lm_head.b" in w else logits

    def greedy(self, prompt, steps):
        """Greedy decoding by full recomputation; also the smallest top-1/top-2 logit gap seen."""
        tokens = torch.as_tensor(prompt)
        margin = math.inf
        for _ in range(steps):
            last = self(tokens)[:, -1]  # [B, vocab]
            top2 = torch.topk(last, 2, dim=-1).values
            margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
            tokens = torch.cat([tokens, last.argmax(-1, keepdim=True)], dim=1)
        return n(tokens), margin


def config_json(cfg):
    fields = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__ if f != "dtype"}
    fields["dtype"] = np.dtype(cfg.dtype).name
    return json.dumps(fields, sort_keys=True)


def make_model(name, cfg, seed, T, prompt_len, steps):
    flat = perturbed_params(cfg, seed)
    model = TorchModel(flat, cfg)
    rng = np.random.default_rng(seed + 900)
    tokens = rng.integers(0, cfg.vocab, size=(2, T), dtype=np.int64)
    logits = n(model(tokens))
    greedy_out, margin = model.greedy(tokens[:, :prompt_len], steps)
    print(f"  {name}: logits std {logits.std():.3f}, smallest greedy top-2 gap {margin:.2e}")
    save(name, config=np.array(config_json(cfg)), tokens=tokens, logits=logits,
         greedy_prompt=tokens[:, :prompt_len], greedy_out=greedy_out, **flat)


def make_models():
    # d_ff = 2 * d_model (not GPT-2's 4x) keeps the weight files small; the
    # arithmetic under test is the same.
    gpt2 = tl.gpt2_config(vocab=64, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq=16,
                          norm_eps=1e-5, dtype=np.float64)
    make_model("gpt2_forward", gpt2, seed=11, T=12, prompt_len=5, steps=8)
    llama = tl.llama_config(vocab=64, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
                            max_seq=16, norm_eps=1e-5, rope_base=10000.0, dtype=np.float64)
    make_model("llama_forward", llama, seed=12, T=12, prompt_len=5, steps=8)


# ---------------------------------------------------------------- gradients

def make_grads():
    """Autograd gradients of the mean cross-entropy (ignore_index=-1) for every weight, for
    a GPT-2-flavoured and a Llama-flavoured model: grads.npz, keys "<model>/<param>".

    Smaller models than the forward snapshots (d_model 16) keep the file small; the
    weights are stored beside their gradients, so the file stands alone.
    """
    gpt2 = tl.gpt2_config(vocab=32, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_seq=8,
                          norm_eps=1e-5, dtype=np.float64)
    llama = tl.llama_config(vocab=32, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=32,
                            max_seq=8, norm_eps=1e-5, rope_base=10000.0, dtype=np.float64)
    arrays = {}
    for name, cfg, seed in (("gpt2", gpt2, 21), ("llama", llama, 22)):
        flat = perturbed_params(cfg, seed)
        model = TorchModel(flat, cfg)
        for w in model.w.values():
            w.requires_grad_(True)
        rng = np.random.default_rng(seed + 900)
        tokens = rng.integers(0, cfg.vocab, size=(2, 8), dtype=np.int64)
        tokens[1, 5] = tokens[0, 2]  # a repeated token: its embedding row gets both gradients
        targets = np.concatenate([tokens[:, 1:], rng.integers(0, cfg.vocab, size=(2, 1))], axis=1)
        targets[0, :3] = -1  # a prompt, left out of the loss
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), t(targets).reshape(-1),
                               ignore_index=-1)
        loss.backward()
        print(f"  {name}: loss {float(loss.detach()):.4f}")
        arrays[f"{name}/config"] = np.array(config_json(cfg))
        arrays[f"{name}/tokens"], arrays[f"{name}/targets"] = tokens, targets
        arrays[f"{name}/loss"] = n(loss)
        for key, value in flat.items():
            arrays[f"{name}/{key}"] = value
            arrays[f"{name}/grad/{key}"] = n(model.w[key].grad)
    save("grads", **arrays)


# ---------------------------------------------------------------- optimizer

def make_optim():
    """Several steps of clip_grad_norm_ then torch.optim.AdamW on a small GPT-2 params dict.

    Decay goes to the arrays with ndim >= 2 only (nanoGPT's two param groups),
    the learning rate changes every step (a warmup then a decay), and the grads
    are scaled so that some steps are clipped and some are not. Keys: lr, max_norm,
    betas, eps, weight_decay; p0/<name> the initial params; g<k>/<name> the raw
    grads of step k; norm (torch's returned total norms); p<k>/<name> the params
    after step k. The same run in float32 has every key suffixed "32".
    """
    cfg = tl.gpt2_config(vocab=16, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_seq=8,
                         dtype=np.float64)
    rng = np.random.default_rng(1006)
    names = [name for name, _ in tl.named_params(tl.init_params(cfg, 0))]
    start = {name: a + 0.1 * rng.normal(size=a.shape)
             for name, a in tl.named_params(tl.init_params(cfg, 0))}
    steps = 6
    lrs = np.array([1e-3, 2e-3, 3e-3, 2.5e-3, 1.5e-3, 5e-4])
    # Grad norms around max_norm: scales 0.3..3 make some steps clip and some not.
    scales = np.array([3.0, 0.3, 1.5, 0.5, 2.0, 0.8])
    grads = [{name: s * rng.normal(size=a.shape) / math.sqrt(len(names) * a.size)
              for name, a in start.items()} for s in scales]
    max_norm, betas, eps, wd = 1.0, (0.9, 0.95), 1e-8, 0.1
    arrays = {"lr": lrs, "max_norm": np.float64(max_norm), "betas": np.array(betas),
              "eps": np.float64(eps), "weight_decay": np.float64(wd)}

    for dtype, suffix in ((np.float64, ""), (np.float32, "32")):
        params = {name: torch.tensor(start[name].astype(dtype), requires_grad=True)
                  for name in names}
        decay = [p for p in params.values() if p.ndim >= 2]
        no_decay = [p for p in params.values() if p.ndim < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=float(lrs[0]), betas=betas, eps=eps, foreach=False)
        norms = []
        for name in names:
            arrays[f"p0/{name}{suffix}"] = start[name].astype(dtype)
        for k in range(steps):
            for name, p in params.items():
                p.grad = t(grads[k][name].astype(dtype))
                arrays[f"g{k}/{name}{suffix}"] = grads[k][name].astype(dtype)
            norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()), max_norm)))
            for group in opt.param_groups:
                group["lr"] = float(lrs[k])
            opt.step()
            for name, p in params.items():
                arrays[f"p{k + 1}/{name}{suffix}"] = n(p).copy()  # n() shares memory
        arrays[f"norm{suffix}"] = np.array(norms)
        print(f"  optim {np.dtype(dtype).name}: grad norms {', '.join(f'{x:.2f}' for x in norms)}")
    save("optim", **arrays)


def main():
    torch.manual_seed(0)  # nothing below draws from torch's RNG, but fix it anyway
    print(f"torch {torch.__version__}")
    make_norms()
    make_activations()
    make_attention()
    make_rope()
    make_models()
    make_grads()
    make_optim()
    total = sum(p.stat().st_size for p in HERE.glob("*.npz"))
    print(f"total {total / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
