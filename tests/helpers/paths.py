"""Where things are, for every test: the repository root and the snapshot files."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/helpers/paths.py -> the repository
SNAPSHOTS = ROOT / "tests" / "snapshots"
