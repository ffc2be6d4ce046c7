"""LoRA and full grads against torch autograd (a tiny float64 Llama written in torch here,
LoRA as peft computes it: base(x) + lora_B(lora_A(x)) * scaling), and on the real
SmolLM2 against HF transformers' LlamaForCausalLM with the same weights.

Needs torch (and for the real model transformers and the model); skipped without.
Run with the scratch venv's packages on the path, e.g.
    PYTHONPATH=/tmp/torchvenv/lib/python3.11/site-packages .venv/bin/python -m pytest -q \\
        tests/training/test_lora_torch.py
"""
import numpy as np
import pytest

from helpers.real_model import MODEL_PATH
from helpers.spread import spread
from transformer_lab import init_params, llama_config, loss_and_grads, named_params, rope_angles
from transformer_lab.training import LoRA

try:
    import torch
    F = torch.nn.functional
except ImportError:  # each test is collected and skipped, so the file alone exits 0
    torch = F = None
pytestmark = pytest.mark.skipif(torch is None, reason="the autograd reference needs PyTorch")

CFG = llama_config(vocab=40, d_model=24, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=40,
                   max_seq=16, dtype=np.float64)


def batch(cfg, seed=0, B=2, T=9):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab, size=(B, T))
    targets = rng.integers(0, cfg.vocab, size=(B, T))
    targets[0, :3] = -1
    return tokens, targets


def torch_loss(params, cfg, tokens, targets, lora=None):
    """The Llama forward and mean cross-entropy in torch; params and adapters are dicts of
    torch tensors keyed like named_params."""
    H, G, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    tokens = torch.from_numpy(tokens)
    B, T = tokens.shape
    cos, sin = (torch.from_numpy(a)[:, None, :] for a in rope_angles(np.arange(T), D,
                                                                      cfg.rope_base))

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * w

    def rope(x):  # interleaved pairs (2i, 2i+1), as transformer_lab
        pairs = x.unflatten(-1, (-1, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)

    def linear(x, i, group, w):
        y = x @ params[f"blocks[{i}].{group}.{w}"]
        key = f"blocks[{i}].{group}.{w}"
        if lora is not None and key + ".A" in lora:  # peft: lora_B(lora_A(x)) * scaling
            y = y + (x @ lora[key + ".A"]) @ lora[key + ".B"] * lora["scale"]
        return y

    x = params["tok_emb"][tokens]
    for i in range(cfg.n_layers):
        h = rms(x, params[f"blocks[{i}].attn_norm.weight"])
        q = rope(linear(h, i, "attn", "wq").view(B, T, H, D)).transpose(1, 2)
        k = rope(linear(h, i, "attn", "wk").view(B, T, G, D)).transpose(1, 2)
        v = linear(h, i, "attn", "wv").view(B, T, G, D).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + linear(att.transpose(1, 2).reshape(B, T, H * D), i, "attn", "wo")
        h = rms(x, params[f"blocks[{i}].mlp_norm.weight"])
        x = x + linear(F.silu(linear(h, i, "mlp", "w_gate")) * linear(h, i, "mlp", "w_up"),
                       i, "mlp", "w_down")
    x = rms(x, params["final_norm.weight"])
    logits = x @ (params["tok_emb"].T if cfg.tie_embeddings else params["lm_head.w"])
    return F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(targets).flatten(),
                           ignore_index=-1)


def check_close(ours, theirs, tol):
    """Each leaf's largest difference relative to its largest entry."""
    for name, a in named_params(ours):
        want = theirs[name]
        err = float(np.max(np.abs(a - want))) / float(np.max(np.abs(want)))
        assert err <= tol, (name, err)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpoint"])
def test_lora_and_full_grads_match_torch_autograd(tie, checkpoint):
    cfg = CFG.replace(tie_embeddings=tie)
    params = spread(init_params(cfg))
    tokens, targets = batch(cfg)
    lora = LoRA.init(params, cfg, rank=3, alpha=5, targets=LoRA.ALL_LINEAR, seed=4)
    rng = np.random.default_rng(5)
    for name, a in named_params(lora.adapters):
        if name.endswith(".B"):
            a[...] = 0.3 * rng.normal(size=a.shape)

    frozen = {n: torch.from_numpy(a.copy()) for n, a in named_params(params)}
    adapters = {n: torch.tensor(a, requires_grad=True) for n, a in named_params(lora.adapters)}
    want = torch_loss(frozen, cfg, tokens, targets, {**adapters, "scale": lora.scale})
    want.backward()
    value, grads = loss_and_grads(params, cfg, tokens, targets, lora=lora, checkpoint=checkpoint)
    assert value == pytest.approx(want.item(), rel=1e-13)
    check_close(grads, {n: t.grad.numpy() for n, t in adapters.items()}, 1e-12)

    full = {n: torch.tensor(a.copy(), requires_grad=True) for n, a in named_params(params)}
    want = torch_loss(full, cfg, tokens, targets)
    want.backward()
    value, grads = loss_and_grads(params, cfg, tokens, targets, checkpoint=checkpoint)
    assert value == pytest.approx(want.item(), rel=1e-13)
    check_close(grads, {n: t.grad.numpy() for n, t in full.items()}, 1e-11)


# ---------------------------------------------------------------- the real model

def hf_state_dict(params, cfg):
    """Our params as LlamaForCausalLM's state dict (float64): weights transposed to
    [out, in], and the Q/K columns of each head put back from the interleaved RoPE pairs
    (GGUF's order) into HF's two halves."""
    D = cfg.head_dim

    def halves(w, heads):  # [in, heads*D] interleaved -> [heads*D, in] halves, torch layout
        n_in = w.shape[0]
        w = w.reshape(n_in, heads, D // 2, 2).transpose(0, 1, 3, 2).reshape(n_in, heads * D)
        return torch.from_numpy(np.ascontiguousarray(w.T))

    sd = {"model.embed_tokens.weight": torch.from_numpy(np.array(params["tok_emb"])),
          "model.norm.weight": torch.from_numpy(params["final_norm"]["weight"])}
    for i, b in enumerate(params["blocks"]):
        pre = f"model.layers.{i}."
        a, m = b["attn"], b["mlp"]
        sd[pre + "self_attn.q_proj.weight"] = halves(a["wq"], cfg.n_heads)
        sd[pre + "self_attn.k_proj.weight"] = halves(a["wk"], cfg.n_kv_heads)
        for ours, theirs in (("wv", "self_attn.v_proj"), ("wo", "self_attn.o_proj")):
            sd[pre + theirs + ".weight"] = torch.from_numpy(np.ascontiguousarray(a[ours].T))
        for ours, theirs in (("w_gate", "gate_proj"), ("w_up", "up_proj"),
                             ("w_down", "down_proj")):
            sd[pre + "mlp." + theirs + ".weight"] = torch.from_numpy(
                np.ascontiguousarray(m[ours].T))
        sd[pre + "input_layernorm.weight"] = torch.from_numpy(b["attn_norm"]["weight"])
        sd[pre + "post_attention_layernorm.weight"] = torch.from_numpy(b["mlp_norm"]["weight"])
    return sd


@pytest.mark.skipif(MODEL_PATH is None, reason="needs the gguf package and SmolLM2")
def test_lora_grads_on_smollm2_match_hf_llama():
    """One cheap check (T = 12): our LoRA grads on SmolLM2 against the chain rule through
    HF's autograd of the merged weights, dA = s G B^T and dB = s A^T G (G = dL/dW)."""
    transformers = pytest.importorskip("transformers", reason="needs HF transformers")
    from transformer_lab import load_gguf
    cfg32, params32, _ = load_gguf(MODEL_PATH)
    cfg = cfg32.replace(dtype=np.float64)
    params = {"tok_emb": params32["tok_emb"].astype(np.float64),
              "final_norm": {"weight": params32["final_norm"]["weight"].astype(np.float64)},
              "lm_head": {},
              "blocks": [{g: {k: v.astype(np.float64) for k, v in b[g].items()} for g in b}
                         for b in params32["blocks"]]}
    del params32
    lora = LoRA.init(params, cfg, rank=4, alpha=8, targets=("wq", "wk", "w_down"), seed=0)
    rng = np.random.default_rng(1)
    for name, a in named_params(lora.adapters):
        if name.endswith(".B"):
            a[...] = 0.01 * rng.normal(size=a.shape)
    tokens = rng.integers(0, cfg.vocab, size=(1, 12))
    targets = np.roll(tokens, -1, axis=1)
    targets[0, :4] = -1
    value, grads = loss_and_grads(params, cfg, tokens, targets, lora=lora, checkpoint=True)

    merged = lora.merge(params)
    D = cfg.head_dim
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_base, max_position_embeddings=cfg.max_seq, tie_word_embeddings=True,
        attn_implementation="sdpa")  # eager softmaxes in float32
    with torch.device("meta"):  # no random init of 135M weights that are replaced at once
        model = transformers.LlamaForCausalLM(hf_cfg)
    model.load_state_dict(hf_state_dict(merged, cfg), strict=False, assign=True)
    model.tie_weights()
    # HF's RMSNorm computes in float32 whatever the input's dtype: in float64 here.
    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = (lambda m: lambda x: m.weight * (
                x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon)))(module)
    # HF computes the RoPE angles in float32 whatever the model's dtype (about 4e-8 of the
    # loss here); give it the float64 angles we use, in its layout (the halves repeated).
    cos, sin = (torch.from_numpy(np.concatenate([a, a], axis=-1))[None]
                for a in rope_angles(np.arange(tokens.shape[1]), D, cfg.rope_base))
    model.model.rotary_emb.forward = lambda x, position_ids: (cos, sin)
    for p in model.parameters():
        p.requires_grad_(False)
    named = dict(model.named_parameters())
    hf = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "w_down": "mlp.down_proj"}
    for i in range(cfg.n_layers):
        for w in hf:
            named[f"model.layers.{i}.{hf[w]}.weight"].requires_grad_(True)
    out = model(torch.from_numpy(tokens), labels=None)
    want = F.cross_entropy(out.logits[0], torch.from_numpy(targets[0]), ignore_index=-1)
    want.backward()
    assert value == pytest.approx(want.item(), rel=1e-12)

    s = lora.scale
    for i, block in enumerate(lora.adapters["blocks"]):
        for group, adapters in block.items():
            for w, ab in adapters.items():
                G = named[f"model.layers.{i}.{hf[w]}.weight"].grad.numpy().T  # [in, out], HF order
                if w in ("wq", "wk"):  # back to the interleaved column order
                    n_in = G.shape[0]
                    G = G.reshape(n_in, -1, 2, D // 2).transpose(0, 1, 3, 2).reshape(n_in, -1)
                got = grads["blocks"][i][group][w]
                for part, expect in (("A", s * G @ ab["B"].T), ("B", s * ab["A"].T @ G)):
                    err = float(np.max(np.abs(got[part] - expect))) / float(np.max(np.abs(expect)))
                    assert err <= 1e-9, (i, w, part, err)
