"""`python -m transformer_lab.train --dp N` (and --zero, --ranks): how it is installed."""
import re

from paths import ROOT


def test_the_readme_installs_the_parallel_extra_and_ci_runs_the_same():
    extra = re.search(r"^parallel = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert set(re.findall(r'"([a-z0-9]+)', extra.group(1))) == {"mpi4py", "mpich"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = re.search(r'pip install -e "\.\[([a-z,]+)\]"', readme)
    assert "parallel" in install.group(1).split(",")
    ci = (ROOT / ".ci" / "run").read_text()
    assert f'pip install --quiet -e ".[{install.group(1)}]"' in ci
