"""Mixtures of experts against HF transformers: a tiny random model in float64, its state
dict converted by pretrained/hf.py, the same logits and the same chosen experts.

HF computes RMSNorm, the RoPE angles and the routers in float32 even in a float64 model
(~1e-7 off); each is patched, for the test only, to the same formula in the input's dtype,
as tests/snapshots/make_snapshots.py does for DeepSeek-V3's MLA.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a test-only oracle: pip install torch transformers")
transformers = pytest.importorskip("transformers", reason="HF transformers is a test-only oracle")

import torch.nn.functional as F  # noqa: E402

from transformer_lab import ActivationRecord, forward, moe_forward  # noqa: E402
from transformer_lab.pretrained.hf import (config_from_hf, interleave_rope_rows,  # noqa: E402
                                           params_from_hf)

F64 = torch.float64
SMALL = dict(vocab_size=48, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
             rms_norm_eps=1e-6, tie_word_embeddings=False, attn_implementation="sdpa",
             pad_token_id=None, bos_token_id=None, eos_token_id=None)


def rms_forward(self, x):
    variance = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


def rope_forward(self, x, position_ids):
    dim = self.inv_freq.shape[0] * 2
    inv_freq = 1.0 / (self.config.rope_parameters["rope_theta"]
                      ** (torch.arange(0, dim, 2, dtype=F64) / dim))
    emb = torch.cat([position_ids[..., None].to(F64) * inv_freq] * 2, dim=-1)
    return ((emb.cos() * self.attention_scaling).to(x.dtype),
            (emb.sin() * self.attention_scaling).to(x.dtype))


def softmax_router_forward(self, hidden_states):
    logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    top, index = torch.topk(F.softmax(logits, dim=-1), self.top_k, dim=-1)
    if getattr(self, "norm_topk_prob", True):  # Mixtral's router always renormalises
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top, index


def deepseek_router_forward(self, hidden_states):
    logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    scores = logits.sigmoid()
    choice = scores + self.e_score_correction_bias
    groups = choice.view(-1, self.num_group, self.num_experts // self.num_group)
    group_scores = groups.topk(2, dim=-1)[0].sum(dim=-1)
    kept = torch.zeros_like(group_scores).scatter_(
        1, torch.topk(group_scores, k=self.topk_group, dim=-1)[1], 1)
    mask = kept.unsqueeze(-1).expand_as(groups).reshape(-1, self.num_experts).bool()
    index = torch.topk(choice.masked_fill(~mask, float("-inf")), k=self.top_k, dim=-1)[1]
    weights = scores.gather(1, index)
    if self.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return logits, weights * self.routed_scaling_factor, index


MODELS = {  # name -> (module, prefix of its classes, config fields, the router's forward)
    "llama": ("llama", "Llama", dict(), None),  # dense: the RoPE reordering alone
    "mixtral": ("mixtral", "Mixtral", dict(num_local_experts=8, num_experts_per_tok=2,
                                           sliding_window=None), softmax_router_forward),
    "qwen2_moe": ("qwen2_moe", "Qwen2Moe", dict(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=12,
        shared_expert_intermediate_size=24, norm_topk_prob=False, qkv_bias=False,
        use_sliding_window=False), softmax_router_forward),
    "qwen2_moe_normed": ("qwen2_moe", "Qwen2Moe", dict(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=12,
        shared_expert_intermediate_size=12, norm_topk_prob=True, qkv_bias=False,
        use_sliding_window=False), softmax_router_forward),
    "qwen3_moe": ("qwen3_moe", "Qwen3Moe", dict(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=12, norm_topk_prob=True,
        use_sliding_window=False), softmax_router_forward),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3", dict(
        n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=12, n_shared_experts=1,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=12, qk_nope_head_dim=8,
        qk_rope_head_dim=4, v_head_dim=8, head_dim=4, num_key_value_heads=4,
        rope_interleave=True, rope_scaling=None, attention_bias=False),
        deepseek_router_forward),
}


def hf_model(name, monkeypatch, seed=0):
    module_name, prefix, fields, router_forward = MODELS[name]
    module = getattr(transformers.models, module_name)
    hf = getattr(module, f"modeling_{module_name}")
    monkeypatch.setattr(getattr(hf, f"{prefix}RMSNorm"), "forward", rms_forward)
    monkeypatch.setattr(getattr(hf, f"{prefix}RotaryEmbedding"), "forward", rope_forward)
    if router_forward is not None:
        router = next(getattr(hf, c) for c in (f"{prefix}TopKRouter", f"{prefix}TopkRouter")
                      if hasattr(hf, c))
        monkeypatch.setattr(router, "forward", router_forward)
    config = getattr(transformers, f"{prefix}Config")(**{**SMALL, **fields})
    config._experts_implementation = "eager"  # the loop over experts, in float64
    torch.manual_seed(seed)
    model = getattr(transformers, f"{prefix}ForCausalLM")(config).to(F64).eval()
    rng = np.random.default_rng(seed + 1)
    with torch.no_grad():
        for key, p in model.named_parameters():
            p.copy_(torch.from_numpy(rng.normal(0, 0.15, size=tuple(p.shape))))
            if "norm" in key:
                p += 1.0  # gains near one
        for key, b in model.named_buffers():
            if key.endswith("e_score_correction_bias"):
                b.copy_(torch.from_numpy(rng.normal(0, 0.1, size=tuple(b.shape))))
    return model


def hf_run(model, tokens):
    """HF's logits and, per MoE layer, each token's chosen experts [B, T, k], sorted."""
    chosen = {}
    hooks = [layer.mlp.gate.register_forward_hook(
        lambda mod, inp, out, i=i: chosen.__setitem__(i, out[2].numpy()))
        for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")
        and not hasattr(layer.mlp, "gate_proj")]
    with torch.no_grad():
        logits = model(torch.as_tensor(tokens)).logits.numpy()
    for hook in hooks:
        hook.remove()
    B, T = tokens.shape
    return logits, {i: np.sort(e.reshape(B, T, -1), axis=-1) for i, e in chosen.items()}


def state_of(model):
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", MODELS)
def test_logits_and_chosen_experts_equal_hf(name, monkeypatch):
    model = hf_model(name, monkeypatch)
    tokens = np.random.default_rng(7).integers(0, SMALL["vocab_size"], size=(2, 11))
    want, want_experts = hf_run(model, tokens)
    cfg = config_from_hf(model.config.to_dict(), dtype=np.float64)
    params = params_from_hf(state_of(model), cfg)
    acts = ActivationRecord()
    got = forward(params, cfg, tokens, acts=acts)
    assert np.abs(want).max() > 1.0  # logits far from zero, so the tolerance says something
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
    moe_layers = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
    assert moe_layers == sorted(want_experts)
    for i in moe_layers:
        experts = acts.layer(i, "moe.experts")
        np.testing.assert_array_equal(np.sort(experts, axis=-1), want_experts[i])
        assert len(np.unique(experts)) > cfg.experts_per_token  # tokens routed apart
    got32 = forward(params_from_hf(state_of(model), cfg.replace(dtype=np.float32)),
                    cfg.replace(dtype=np.float32), tokens)
    np.testing.assert_allclose(got32, want, rtol=0, atol=1e-4)


def test_qwen3_moe_block_equals_hf(monkeypatch):
    """Qwen3-MoE's sparse block alone (softmax router, top k, norm_topk_prob), its weights
    mapped here by hand: the experts' layout checked apart from pretrained/hf.py."""
    from transformer_lab import llama_config
    hf = transformers.models.qwen3_moe.modeling_qwen3_moe
    monkeypatch.setattr(hf.Qwen3MoeTopKRouter, "forward", softmax_router_forward)
    config = transformers.Qwen3MoeConfig(**{**SMALL, "num_experts": 8, "num_experts_per_tok": 2,
                                            "moe_intermediate_size": 12, "norm_topk_prob": True})
    config._experts_implementation = "eager"
    block = hf.Qwen3MoeSparseMoeBlock(config).to(F64).eval()
    rng = np.random.default_rng(3)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.from_numpy(rng.normal(0, 0.3, size=tuple(p.shape))))
    x = rng.normal(size=(2, 9, 32))
    with torch.no_grad():
        want = block(torch.from_numpy(x)).numpy()
        _, _, want_experts = block.gate(torch.from_numpy(x))
    cfg = llama_config(vocab=48, d_model=32, n_heads=4, n_layers=1, d_ff=40, max_seq=32,
                       n_experts=8, experts_per_token=2, moe_d_ff=12, norm_topk_prob=True,
                       dtype=np.float64)
    gate_up = block.experts.gate_up_proj.detach().numpy()
    m = {"router": block.gate.weight.detach().numpy().T.copy(),
         "w_gate": gate_up[:, :12].transpose(0, 2, 1).copy(),
         "w_up": gate_up[:, 12:].transpose(0, 2, 1).copy(),
         "w_down": block.experts.down_proj.detach().numpy().transpose(0, 2, 1).copy()}
    acts = ActivationRecord()
    np.testing.assert_allclose(moe_forward(x, m, cfg, acts=acts), want, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.sort(acts.layer(0, "moe.experts").reshape(-1, 2), axis=-1),
                                  np.sort(want_experts.numpy(), axis=-1))


def test_rope_rows_are_interleaved_per_head():
    w = np.arange(2 * 6)[:, None] * np.ones((1, 3))  # 2 heads of D=6, rows numbered
    assert interleave_rope_rows(w, 2)[:, 0].tolist() == [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]


def test_what_the_lab_does_not_compute_is_refused_by_name(monkeypatch):
    model = hf_model("mixtral", monkeypatch)
    hf_cfg = model.config.to_dict()
    for change, message in [(dict(model_type="qwen2"), "model_type 'qwen2'"),
                            (dict(head_dim=16), "head_dim=16"),
                            (dict(sliding_window=4), "sliding_window=4"),
                            (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}),
                             "rope_type 'yarn'"),
                            (dict(hidden_act="gelu"), "hidden_act='gelu'")]:
        with pytest.raises(ValueError, match=message):
            config_from_hf({**hf_cfg, **change})
    cfg = config_from_hf(hf_cfg, dtype=np.float64)
    state = state_of(model)
    state["model.layers.1.mlp.experts.down_proj"] = state[
        "model.layers.1.mlp.experts.down_proj"][:, :, :-1]
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.experts.down_proj has shape"):
        params_from_hf(state, cfg)
    state = {**state_of(model), "model.layers.0.self_attn.q_norm.weight": np.ones(8)}
    with pytest.raises(ValueError, match="does not use: model.layers.0.self_attn.q_norm"):
        params_from_hf(state, cfg)
    state = state_of(model)
    del state["model.layers.2.mlp.gate.weight"]
    with pytest.raises(ValueError, match="missing model.layers.2.mlp.gate.weight"):
        params_from_hf(state, cfg)


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"])
def test_load_hf_reads_what_save_pretrained_writes(name, monkeypatch, tmp_path):
    """save_pretrained writes one tensor per expert (Mixtral's block_sparse_moe.experts.{e}.w1,
    w3, w2; the others' experts.{e}.gate_proj, ...), not the fused form the model holds."""
    from transformer_lab import load_hf
    model = hf_model(name, monkeypatch)
    model.save_pretrained(tmp_path)
    tokens = np.random.default_rng(8).integers(0, SMALL["vocab_size"], size=(2, 9))
    want, _ = hf_run(model, tokens)
    cfg, params = load_hf(tmp_path, dtype=np.float64)
    np.testing.assert_allclose(forward(params, cfg, tokens), want, rtol=0, atol=1e-10)
    cfg32, params32 = load_hf(tmp_path)
    assert cfg32.dtype == np.float32
    np.testing.assert_allclose(forward(params32, cfg32, tokens), want, rtol=0, atol=1e-4)


def test_bf16_tensors_read_by_hand_equal_torchs(tmp_path):
    from safetensors.torch import save_file

    from transformer_lab.pretrained.safetensors_file import read_safetensors
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    save_file({"x": x}, str(tmp_path / "b.safetensors"))
    got, _ = read_safetensors(tmp_path / "b.safetensors")
    np.testing.assert_array_equal(got["x"], x.float().numpy())


def test_load_hf_names_what_is_missing(tmp_path, monkeypatch):
    from transformer_lab import load_hf
    with pytest.raises(FileNotFoundError, match="no config.json in"):
        load_hf(tmp_path)
    hf_model("mixtral", monkeypatch).save_pretrained(tmp_path)
    for file in tmp_path.glob("*.safetensors"):
        file.unlink()
    with pytest.raises(ValueError, match="no .safetensors file in"):
        load_hf(tmp_path)
