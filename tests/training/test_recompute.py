"""loss_and_grads' memory savers: activation checkpointing (the same bits), the loss fused
with the head in chunks of rows (the readable form's numbers), and gradient accumulation
over micro-batches (the whole batch's grads, divided by the whole batch's count)."""
import numpy as np
import pytest

from helpers.spread import spread
import transformer_lab.training.backward as backward
from transformer_lab import (ActivationRecord, cross_entropy, cross_entropy_backward, forward,
                             gpt2_config, init_params, llama_config, loss_and_grads,
                             named_params, pack_weights)
from transformer_lab.training import LoRA
from transformer_lab.training.backward import accumulate_grads, lm_head_backward

LLAMA = llama_config(vocab=48, d_model=32, n_heads=4, n_kv_heads=2, n_layers=3, d_ff=64,
                     max_seq=16, dtype=np.float64)
TIED = LLAMA.replace(tie_embeddings=True)
GPT2 = gpt2_config(vocab=40, d_model=24, n_heads=3, n_layers=2, d_ff=48, max_seq=16,
                   dtype=np.float64)
CFGS = {"llama": LLAMA, "tied": TIED, "gpt2": GPT2}


def batch(cfg, seed=0, B=3, T=10):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab, size=(B, T))
    targets = rng.integers(0, cfg.vocab, size=(B, T))
    targets[0, :4] = -1
    targets[-1, 7:] = -1
    return tokens, targets


def same_bits(a, b):
    return all(np.array_equal(x, y) for (_, x), (_, y) in zip(named_params(a), named_params(b)))


def max_rel(a, b):
    """The largest |a - b| of a leaf relative to b's largest entry, or to 1e-3 of the largest
    entry of all if that is more (GPT-2's bk has an exactly zero gradient: only noise)."""
    floor = 1e-3 * max(float(np.max(np.abs(y))) for _, y in named_params(b))
    return max(float(np.max(np.abs(x - y))) / max(float(np.max(np.abs(y))), floor)
               for (_, x), (_, y) in zip(named_params(a), named_params(b)))


@pytest.mark.parametrize("name", CFGS)
@pytest.mark.parametrize("lora_on", [False, True], ids=["full", "lora"])
def test_checkpointing_gives_the_same_bits(name, lora_on):
    cfg = CFGS[name]
    params = spread(init_params(cfg))
    tokens, targets = batch(cfg)
    lora = LoRA.init(params, cfg, rank=3, targets=LoRA.ALL_LINEAR) if lora_on else None
    plain = loss_and_grads(params, cfg, tokens, targets, lora=lora)
    saved = loss_and_grads(params, cfg, tokens, targets, lora=lora, checkpoint=True)
    assert plain[0] == saved[0]
    assert same_bits(plain[1], saved[1])  # the same products on the same inputs


def test_checkpointing_on_packed_float32_params():
    cfg = LLAMA.replace(dtype=np.float32)
    params = pack_weights(init_params(cfg), cfg)
    tokens, targets = batch(cfg)
    plain = loss_and_grads(params, cfg, tokens, targets)
    saved = loss_and_grads(params, cfg, tokens, targets, checkpoint=True)
    assert plain[0] == saved[0] and same_bits(plain[1], saved[1])
    assert all(g.dtype == np.float32 for _, g in named_params(saved[1]))


@pytest.mark.parametrize("name", CFGS)
@pytest.mark.parametrize("rows", [1, 4, 256], ids=["rows1", "rows4", "rows256"])
def test_the_fused_chunked_loss_matches_the_readable_form(name, rows, monkeypatch):
    """Chunks of 1 and 4 rows (of 21 supervised ones) against forward's logits, then
    cross_entropy, cross_entropy_backward and lm_head_backward on all rows at once."""
    cfg = CFGS[name]
    params = spread(init_params(cfg))
    tokens, targets = batch(cfg)
    monkeypatch.setattr(backward, "LOSS_ROWS", rows)
    monkeypatch.setattr(backward, "VOCAB_SLICE", 16)  # several slices when chunks add up
    acts = ActivationRecord()
    logits = forward(params, cfg, tokens, acts=acts)
    x = acts["final_norm"]
    n = int((targets != -1).sum())
    value, dx, grads = backward.head_loss_and_backward(x, params, cfg, targets, n)
    assert value == pytest.approx(cross_entropy(logits, targets), rel=1e-13)
    want_dx, want_head, want_tok = lm_head_backward(cross_entropy_backward(logits, targets), x,
                                                    params, cfg)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-15)
    if cfg.tie_embeddings:
        np.testing.assert_allclose(grads["tok_emb"], want_tok, rtol=1e-12, atol=1e-15)
    else:
        assert max_rel(grads["lm_head"], want_head) <= 1e-12


def test_the_loss_never_holds_all_the_logits(monkeypatch):
    """With 4-row chunks, no array of the head's width holds more than 4 rows."""
    cfg = LLAMA
    params = spread(init_params(cfg))
    tokens, targets = batch(cfg)
    monkeypatch.setattr(backward, "LOSS_ROWS", 4)
    seen = []
    real = np.exp

    def exp(x, *args, **kwargs):
        seen.append(np.shape(x))
        return real(x, *args, **kwargs)

    monkeypatch.setattr(backward.np, "exp", exp)
    try:
        loss_and_grads(params, cfg, tokens, targets)
    finally:
        monkeypatch.undo()
    assert seen and all(s[-1] != cfg.vocab or s[0] <= 4 for s in seen)


@pytest.mark.parametrize("name", CFGS)
@pytest.mark.parametrize("lora_on", [False, True], ids=["full", "lora"])
def test_micro_batches_add_up_to_the_whole_batch(name, lora_on):
    cfg = CFGS[name]
    params = spread(init_params(cfg))
    tokens, targets = batch(cfg, B=4)
    targets[3, :] = -1  # a micro-batch with fewer supervised tokens: the trap
    targets[3, -1] = 5
    lora = LoRA.init(params, cfg, rank=3, targets=LoRA.ALL_LINEAR) if lora_on else None
    if lora_on:
        for _, b in named_params(lora.adapters):
            b[...] = np.random.default_rng(0).normal(size=b.shape) * 0.1
    whole = loss_and_grads(params, cfg, tokens, targets, lora=lora)
    parts = [(tokens[:1], targets[:1]), (tokens[1:3], targets[1:3]), (tokens[3:], targets[3:])]
    acc = accumulate_grads(params, cfg, parts, lora=lora)
    assert acc[0] == pytest.approx(whole[0], rel=1e-12)
    assert max_rel(acc[1], whole[1]) <= 1e-10
    # Dividing each micro-batch by its own count is a different (wrong) gradient.
    naive = [loss_and_grads(params, cfg, t, y, lora=lora)[1] for t, y in parts]
    leaves = [sum(x) / len(parts) for x in zip(*[[a for _, a in named_params(g)] for g in naive])]
    assert max(float(np.max(np.abs(a - b))) for a, (_, b) in
               zip(leaves, named_params(whole[1]))) > 1e-3


def test_a_micro_batch_of_prompts_only_adds_nothing():
    cfg = LLAMA
    params = spread(init_params(cfg))
    tokens, targets = batch(cfg, B=2)
    prompt_only = np.full_like(targets[:1], -1)
    value, grads = loss_and_grads(params, cfg, tokens[:1], prompt_only, n_targets=5)
    assert value == 0.0 and all(not g.any() for _, g in named_params(grads))
    parts = [(tokens[:1], prompt_only), (tokens[1:], targets[1:])]
    acc = accumulate_grads(params, cfg, parts)
    whole = loss_and_grads(params, cfg, tokens[1:], targets[1:])
    assert acc[0] == pytest.approx(whole[0], rel=1e-13) and max_rel(acc[1], whole[1]) <= 1e-12


def test_errors():
    cfg = LLAMA
    params = init_params(cfg)
    tokens, targets = batch(cfg)
    with pytest.raises(ValueError, match="checkpoint must be True or False"):
        loss_and_grads(params, cfg, tokens, targets, checkpoint="yes")
    with pytest.raises(ValueError, match="n_targets"):
        loss_and_grads(params, cfg, tokens, targets, n_targets=3)  # fewer than it supervises
    with pytest.raises(ValueError, match="n_targets"):
        loss_and_grads(params, cfg, tokens, targets, n_targets=2.5)
    with pytest.raises(ValueError, match="every target is -1"):
        loss_and_grads(params, cfg, tokens, np.full_like(targets, -1))
    with pytest.raises(ValueError, match="integer ids"):
        loss_and_grads(params, cfg, tokens, targets.astype(float))
    with pytest.raises(ValueError, match="at least one"):
        accumulate_grads(params, cfg, [])
    with pytest.raises(ValueError, match="every target of every micro-batch"):
        accumulate_grads(params, cfg, [(tokens, np.full_like(targets, -1))])


@pytest.mark.parametrize("lora_on", [False, True], ids=["full", "lora"])
def test_train_step_takes_micro_batches(lora_on):
    from transformer_lab import AdamW
    from transformer_lab.training.step import train_step
    cfg = LLAMA
    tokens, targets = batch(cfg, B=4)
    targets[3, 1:] = -1
    results = []
    for micro in (1, 3):
        params = spread(init_params(cfg))
        lora = LoRA.init(params, cfg, rank=3, targets=LoRA.ALL_LINEAR) if lora_on else None
        opt = AdamW(lora.adapters if lora_on else params, lr=1e-2)
        loss, norm = train_step(params, cfg, opt, tokens, targets, clip=1.0, lora=lora,
                                checkpoint=micro == 3, micro_batches=micro)
        results.append((loss, norm, lora.adapters if lora_on else params))
    (l1, n1, p1), (l3, n3, p3) = results
    assert l3 == pytest.approx(l1, rel=1e-12) and n3 == pytest.approx(n1, rel=1e-10)
    assert max_rel(p3, p1) <= 1e-10
    with pytest.raises(ValueError, match="micro_batches=5 is more than the batch's 4 rows"):
        train_step(params, cfg, opt, tokens, targets, micro_batches=5)
    with pytest.raises(ValueError, match="micro_batches"):
        train_step(params, cfg, opt, tokens, targets, micro_batches=0)
