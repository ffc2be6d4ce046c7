"""The same Llama-style model in PyTorch eager, built from a transformer_lab params dict,
and one training step of it.

Only imported when PyTorch is installed. Written for the configs the benchmarks
use: RMSNorm, SwiGLU, interleaved RoPE, grouped K/V heads, no biases, the head tied
(SmolLM2) or not.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from transformer_lab import rope_angles


def supports(cfg):
    return cfg.norm == "rms" and cfg.mlp == "swiglu" and cfg.pos == "rope" and not cfg.bias


class TorchModel:
    """forward(tokens) -> logits as a NumPy array; the weights share memory with params."""

    def __init__(self, params, cfg, threads=None):
        if not supports(cfg):
            raise ValueError("the PyTorch reference covers RMSNorm + SwiGLU + RoPE, no biases")
        if threads is not None:
            torch.set_num_threads(int(threads))
        self.cfg = cfg
        t = lambda a: a if isinstance(a, torch.Tensor) else torch.from_numpy(a)  # noqa: E731
        self.tok_emb = t(params["tok_emb"])
        self.blocks = [{"attn_norm": t(b["attn_norm"]["weight"]),
                        "wq": t(b["attn"]["wq"]), "wk": t(b["attn"]["wk"]),
                        "wv": t(b["attn"]["wv"]), "wo": t(b["attn"]["wo"]),
                        "mlp_norm": t(b["mlp_norm"]["weight"]),
                        "w_gate": t(b["mlp"]["w_gate"]), "w_up": t(b["mlp"]["w_up"]),
                        "w_down": t(b["mlp"]["w_down"])} for b in params["blocks"]]
        self.final_norm = t(params["final_norm"]["weight"])
        self.w_head = None if cfg.tie_embeddings else t(params["lm_head"]["w"])

    def _rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps) * w

    @staticmethod
    def _rope(x, cos, sin):
        """Rotate interleaved pairs (2i, 2i+1) of x [B, T, heads, D]; cos, sin [T, 1, D/2]."""
        pairs = x.unflatten(-1, (-1, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    def forward(self, tokens):
        with torch.inference_mode():
            return self.logits(tokens).numpy()

    def logits(self, tokens):
        """Logits [B, T, vocab] as a torch tensor (differentiable outside inference_mode)."""
        cfg = self.cfg
        H, G, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        tokens = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
        B, T = tokens.shape
        cos, sin = rope_angles(np.arange(T), D, cfg.rope_base)  # float64, as transformer_lab
        dtype = self.tok_emb.dtype
        cos = torch.from_numpy(cos).to(dtype)[:, None, :]
        sin = torch.from_numpy(sin).to(dtype)[:, None, :]
        x = self.tok_emb[tokens]
        for p in self.blocks:
            h = self._rms(x, p["attn_norm"])
            q = self._rope((h @ p["wq"]).view(B, T, H, D), cos, sin).transpose(1, 2)
            k = self._rope((h @ p["wk"]).view(B, T, G, D), cos, sin).transpose(1, 2)
            v = (h @ p["wv"]).view(B, T, G, D).transpose(1, 2)
            # Query head h reads K/V head h // (H // G), as repeat_interleave.
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=G != H)
            x = x + att.transpose(1, 2).reshape(B, T, H * D) @ p["wo"]
            h = self._rms(x, p["mlp_norm"])
            x = x + (F.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]
        head = self.tok_emb.T if self.w_head is None else self.w_head
        return self._rms(x, self.final_norm) @ head


class TorchTrainer:
    """One training step in PyTorch eager on copies of the same weights: forward, the mean
    cross-entropy over targets != -1, backward, clip_grad_norm_ and torch.optim.AdamW, with
    decay on the matrices only, as transformer_lab's train step does it."""

    def __init__(self, params, cfg, *, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, clip=1.0,
                 threads=None):
        if not supports(cfg):
            raise ValueError("the PyTorch reference covers RMSNorm + SwiGLU + RoPE, no biases")
        if threads is not None:
            torch.set_num_threads(int(threads))
        copy = {name: torch.tensor(np.array(a), requires_grad=True)
                for name, a in _named(params)}
        self.model = TorchModel(_nested(params, copy), cfg)
        self.params = list(copy.values())
        self.named = copy
        self.clip = clip
        decay = [p for p in self.params if p.ndim >= 2]
        no_decay = [p for p in self.params if p.ndim < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                      {"params": no_decay, "weight_decay": 0.0}],
                                     lr=lr, betas=betas)

    def loss_and_grads(self, tokens, targets):
        """(loss, {name: grad as NumPy}) without updating: for checking agreement."""
        for p in self.params:
            p.grad = None
        loss = self._loss(tokens, targets)
        loss.backward()
        return float(loss.detach()), {name: p.grad.numpy().copy() for name, p in self.named.items()}

    def _loss(self, tokens, targets):
        logits = self.model.logits(tokens)  # [B, T, V]
        targets = torch.from_numpy(np.asarray(targets, dtype=np.int64))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)

    def step(self, tokens, targets, clip=True):
        self.opt.zero_grad(set_to_none=True)
        loss = self._loss(tokens, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip) if clip else None
        self.opt.step()
        return float(loss.detach()), None if norm is None else float(norm)


def _named(tree):
    from transformer_lab import named_params
    return list(named_params(tree))


def _nested(params, copy):
    """params' layout with each leaf replaced by its torch copy (named as named_params names it)."""
    def build(node, path):
        if isinstance(node, dict):
            return {k: build(v, f"{path}.{k}" if path else k) for k, v in node.items()}
        if isinstance(node, list):
            return [build(v, f"{path}[{i}]") for i, v in enumerate(node)]
        return copy[path]
    return build(params, "")


def hf_model_from_gguf(path, threads):
    """HF transformers' own model of a GGUF file, float32, in eval mode, at `threads`
    torch threads. Its loading progress bars (tqdm, on stderr) are swallowed: they would
    land between the tables. Needs transformers beside torch (ImportError without it)."""
    import contextlib
    import io

    from transformers import AutoModelForCausalLM

    torch.set_num_threads(int(threads))
    with contextlib.redirect_stderr(io.StringIO()):
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=torch.float32)
    return model.eval()
