import os
import sys
from pathlib import Path

from hypothesis import settings

# Deterministic property tests everywhere: the same examples on every run, no deadline.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=60)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The one place the tests patch sys.path: the repo root (transformer_lab, console,
# benchmarks, run_all.py when not installed) and demos/ (its _common helpers, which
# load the numbered demos). tests/ itself is on sys.path through pytest, so test
# files import the shared helpers (reference, demo_helpers, tiny_gguf) directly.
ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "demos", ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
