import os
import sys
from pathlib import Path

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
