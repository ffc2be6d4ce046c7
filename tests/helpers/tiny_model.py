"""A tiny chat model saved as a model.npz (no GGUF, no gguf package): a byte-level
vocabulary with ChatML's special tokens, random weights, a context long enough for the
chat tasks' conversations spelled byte by byte."""
import numpy as np

from transformer_lab import init_params, llama_config
from transformer_lab.pretrained.tokenizer import BYTE_TO_CHAR, CONTROL, NORMAL, BPETokenizer
from transformer_lab.pretrained.model_file import save_model

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "a m", "e r"]


def tiny_tokenizer():
    tokens = SPECIALS + [BYTE_TO_CHAR[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
    types = [CONTROL] * len(SPECIALS) + [NORMAL] * (len(tokens) - len(SPECIALS))
    return BPETokenizer(tokens, MERGES, types, "smollm", bos_id=1, eos_id=2)


def tiny_chat_config(d_model=32, layers=2, max_seq=320):
    return llama_config(vocab=len(SPECIALS) + 256 + len(MERGES), d_model=d_model, n_heads=2,
                        n_kv_heads=1, n_layers=layers, d_ff=2 * d_model, max_seq=max_seq,
                        dtype=np.float32)


def write_tiny_model(path, seed=0, **config):
    """A tiny model.npz at path; returns (cfg, params, tokenizer)."""
    cfg = tiny_chat_config(**config)
    params, tokenizer = init_params(cfg, seed=seed), tiny_tokenizer()
    save_model(path, params, cfg, tokenizer)
    return cfg, params, tokenizer
