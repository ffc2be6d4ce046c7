"""measure.training_memory, the memory ledger, against tracemalloc's peak of one
loss_and_grads call: activations + grads within 25 % with and without checkpointing,
full and LoRA; checkpointing cuts the activations to at most a third at B=1, T=1024."""
import numpy as np
import pytest

from transformer_lab import init_params, llama_config, loss_and_grads, pack_weights
from transformer_lab.measure import peak_traced_bytes, training_memory
from transformer_lab.params import named_params, param_shapes
from transformer_lab.training import LoRA

# SmolLM2's proportions, scaled down: many layers, narrow heads, a vocabulary larger than
# the model, tied head, GQA.
CFG = llama_config(vocab=4096, d_model=96, n_heads=2, n_kv_heads=1, n_layers=16, d_ff=256,
                   max_seq=1024, tie_embeddings=True, dtype=np.float32)
PARAMS = pack_weights(init_params(CFG), CFG)


def traced(B, T, lora, checkpoint, answer=None):
    """tracemalloc's peak of one loss_and_grads; answer: only each row's last `answer`
    positions supervised (a chat fine-tune's loss mask), else every position."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, CFG.vocab, size=(B, T))
    targets = np.roll(tokens, -1, 1)
    if answer is not None:
        targets[:, :T - answer] = -1
    _, peak = peak_traced_bytes(lambda: loss_and_grads(PARAMS, CFG, tokens, targets,
                                                       lora=lora, checkpoint=checkpoint))
    return peak


@pytest.mark.parametrize("B,T", [(1, 96), (2, 300)])
@pytest.mark.parametrize("lora_on", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpoint"])
def test_the_ledger_agrees_with_tracemalloc(B, T, lora_on, checkpoint):
    lora = LoRA.init(PARAMS, CFG, rank=8, targets=LoRA.ALL_LINEAR) if lora_on else None
    ledger = training_memory(CFG, B, T, lora=lora, checkpoint=checkpoint)
    peak = traced(B, T, lora, checkpoint)
    assert abs(ledger["activations"] + ledger["grads"] - peak) <= 0.25 * peak


@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpoint"])
def test_the_ledger_counts_only_supervised_rows_in_the_head(checkpoint):
    # A chat fine-tune supervises the answer only: 2 rows x 20 of 96 positions. The head's
    # logits chunk is then [40, V], not [192, V]; every-position counting over-predicts.
    lora = LoRA.init(PARAMS, CFG, rank=8, targets=LoRA.ALL_LINEAR)
    peak = traced(2, 96, lora, checkpoint, answer=20)
    ledger = training_memory(CFG, 2, 96, lora=lora, checkpoint=checkpoint, supervised=40)
    assert abs(ledger["activations"] + ledger["grads"] - peak) <= 0.25 * peak
    every = training_memory(CFG, 2, 96, lora=lora, checkpoint=checkpoint)
    assert every == training_memory(CFG, 2, 96, lora=lora, checkpoint=checkpoint, supervised=192)
    assert every["activations"] >= ledger["activations"]
    with pytest.raises(ValueError, match=r"supervised must be an int in \[0, 192\], got 193"):
        training_memory(CFG, 2, 96, supervised=193)


def test_checkpointing_cuts_the_activations_to_a_third_at_t_1024():
    measured = {ck: traced(1, 1024, None, ck) - training_memory(CFG, 1, 1024)["grads"]
                for ck in (False, True)}
    assert measured[True] <= measured[False] / 3
    predicted = {ck: training_memory(CFG, 1, 1024, checkpoint=ck)["activations"]
                 for ck in (False, True)}
    assert predicted[True] <= predicted[False] / 3
    for ck in (False, True):
        assert abs(predicted[ck] - measured[ck]) <= 0.25 * measured[ck]


def test_params_grads_optimizer_and_total():
    n = sum(int(np.prod(s)) for _, s in named_params(param_shapes(CFG)))
    full = training_memory(CFG, 1, 64)
    assert full["params"] == full["grads"] == 4 * n and full["optimizer"] == 8 * n
    assert full["total"] == full["params"] + full["grads"] + full["optimizer"] + full["activations"]
    lora = LoRA.init(PARAMS, CFG, rank=4, targets=("wq", "wv"))
    small = training_memory(CFG, 1, 64, lora=lora, optimizer="sgd", dtype=np.float64)
    assert small["params"] == 8 * n and small["grads"] == 8 * lora.n_params()
    assert small["optimizer"] == 0
    with pytest.raises(ValueError, match="optimizer must be one of adamw, sgd"):
        training_memory(CFG, 1, 64, optimizer="adam")
