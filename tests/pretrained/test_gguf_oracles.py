"""The GGUF files save_gguf writes, run by the runtimes a user would move to: HF
transformers (AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)) gives our logits,
and llama.cpp (the xllamacpp wheel) generates our greedy tokens; for a q8_0 file, llama.cpp's
greedy agreement and perplexity are reported beside ours on the same text.

Test-only oracles, in a venv of their own (pip install torch transformers accelerate
xllamacpp beside the project); elsewhere each test skips with the reason.
"""
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
from api_helpers import toy_tokenizer
from real_model import needs_real_model
from tiny_gguf import tiny_config, tiny_params
from tiny_model import tiny_tokenizer

from transformer_lab import forward, generate
from transformer_lab.pretrained.chat_template import encode_chat

pytest.importorskip("gguf", reason="the writer's files are read back with gguf: pip install gguf")
from transformer_lab.pretrained.gguf_write import save_gguf  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Name three primary colours.",
             "Write a haiku about the sea."]
# A fine-tuned json-extract model.npz (python -m transformer_lab.train --init smollm2 --task
# json-extract --lora 8 --out runs/json), where one has been trained.
FINETUNED = Path(os.environ.get("TRANSFORMER_LAB_FINETUNED", "runs/json/model.npz"))


def hf():
    torch = pytest.importorskip("torch", reason="HF's loader needs torch (test-only: pip install torch)")
    transformers = pytest.importorskip("transformers", reason="needs HF transformers (test-only: pip install transformers)")
    pytest.importorskip("accelerate", reason="HF loads GGUF files only with accelerate installed")
    return torch, transformers


def hf_logits(path, ids):
    torch, transformers = hf()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids))).logits.numpy()


def needs_llama_cpp():
    return pytest.importorskip("xllamacpp", reason="needs llama.cpp's xllamacpp wheel "
                                                   "(test-only: pip install xllamacpp)")


def llama_cpp(path, prompts, n, n_ctx=512):
    """llama.cpp's greedy continuation of each prompt, up to its end of generation or n
    tokens: [(token ids, their log-probs)]."""
    xllamacpp = needs_llama_cpp()
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_ctx, params.n_parallel, params.warmup, params.verbosity = n_ctx, 1, False, 0
    params.cpuparams.n_threads = 2
    server = xllamacpp.Server(params)
    out = []
    for prompt in prompts:
        reply = server.handle_completions({"prompt": [int(t) for t in prompt], "max_tokens": n,
                                           "temperature": 0, "logprobs": 1})
        content = reply["choices"][0]["logprobs"]["content"]
        out.append(([c["id"] for c in content], [c["logprob"] for c in content]))
    del server
    return out


def ours_greedy(params, cfg, prompt, n):
    return generate(params, cfg, np.array([prompt]), n, greedy=True)[0, len(prompt):].tolist()


def until_stop(tok, ids):
    """ids up to the first end of generation (llama.cpp's: eos, <|im_end|>, <|endoftext|>)."""
    stops = {tok.eos_id} | {tok.special_tokens.get(t) for t in ("<|im_end|>", "<|endoftext|>")}
    return next((ids[:i] for i, t in enumerate(ids) if t in stops), ids)


def log_probs(params, cfg, prompt, continuation):
    """Our log-probability of each continuation token after the prompt."""
    ids = np.array([list(prompt) + list(continuation)])
    logits = forward(params, cfg, ids)[0, len(prompt) - 1:-1].astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return logp[np.arange(len(continuation)), continuation]


# ---------------------------------------------------------------- a tiny model

@pytest.mark.parametrize("tie", [True, False])
def test_hf_gives_our_logits_and_tokens(tmp_path, tie):
    cfg, params, tok = tiny_config(tie=tie), tiny_params(tiny_config(tie=tie)), toy_tokenizer()
    path = save_gguf(tmp_path / "m.gguf", params, cfg, tok)
    ids = np.random.default_rng(0).integers(0, cfg.vocab, (2, 24))
    np.testing.assert_allclose(hf_logits(path, ids), forward(params, cfg, ids), atol=1e-4)
    _, transformers = hf()
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    text = "<|im_start|>user\nhello the thing, 12 ingots<|im_end|>\n"
    assert theirs.encode(text) == tok.encode(text)


@pytest.mark.parametrize("tok", [toy_tokenizer(), tiny_tokenizer()], ids=["gpt-2", "smollm"])
def test_llama_cpp_generates_our_greedy_tokens(tmp_path, tok):
    cfg = tiny_config(tie=False)
    cfg = type(cfg)(**{**cfg.__dict__, "vocab": tok.vocab_size})
    params = tiny_params(cfg)
    path = save_gguf(tmp_path / "m.gguf", params, cfg, tok)
    prompts = [tok.encode("hello the thing"), tok.encode("in the ring")]
    for prompt, (theirs, _) in zip(prompts, llama_cpp(path, prompts, 16, n_ctx=cfg.max_seq)):
        assert until_stop(tok, theirs) == until_stop(tok, ours_greedy(params, cfg, prompt, 16))


# ---------------------------------------------------------------- SmolLM2

@pytest.fixture(scope="module")
def smollm2_f32(tmp_path_factory, smollm2):
    if not any(importlib.util.find_spec(m) for m in ("transformers", "xllamacpp")):
        pytest.skip("needs HF transformers or llama.cpp's xllamacpp (test-only)")
    cfg, params, tok = smollm2
    return save_gguf(tmp_path_factory.mktemp("smollm2") / "smollm2-f32.gguf", params, cfg, tok)


def chat_prompts(tok, questions=QUESTIONS):
    return [encode_chat(tok, [{"role": "user", "content": q}]) for q in questions]


@needs_real_model
def test_hf_gives_our_logits_on_smollm2(smollm2, smollm2_f32):
    cfg, params, tok = smollm2
    ids = np.array(chat_prompts(tok)[:1])
    np.testing.assert_allclose(hf_logits(smollm2_f32, ids), forward(params, cfg, ids), atol=1e-4)


@needs_real_model
def test_llama_cpp_generates_our_greedy_tokens_on_smollm2(smollm2, smollm2_f32):
    cfg, params, tok = smollm2
    prompts = chat_prompts(tok)
    for prompt, (theirs, _) in zip(prompts, llama_cpp(smollm2_f32, prompts, 24)):
        assert until_stop(tok, theirs) == until_stop(tok, ours_greedy(params, cfg, prompt, 24)), \
            tok.decode(theirs)


@needs_real_model
def test_a_q8_0_file_in_llama_cpp_beside_ours(tmp_path, smollm2, capsys):
    """The q8_0 file's greedy text in llama.cpp against ours on the same file and on the
    f32 weights: tokens agreeing before the first difference, and each one's perplexity
    of llama.cpp's continuation."""
    from transformer_lab.pretrained.gguf import load_gguf
    needs_llama_cpp()
    cfg, params, tok = smollm2
    path = save_gguf(tmp_path / "smollm2-q8_0.gguf", params, cfg, tok, dtype="q8_0")
    _, q8_params, _ = load_gguf(path)
    n, rows = 32, []
    prompts = chat_prompts(tok)
    for prompt, (theirs, their_logp) in zip(prompts, llama_cpp(path, prompts, n)):
        theirs = until_stop(tok, theirs)
        their_logp = their_logp[:len(theirs)]
        same = [until_stop(tok, ours_greedy(p, cfg, prompt, n)) for p in (q8_params, params)]
        agree = [next((i for i, (a, b) in enumerate(zip(theirs, s)) if a != b),
                      min(len(theirs), len(s))) for s in same]
        ppl = [float(np.exp(-np.mean(lp))) for lp in
               (their_logp, log_probs(q8_params, cfg, prompt, theirs),
                log_probs(params, cfg, prompt, theirs))]
        rows.append((agree, ppl))
        # llama.cpp multiplies q8_0 weights by q8_0-rounded activations, the lab by floats:
        # near ties may go either way, but the text's likelihood is the same to a few %.
        assert abs(ppl[0] - ppl[1]) < 0.05 * ppl[1]
    with capsys.disabled():
        print(f"\nq8_0 SmolLM2, up to {n} greedy tokens from llama.cpp per prompt: tokens before the "
              f"first difference (ours q8_0, ours f32); perplexity of that text "
              f"(llama.cpp q8_0, ours q8_0, ours f32)")
        for (agree, ppl), q in zip(rows, QUESTIONS):
            print(f"  {q[:32]:32}  {agree[0]:2d} {agree[1]:2d}   "
                  + "  ".join(f"{p:.3f}" for p in ppl))


@needs_real_model
def test_llama_cpp_answers_as_the_fine_tuned_json_extract_model(tmp_path):
    needs_llama_cpp()
    if not FINETUNED.is_file():
        pytest.skip(f"no fine-tuned json-extract model at {FINETUNED} (train one with "
                    f"python -m transformer_lab.train --init smollm2 --task json-extract "
                    f"--lora 8 --out runs/json, or set TRANSFORMER_LAB_FINETUNED)")
    from transformer_lab.pretrained.model_file import load_model
    from transformer_lab.training.chat_tasks import conversation_messages, get_chat_task
    cfg, params, tok = load_model(FINETUNED)
    path = save_gguf(tmp_path / "json-f32.gguf", params, cfg, tok)
    users = [ex.user for ex in get_chat_task("json-extract").heldout_set(4)]
    prompts = [encode_chat(tok, conversation_messages(u)) for u in users]
    for prompt, (theirs, _) in zip(prompts, llama_cpp(path, prompts, 28)):
        assert until_stop(tok, theirs) == until_stop(tok, ours_greedy(params, cfg, prompt, 28)), \
            tok.decode(theirs)
