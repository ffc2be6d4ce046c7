"""Write the PyTorch reference snapshots that tests/core/test_snapshots.py compares against.

Run from the repo root, in an environment that has torch (CI does not need it):

    python tests/snapshots/make_snapshots.py        # or name groups: ... make_snapshots.py mla

The MLA group (mla_*.npz) also needs HF transformers (DeepseekV3ForCausalLM); it was
written with torch 2.13.0 and transformers 5.24.0.

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


# ---------------------------------------------------------------- MLA against HF's DeepSeek-V3

MLA_VARIANTS = {"mla_forward": None, "mla_lora_forward": 12}  # snapshot name -> q_lora_rank


def mla_config(q_lora_rank):
    return tl.llama_config(vocab=64, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq=16,
                           norm_eps=1e-6, rope_base=10000.0, attention="mla", kv_lora_rank=16,
                           qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                           q_lora_rank=q_lora_rank, dtype=np.float64)


def hf_deepseek_v3(cfg, seed):
    """transformers' DeepseekV3ForCausalLM for cfg: every layer dense, no rope scaling, RoPE
    on interleaved pairs, in float64, with weights made non-trivial as perturbed_params does.

    HF computes RMSNorm and the RoPE angles in float32 even in a float64 model (~4e-7 off);
    both are patched to compute the same formulas in float64. (Its latent norms use RMSNorm's
    default eps, 1e-6, whatever rms_norm_eps says, so the config uses 1e-6 throughout.)"""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

    def rms_forward(self, x):  # the same formula, in the input's dtype
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))

    def rope_forward(self, x, position_ids):  # the same formula, angles in float64
        dim = self.inv_freq.shape[0] * 2
        inv_freq = 1.0 / (self.config.rope_parameters["rope_theta"]
                          ** (torch.arange(0, dim, 2, dtype=F64) / dim))
        freqs = position_ids[..., None].to(F64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.attention_scaling).to(x.dtype),
                (emb.sin() * self.attention_scaling).to(x.dtype))

    hf.DeepseekV3RMSNorm.forward = rms_forward
    hf.DeepseekV3RotaryEmbedding.forward = rope_forward
    config = DeepseekV3Config(
        vocab_size=cfg.vocab, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        moe_intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=cfg.n_layers,  # all layers dense: no MoE
        kv_lora_rank=cfg.kv_lora_rank, q_lora_rank=cfg.q_lora_rank,
        qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim,
        v_head_dim=cfg.v_head_dim, head_dim=cfg.qk_rope_head_dim,
        max_position_embeddings=cfg.max_seq, rms_norm_eps=cfg.norm_eps,
        rope_scaling=None, rope_theta=cfg.rope_base, rope_interleave=True,
        tie_word_embeddings=False, attention_bias=False,
        attn_implementation="sdpa",  # eager's softmax runs in float32
        pad_token_id=None, bos_token_id=None, eos_token_id=None)  # a pad id zeroes its row's grad
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config).to(F64).eval()
    rng = np.random.default_rng(seed + 500)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # gains away from ones
                p += t(0.1 * rng.normal(size=tuple(p.shape)))
            elif any(key in name for key in ("q_proj", "q_b_proj", "kv_a_proj", "kv_b_proj")):
                p *= 8.0  # attention far from uniform
    return model


def hf_to_ours(model, cfg):
    """HF's DeepSeek-V3 weights in transformer_lab's layout ([in, out]: transposes), flat."""
    sd = {k: n(v) for k, v in model.state_dict().items()}
    flat = {"tok_emb": sd["model.embed_tokens.weight"], "final_norm.weight": sd["model.norm.weight"],
            "lm_head.w": sd["lm_head.weight"].T}
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}.", f"blocks.{i}."
        names = {"attn_norm.weight": "input_layernorm.weight",
                 "mlp_norm.weight": "post_attention_layernorm.weight",
                 "attn.kv_norm.weight": "self_attn.kv_a_layernorm.weight",
                 "attn.wkv_a": "self_attn.kv_a_proj_with_mqa.weight",
                 "attn.wkv_b": "self_attn.kv_b_proj.weight", "attn.wo": "self_attn.o_proj.weight",
                 "mlp.w_gate": "mlp.gate_proj.weight", "mlp.w_up": "mlp.up_proj.weight",
                 "mlp.w_down": "mlp.down_proj.weight"}
        if cfg.q_lora_rank is None:
            names["attn.wq"] = "self_attn.q_proj.weight"
        else:
            names.update({"attn.wq_a": "self_attn.q_a_proj.weight",
                          "attn.q_norm.weight": "self_attn.q_a_layernorm.weight",
                          "attn.wq_b": "self_attn.q_b_proj.weight"})
        for key, name in names.items():
            value = sd[hf + name]
            flat[ours + key] = value.T if value.ndim == 2 else value
    return flat


def make_mla():
    """DeepSeek-V3's MLA from HF transformers, with and without q_lora_rank: logits, greedy
    generation through HF's own cache (mla_forward.npz, mla_lora_forward.npz, laid out as
    the other model snapshots) and autograd gradients in our layout (mla_grads.npz)."""
    import transformers
    print(f"  transformers {transformers.__version__}")
    arrays = {}
    for k, (name, q_lora_rank) in enumerate(MLA_VARIANTS.items()):
        cfg = mla_config(q_lora_rank)
        model = hf_deepseek_v3(cfg, seed=31 + k)
        flat = hf_to_ours(model, cfg)
        rng = np.random.default_rng(931 + k)
        tokens = rng.integers(0, cfg.vocab, size=(2, 12), dtype=np.int64)
        with torch.no_grad():
            logits = n(model(torch.as_tensor(tokens)).logits)
            prompt = torch.as_tensor(tokens[:, :5])
            greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                    max_new_tokens=8, min_new_tokens=8, do_sample=False,
                                    use_cache=True)
        print(f"  {name}: logits std {logits.std():.3f}")
        save(name, config=np.array(config_json(cfg)), tokens=tokens, logits=logits,
             greedy_prompt=tokens[:, :5], greedy_out=n(greedy), **flat)

        # Gradients: autograd through HF's model, mapped into our layout like the weights.
        targets = np.concatenate([tokens[:, 1:], rng.integers(0, cfg.vocab, size=(2, 1))], axis=1)
        targets[0, :3] = -1
        out = model(torch.as_tensor(tokens)).logits
        loss = F.cross_entropy(out.reshape(-1, cfg.vocab), t(targets).reshape(-1), ignore_index=-1)
        model.zero_grad()
        loss.backward()
        grad_model = type("Grads", (), {"state_dict": lambda self: {
            key: p.grad for key, p in model.named_parameters()}})()
        grads = hf_to_ours(grad_model, cfg)
        tag = "lora" if q_lora_rank else "plain"
        arrays[f"{tag}/config"] = np.array(config_json(cfg))
        arrays[f"{tag}/tokens"], arrays[f"{tag}/targets"] = tokens, targets
        arrays[f"{tag}/loss"] = n(loss)
        for key, value in flat.items():
            arrays[f"{tag}/{key}"] = value
            arrays[f"{tag}/grad/{key}"] = grads[key]
    save("mla_grads", **arrays)


MAKERS = {"norms": lambda: make_norms(), "activations": lambda: make_activations(),
          "attention": lambda: make_attention(), "rope": lambda: make_rope(),
          "models": lambda: make_models(), "grads": lambda: make_grads(),
          "optim": lambda: make_optim(), "mla": lambda: make_mla()}


def main(argv=None):
    """Every snapshot, or only the groups named: python make_snapshots.py mla (the MLA
    group needs transformers with DeepseekV3ForCausalLM, too)."""
    import sys
    names = (sys.argv[1:] if argv is None else argv) or list(MAKERS)
    torch.manual_seed(0)  # nothing below draws from torch's RNG, but fix it anyway
    print(f"torch {torch.__version__}")
    for name in names:
        MAKERS[name]()
    total = sum(p.stat().st_size for p in HERE.glob("*.npz"))
    print(f"total {total / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
