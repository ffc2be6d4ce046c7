"""The same Llama-style model in PyTorch eager, built from a transformer_lab params dict.

Only imported when PyTorch is installed. Written for the configs the benchmark
uses: RMSNorm, SwiGLU, interleaved RoPE, grouped K/V heads, no biases, untied head.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from transformer_lab import rope_angles


def supports(cfg):
    return (cfg.norm == "rms" and cfg.mlp == "swiglu" and cfg.pos == "rope" and not cfg.bias
            and not cfg.tie_embeddings)


class TorchModel:
    """forward(tokens) -> logits as a NumPy array; the weights share memory with params."""

    def __init__(self, params, cfg, threads=None):
        if not supports(cfg):
            raise ValueError("the PyTorch reference covers RMSNorm + SwiGLU + RoPE, no biases, untied head")
        if threads is not None:
            torch.set_num_threads(int(threads))
        self.cfg = cfg
        t = torch.from_numpy
        self.tok_emb = t(params["tok_emb"])
        self.blocks = [{"attn_norm": t(b["attn_norm"]["weight"]),
                        "wq": t(b["attn"]["wq"]), "wk": t(b["attn"]["wk"]),
                        "wv": t(b["attn"]["wv"]), "wo": t(b["attn"]["wo"]),
                        "mlp_norm": t(b["mlp_norm"]["weight"]),
                        "w_gate": t(b["mlp"]["w_gate"]), "w_up": t(b["mlp"]["w_up"]),
                        "w_down": t(b["mlp"]["w_down"])} for b in params["blocks"]]
        self.final_norm = t(params["final_norm"]["weight"])
        self.w_head = t(params["lm_head"]["w"])

    def _rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps) * w

    @staticmethod
    def _rope(x, cos, sin):
        """Rotate interleaved pairs (2i, 2i+1) of x [B, T, heads, D]; cos, sin [T, 1, D/2]."""
        pairs = x.unflatten(-1, (-1, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    def forward(self, tokens):
        cfg = self.cfg
        H, G, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        with torch.inference_mode():
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
            logits = self._rms(x, self.final_norm) @ self.w_head
            return logits.numpy()
