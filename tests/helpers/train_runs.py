"""What the parallel training tests share: a checkpoint compared with the one-process
run's, and a bad option's one line on stderr with exit 2."""
import numpy as np
import pytest

from transformer_lab import named_params
from transformer_lab.cli import train
from transformer_lab.parallel import launch
from transformer_lab.pretrained.model_file import load_checkpoint

PROG = "python -m transformer_lab.train: error: "


def assert_same_run(path, want):
    """Every array, AdamW's moments included, within 1e-5 norm-wise and 1e-3 in every
    element (float32 over other rank counts: not bit for bit); the history within 1e-4."""
    _, params, extra = load_checkpoint(path)
    _, want_params, want_extra = want
    pairs = [(f"params {k}", a, b) for (k, a), (_, b) in
             zip(named_params(params), named_params(want_params))]
    for moment in ("m", "v"):
        pairs += [(f"{moment} {k}", a, want_extra["optimizer"][moment][k])
                  for k, a in extra["optimizer"][moment].items()]
    assert len(pairs) == 3 * len(list(named_params(want_params)))
    for name, a, b in pairs:
        assert a.shape == b.shape and a.dtype == b.dtype == np.float32, name
        assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b), name
        assert np.abs(a - b).max() <= 1e-3, name
    assert extra["step"] == want_extra["step"] and extra["rng"] == want_extra["rng"]
    assert extra["optimizer"]["step_count"] == want_extra["optimizer"]["step_count"]
    for key in ("loss", "grad_norm"):
        got = [row[key] for row in extra["history"]]
        np.testing.assert_allclose(got, [row[key] for row in want_extra["history"]], rtol=1e-4)


def assert_exits_2_with_one_line(argv, env, needle, capsys, monkeypatch):
    """`train argv` (as if MPI were installed, with env set) exits 2 with one line holding
    needle."""
    monkeypatch.setattr(launch, "missing_mpi", lambda: None)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as info:
        train.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(PROG) and needle in err, err
