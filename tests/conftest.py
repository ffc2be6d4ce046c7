import os
import sys
from pathlib import Path

from hypothesis import settings

# Deterministic property tests everywhere: the same examples on every run, no deadline.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=60)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Demos and run_all.py live at the repo root, outside the installed packages.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
