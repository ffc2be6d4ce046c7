"""Shared by the tests/test_serve_*.py files: small random models and the one-by-one reference."""
import numpy as np

from transformer_lab.config import gpt2_config, llama_config
from transformer_lab.generation import generate
from transformer_lab.params import init_params

# float64 models of both flavours: GQA without biases, MHA with biases everywhere, and a
# Llama-style one with biases and multi-query attention.
CONFIGS = {
    "llama_gqa": llama_config(vocab=97, d_model=48, n_heads=6, n_kv_heads=2, n_layers=2,
                              d_ff=96, max_seq=96, dtype=np.float64),
    "gpt2_bias": gpt2_config(vocab=89, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                             max_seq=96, dtype=np.float64),
    "llama_bias_mqa": llama_config(vocab=71, d_model=32, n_heads=4, n_kv_heads=1, n_layers=2,
                                   d_ff=64, max_seq=96, bias=True, tie_embeddings=True,
                                   dtype=np.float64),
}
# 20 prompt lengths: 1, below and above 16, none a multiple of 7 or 16 except where listed.
LENGTHS = (1, 2, 3, 5, 8, 9, 11, 13, 15, 16, 17, 19, 23, 26, 29, 31, 33, 37, 40, 45)


def model(name, seed=0):
    cfg = CONFIGS[name]
    return cfg, init_params(cfg, seed=seed)


def prompts(cfg, lengths=LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, cfg.vocab, size=n)] for n in lengths]


def one_by_one(params, cfg, prompt_list, n):
    """generate(..., greedy=True) on each prompt alone: its n new tokens."""
    return [[int(t) for t in generate(params, cfg, [p], n, greedy=True)[0][len(p):]]
            for p in prompt_list]


def reference_case(name, new):
    """(cfg, params, the 20 prompts, their `new` greedy tokens one prompt at a time)."""
    cfg, params = model(name)
    ps = prompts(cfg)
    return cfg, params, ps, one_by_one(params, cfg, ps, new)


def no_leaks(llm):
    """After generate: no block held; any block left with a hash has ref count 0."""
    assert llm.stats()["blocks_in_use"] == 0
    assert all(b.ref_count == 0 for b in llm.block_manager.blocks)
    assert not llm.scheduler.running and not llm.scheduler.waiting
