"""save_checkpoint / load_checkpoint: round trip, atomic replacement, damaged and foreign files."""
from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

import transformer_lab as tl
from transformer_lab.pretrained import model_file as ckpt


def small(dtype=np.float32):
    cfg = tl.TINY_GPT2.replace(dtype=dtype)
    return cfg, tl.init_params(cfg, 3)


def test_round_trip_params_config_and_extra(tmp_path):
    cfg, params = small()
    opt = tl.AdamW(params, lr=1e-3)
    grads = tl.init_params(cfg, 4)
    opt.step(grads)
    rng = np.random.default_rng(5)
    rng.random(3)
    path = tl.save_checkpoint(tmp_path / "model.npz", params, cfg, step=7, optimizer=opt.state_dict(),
                              rng=rng.bit_generator.state, history=[{"loss": 1.5}], note=None)
    cfg2, params2, extra = tl.load_checkpoint(path)
    assert cfg2 == cfg
    for (name, a), (name2, b) in zip(tl.named_params(params), tl.named_params(params2)):
        assert name == name2
        assert b.dtype == np.float32
        np.testing.assert_array_equal(a, b)
    assert extra["step"] == 7 and extra["history"] == [{"loss": 1.5}] and extra["note"] is None
    # The optimizer and the rng carry on exactly where they were.
    opt2 = tl.AdamW(params2)
    opt2.load_state_dict(extra["optimizer"])
    assert opt2.step_count == 1 and opt2.lr == 1e-3
    opt.step(grads)
    opt2.step(grads)
    for (_, a), (_, b) in zip(tl.named_params(params), tl.named_params(params2)):
        np.testing.assert_array_equal(a, b)
    rng2 = np.random.default_rng()
    rng2.bit_generator.state = extra["rng"]
    np.testing.assert_array_equal(rng.random(4), rng2.random(4))


def test_file_is_plain_npz_with_json_config(tmp_path):
    cfg, params = small(np.float64)
    path = tl.save_checkpoint(tmp_path / "c.npz", params, cfg)
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["__checkpoint__"]))
        assert "params/blocks[1].attn.wk" in z.files
    assert meta["config"]["d_model"] == cfg.d_model and meta["config"]["dtype"] == "float64"


def test_llama_config_round_trip(tmp_path):
    cfg = tl.TINY
    params = tl.init_params(cfg, 0)
    tl.save_checkpoint(tmp_path / "l.npz", params, cfg)
    cfg2, params2, extra = tl.load_checkpoint(tmp_path / "l.npz")
    assert cfg2 == cfg and extra == {}
    tokens = np.arange(6)[None]
    np.testing.assert_array_equal(tl.forward(params, cfg, tokens), tl.forward(params2, cfg2, tokens))


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    cfg, params = small()
    path = tmp_path / "model.npz"
    tl.save_checkpoint(path, params, cfg, step=1)
    before = path.read_bytes()

    def explode(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C in the middle of writing

    monkeypatch.setattr(ckpt.np, "savez", explode)
    with pytest.raises(KeyboardInterrupt):
        tl.save_checkpoint(path, params, cfg, step=2)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz"]  # no temp file left
    assert tl.load_checkpoint(path)[2]["step"] == 1


def test_save_replaces_by_rename(tmp_path, monkeypatch):
    cfg, params = small()
    path = tmp_path / "model.npz"
    calls = []
    real_replace = os.replace

    def spy(src, dst):
        calls.append((os.path.dirname(src), os.fspath(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", spy)
    tl.save_checkpoint(path, params, cfg)
    assert calls == [(str(tmp_path), str(path))]  # written beside it, then renamed over it


def test_saved_file_has_open_s_permissions_not_mkstemp_s(tmp_path):
    # mkstemp makes an owner-only (0600) file; the saved file is for others to load too
    cfg, params = small()
    old = os.umask(0o022)
    try:
        tl.save_checkpoint(tmp_path / "a.npz", params, cfg)
        os.umask(0o077)
        tl.save_checkpoint(tmp_path / "b.npz", params, cfg)
    finally:
        os.umask(old)
    assert (tmp_path / "a.npz").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.npz").stat().st_mode & 0o777 == 0o600
    assert not list(tmp_path.glob(".*.tmp"))


def test_truncated_file_is_a_value_error_naming_it(tmp_path):
    cfg, params = small()
    path = tmp_path / "model.npz"
    tl.save_checkpoint(path, params, cfg)
    data = path.read_bytes()
    for cut in (len(data) // 2, len(data) - 30, 10, 0):
        bad = tmp_path / f"cut{cut}.npz"
        bad.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=f"cut{cut}.npz"):
            tl.load_checkpoint(bad)


def test_corrupt_member_is_a_value_error(tmp_path):
    cfg, params = small()
    path = tmp_path / "model.npz"
    tl.save_checkpoint(path, params, cfg)
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(64)  # zero a stretch of some array's bytes: a CRC mismatch
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="model.npz"):
        tl.load_checkpoint(path)


@pytest.mark.parametrize("kind", ["npz", "npy", "pickle", "text", "zip"])
def test_foreign_files_are_value_errors(tmp_path, kind):
    path = tmp_path / f"foreign.{kind}"
    if kind == "npz":
        np.savez(path, weights=np.ones(3))
    elif kind == "npy":
        np.save(path, np.ones(3))
        path = tmp_path / "foreign.npy"
    elif kind == "pickle":
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        path = tmp_path / "foreign.pickle.npy"
    elif kind == "text":
        path.write_text("hello")
    else:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("readme.txt", "not numpy")
    with pytest.raises(ValueError, match="foreign"):
        tl.load_checkpoint(path)


def test_wrong_format_or_config_mismatch(tmp_path):
    cfg, params = small()
    path = tmp_path / "x.npz"
    tl.save_checkpoint(path, params, cfg)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["__checkpoint__"]))
    meta["config"]["d_model"] = 64
    arrays["__checkpoint__"] = np.array(json.dumps(meta))
    np.savez(tmp_path / "y.npz", **arrays)
    with pytest.raises(ValueError, match="y.npz.*shape"):
        tl.load_checkpoint(tmp_path / "y.npz")
    meta["format"] = "something else"
    arrays["__checkpoint__"] = np.array(json.dumps(meta))
    np.savez(tmp_path / "z.npz", **arrays)
    with pytest.raises(ValueError, match="z.npz.*format"):
        tl.load_checkpoint(tmp_path / "z.npz")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        tl.load_checkpoint(tmp_path / "nope.npz")


def test_save_errors(tmp_path):
    cfg, params = small()
    with pytest.raises(ValueError, match="cfg must be a Config"):
        tl.save_checkpoint(tmp_path / "a.npz", params, {"d_model": 32})
    with pytest.raises(ValueError, match="missing"):
        tl.save_checkpoint(tmp_path / "a.npz", {"tok_emb": params["tok_emb"]}, cfg)
    with pytest.raises(ValueError, match="extra thing: cannot store a set"):
        tl.save_checkpoint(tmp_path / "a.npz", params, cfg, thing={1, 2})
    with pytest.raises(ValueError, match="object arrays"):
        tl.save_checkpoint(tmp_path / "a.npz", params, cfg, thing=np.array([None]))
    assert list(tmp_path.iterdir()) == []
