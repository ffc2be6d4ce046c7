"""python -m transformer_lab.export: a model.npz (or a GGUF file) to a llama GGUF file; every
usage error one line and exit 2."""
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("gguf", reason="reading GGUF back needs the gguf package: pip install gguf")
from paths import ROOT  # noqa: E402
from tiny_model import tiny_tokenizer, write_tiny_model  # noqa: E402

from transformer_lab import gpt2_config, init_params  # noqa: E402
from transformer_lab.cli import export  # noqa: E402
from transformer_lab.params import named_params  # noqa: E402
from transformer_lab.pretrained.gguf import open_gguf  # noqa: E402
from transformer_lab.pretrained.model_file import load_model, save_checkpoint, save_model  # noqa: E402


@pytest.fixture(scope="module")
def model_npz(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.npz"
    return path, *write_tiny_model(path)


def test_export_q8_0(model_npz, tmp_path, capsys):
    path, cfg, params, tok = model_npz
    out = tmp_path / "model-q8_0.gguf"
    assert export.main([str(path), str(out), "--type", "q8_0"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (q8_0, ")
    kinds = {t.name: t.tensor_type.name for t in open_gguf(out).tensors}
    assert kinds["blk.0.attn_q.weight"] == "Q8_0" and kinds["output_norm.weight"] == "F32"
    cfg2, params2, tok2 = load_model(out)
    assert cfg2 == cfg and tok2.to_dict() == tok.to_dict()
    for (name, a), (_, b) in zip(named_params(params), named_params(params2)):
        np.testing.assert_allclose(b, a, atol=np.abs(a).max() / 100, err_msg=name)


def test_the_entry_point(model_npz, tmp_path):
    out = tmp_path / "m.gguf"
    result = subprocess.run([sys.executable, "-m", "transformer_lab.export", str(model_npz[0]),
                             str(out), "--type", "f16", "--name", "tiny"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert open_gguf(out).fields["general.name"].value() == "tiny"


def usage_error(argv, capsys):
    with pytest.raises(SystemExit) as info:
        export.main([str(a) for a in argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m transformer_lab.export: error: ")
    return err


def test_usage_errors(model_npz, tmp_path, capsys):
    path = model_npz[0]
    out = tmp_path / "m.gguf"
    assert "the following arguments are required: OUT" in usage_error([path], capsys)
    assert "argument --type: invalid choice: 'q5_k'" in usage_error([path, out, "--type", "q5_k"],
                                                                    capsys)
    assert "absent.npz: no such file" in usage_error([tmp_path / "absent.npz", out], capsys)
    assert "should end in .gguf" in usage_error([path, tmp_path / "m.bin"], capsys)
    cfg = gpt2_config(vocab=264, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_seq=16)
    save_model(tmp_path / "gpt2.npz", init_params(cfg, seed=0), cfg, tiny_tokenizer())
    assert "not a llama model" in usage_error([tmp_path / "gpt2.npz", out], capsys)
    _, cfg, params, _ = model_npz
    save_checkpoint(tmp_path / "checkpoint.npz", params, cfg)
    assert "without a tokenizer" in usage_error([tmp_path / "checkpoint.npz", out], capsys)
    assert not out.exists()


def test_an_unwritable_out_exits_1(model_npz, tmp_path, capsys):
    assert export.main([str(model_npz[0]), str(tmp_path / "no" / "such" / "m.gguf")]) == 1
    assert capsys.readouterr().err.startswith("error: cannot write ")
