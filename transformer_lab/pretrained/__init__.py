"""Pretrained models: the GGUF loader, the BPE tokenizer and the chat template."""
