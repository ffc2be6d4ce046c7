"""The activation record: what forward(..., acts=) keeps, declared once.

forward writes these names and backward reads them, so they are the contract
between the two, as llm.c's ActivationTensors struct is. A name that is not
declared here fails at once, when it is written or read, with the list of
names that exist, instead of as a KeyError somewhere in backward.

Model-level names: MODEL_FIELDS. Per layer i, "blocks[i]." + a LAYER_FIELDS name.
"""
from __future__ import annotations

MODEL_FIELDS = {
    "embed": "[B, T, d] token (+ position) embeddings, the stream's start",
    "final_norm": "[B, T, d] the normed stream the head reads",
    "logits": "[B, T, vocab]",
}
LAYER_FIELDS = {
    "resid_pre": "[B, T, d] the stream entering the block",
    "attn_in": "[B, T, d] norm(resid_pre), what the projections read",
    "attn.q": "[B, T, H, D] queries after biases and RoPE (MLA: D = nope + rope, RoPE on the rope part)",
    "attn.k": "[B, S, G, D] keys after RoPE, cached positions included (MLA: [B, S, H, D], "
              "up-projected from the latent, only when the naive form ran)",
    "attn.v": "[B, S, G, D] values, cached positions included (MLA: [B, S, H, v_head_dim], "
              "naive form only)",
    "attn.q_a": "[B, T, q_lora_rank] MLA's x @ wq_a, before q_norm (with q_lora_rank)",
    "attn.c_q": "[B, T, q_lora_rank] MLA's query latent q_norm(attn.q_a), what wq_b reads",
    "attn.kv_a": "[B, T, kv_lora_rank] MLA's latent x @ wkv_a[:, :kv_lora_rank], before kv_norm",
    "attn.c_kv": "[B, S, kv_lora_rank] MLA's cached latent kv_norm(attn.kv_a), cached positions "
                 "included",
    "attn.k_rope": "[B, S, qk_rope_head_dim] MLA's RoPE key shared by every head, rotated, cached "
                   "positions included",
    "attn.out": "[B, T, H*D] the heads merged, before wo",
    "attn.pattern": "[B, H, T, S] softmax weights, only with patterns=True",
    "resid_mid": "[B, T, d] the stream after attention",
    "mlp_in": "[B, T, d] norm(resid_mid) (not with mlp='none')",
    "mlp.up": "[B, T, d_ff]",
    "mlp.gate": "[B, T, d_ff] SwiGLU only",
    "mlp.hidden": "[B, T, d_ff] what w_down reads",
    "moe.router_logits": "[B, T, n_experts] x @ router on mlp_in (MoE layers)",
    "moe.experts": "[B, T, experts_per_token] int, the experts each token chose, best first "
                   "(MoE layers)",
    "moe.weights": "[B, T, experts_per_token] the chosen experts' weights (MoE layers)",
    "moe.kept": "[B, T, experts_per_token] bool, the choices within their expert's capacity "
                "(MoE layers with capacity_factor)",
    "resid_post": "[B, T, d] the stream leaving the block",
}

# Recorded only by MLA layers (attention="mla"); attn.q_a and attn.c_q only with q_lora_rank.
MLA_FIELDS = ("attn.q_a", "attn.c_q", "attn.kv_a", "attn.c_kv", "attn.k_rope")
# Recorded only by mixture-of-experts layers (config.is_moe_layer), which record no mlp.*.
MOE_LAYER_FIELDS = ("moe.router_logits", "moe.experts", "moe.weights", "moe.kept")


def layer_name(layer: int, field: str) -> str:
    """"blocks[i].field" for a declared per-layer field; KeyError naming the fields otherwise."""
    if field not in LAYER_FIELDS:
        raise KeyError(f"{field!r} is not an activation of a layer; declared: "
                       f"{', '.join(LAYER_FIELDS)}")
    return f"blocks[{layer}].{field}"


def check_name(name: str) -> str:
    """name, if it is a declared activation name ("logits", "blocks[3].attn.q", ...)."""
    if name in MODEL_FIELDS:
        return name
    head, dot, field = name.partition("].")
    if head.startswith("blocks[") and head[7:].isdigit() and dot and field in LAYER_FIELDS:
        return name
    raise KeyError(f"{name!r} is not a declared activation; model-level: "
                   f"{', '.join(MODEL_FIELDS)}; per layer blocks[i].: {', '.join(LAYER_FIELDS)}")


class ActivationRecord(dict):
    """What one forward pass computed, by declared name. ActivationRecord(patterns=True)
    also asks for the attention weights, which cost one more pass over the scores.

    A plain dict works too (forward fills it the same way, {"patterns": True} asking
    for the weights); this class adds the checks: a misspelt name raises on write and
    on read, and reading a declared name that this pass did not record says so.
    """

    def __init__(self, patterns: bool = False):
        super().__init__()
        self.patterns = bool(patterns)

    def __setitem__(self, name, value):
        super().__setitem__(check_name(name), value)

    def update(self, *args, **kwargs):
        for name, value in dict(*args, **kwargs).items():
            self[name] = value

    def __missing__(self, name):
        check_name(name)
        raise KeyError(f"{name!r} was not recorded by this forward pass (attn.pattern needs "
                       f"patterns=True; mlp_in and mlp.* need an MLP; mlp.gate needs SwiGLU; "
                       f"a mixture-of-experts layer records moe.* instead of mlp.*; "
                       f"attn.q_a, .c_q, .kv_a, .c_kv and .k_rope need attention='mla', the "
                       f"first two with q_lora_rank, and MLA records attn.k and .v only "
                       f"when it ran the naive form)")

    def layer(self, layer: int, field: str):
        """The record of `field` in block `layer`: acts.layer(2, "attn.q")."""
        return self[layer_name(layer, field)]


def wants_patterns(acts) -> bool:
    """Did the caller ask for the attention weights? patterns=True, or {"patterns": True}."""
    if isinstance(acts, ActivationRecord):
        return acts.patterns
    return bool(acts.get("patterns"))


def record(acts, layer, fields: dict):
    """Write fields {name: array} into acts, each name checked: per-layer names for
    layer i, model-level names for layer None."""
    for field, value in fields.items():
        name = field if layer is None else layer_name(layer, field)
        dict.__setitem__(acts, check_name(name), value)
