"""training/mixed.py: mixed-precision and BF16 training steps, loss scaling, the CLI option."""
import math

import numpy as np
import pytest

from transformer_lab import (AdamW, DynamicLossScaler, forward, init_params, llama_config,
                             loss_and_grads, named_params, round_to)
from transformer_lab.cli import train
from transformer_lab.training.step import train_step
from transformer_lab.precision import computing_in
from transformer_lab.training.mixed import Precision, make_precision

CFG = llama_config(vocab=32, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq=8,
                   dtype=np.float32)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, CFG.vocab, size=(4, 8))
    return tokens, np.roll(tokens, -1, axis=1)


def leaves(tree):
    return [a for _, a in named_params(tree)]


def test_fp32_is_loss_and_grads(batch):
    params = init_params(CFG, seed=0)
    want_loss, want = loss_and_grads(params, CFG, *batch)
    loss, grads = Precision("fp32").loss_and_grads(params, CFG, *batch)
    assert loss == want_loss
    for g, w in zip(leaves(grads), leaves(want)):
        np.testing.assert_array_equal(g, w)


def test_loss_scale_scales_the_grads_exactly(batch):
    params = init_params(CFG, seed=0)
    loss, grads = loss_and_grads(params, CFG, *batch)
    loss8, grads8 = loss_and_grads(params, CFG, *batch, loss_scale=8.0)
    assert loss8 == loss  # the loss itself, unscaled
    for g, g8 in zip(leaves(grads), leaves(grads8)):
        np.testing.assert_array_equal(g8, 8 * g)  # a power of two: exact in float32


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, True, "2"])
def test_loss_scale_must_be_positive(batch, bad):
    params = init_params(CFG, seed=0)
    with pytest.raises(ValueError, match=r"loss_and_grads: loss_scale must be a finite number > 0"):
        loss_and_grads(params, CFG, *batch, loss_scale=bad)


def test_products_under_computing_in_land_on_the_grid(batch):
    params = init_params(CFG, seed=0)
    with computing_in("bf16"):
        logits = forward(params, CFG, batch[0])  # the head's product: its output rounded
    np.testing.assert_array_equal(round_to(logits, "bf16"), logits)
    plain = forward(params, CFG, batch[0])
    assert not np.array_equal(round_to(plain, "bf16"), plain)
    np.testing.assert_allclose(logits, plain, atol=0.05)


@pytest.mark.parametrize("name", ["bf16-mixed", "fp16-mixed"])
def test_mixed_grads_are_on_the_grid_and_near_fp32(batch, name):
    params = init_params(CFG, seed=0)
    fmt = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}[name]
    loss, grads = Precision(name).loss_and_grads(params, CFG, *batch)
    want_loss, want = loss_and_grads(params, CFG, *batch)
    assert abs(loss - want_loss) < 0.01
    g, w = np.concatenate([a.ravel() for a in leaves(grads)]), \
        np.concatenate([a.ravel() for a in leaves(want)])
    np.testing.assert_array_equal(round_to(g, fmt), g)
    assert g.dtype == np.float32
    assert np.linalg.norm(g - w) / np.linalg.norm(w) < 0.05


def test_fp16_without_scaling_flushes_small_grads_and_scaling_keeps_them(batch):
    params = init_params(CFG, seed=0)
    _, want = loss_and_grads(params, CFG, *batch)
    w = np.concatenate([a.ravel() for a in leaves(want)])
    flushed = {}
    for label, scaler in (("plain", None), ("scaled", DynamicLossScaler())):
        _, grads = Precision("fp16-mixed", scaler).loss_and_grads(params, CFG, *batch)
        g = np.concatenate([a.ravel() for a in leaves(grads)])
        flushed[label] = int(((g == 0) & (w != 0)).sum())
    assert flushed["plain"] > 0 and flushed["scaled"] < flushed["plain"]


def test_an_overflowing_scale_skips_the_step_and_backs_off(batch):
    params = init_params(CFG, seed=0)
    before = [a.copy() for a in leaves(params)]
    scaler = DynamicLossScaler(init=2.0 ** 40)  # scaled grads far past FP16's 65504
    precision = Precision("fp16-mixed", scaler)
    opt = AdamW(params, lr=1e-2)
    loss, norm = train_step(params, CFG, opt, *batch, precision=precision)
    assert math.isfinite(loss) and norm == math.inf and precision.skipped_last
    assert scaler.scale == 2.0 ** 39 and scaler.skipped == 1 and opt.step_count == 0
    for a, b in zip(leaves(params), before):
        np.testing.assert_array_equal(a, b)


def test_bf16_weights_stay_on_the_grid_and_lose_tiny_updates(batch):
    params = init_params(CFG, seed=0)
    precision = Precision("bf16")
    opt = AdamW(params, lr=1e-3, weight_decay=0.0)
    train_step(params, CFG, opt, *batch, precision=precision)
    for a in leaves(params):
        np.testing.assert_array_equal(round_to(a, "bf16"), a)
    gain = params["blocks"][0]["attn_norm"]["weight"]  # ones: BF16's spacing above 1 is 2^-7
    assert np.all(gain == 1.0) or np.all(np.abs(gain - 1.0) >= 2.0 ** -8)
    one = np.array([1.0], dtype=np.float32)
    precision.after_step({"w": one})  # not a model's params: any tree works
    tiny = {"w": one + np.float32(2.0 ** -9)}  # below half a spacing: lost
    precision.after_step(tiny)
    assert tiny["w"][0] == 1.0


def test_bad_precision():
    with pytest.raises(ValueError, match=r"unknown precision 'fp8'; choose one of fp32, bf16, "
                                         r"bf16-mixed, fp16-mixed"):
        Precision("fp8")
    with pytest.raises(ValueError, match=r"scaler must be a DynamicLossScaler or None"):
        Precision("fp16-mixed", scaler=2.0 ** 16)
    assert make_precision("fp16-mixed").scaler.scale == 2.0 ** 16
    assert make_precision("bf16-mixed").scaler is None


def test_cli_trains_in_fp16_mixed_and_resumes_with_the_scaler(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--task", "induction", "--quick", "--steps", "4", "--samples", "0", "--out", str(out),
            "--precision", "fp16-mixed"]
    assert train.main(args) == 0
    text = capsys.readouterr().out
    assert "fp16-mixed" in text and "loss scale 65536; 0 steps skipped for an overflow" in text
    assert train.main(["--task", "induction", "--quick", "--steps", "6", "--samples", "0",
                       "--out", str(out), "--resume"]) == 0
    assert "loss scale 65536" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        train.main(["--task", "induction", "--quick", "--steps", "8", "--out", str(out),
                    "--resume", "--precision", "bf16"])
    assert info.value.code == 2
    assert "has --precision fp16-mixed" in capsys.readouterr().err


def test_cli_rejects_an_unknown_precision(capsys):
    with pytest.raises(SystemExit) as info:
        train.main(["--precision", "fp8"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--precision" in err and "fp16-mixed" in err



def test_fp32_precision_combines_with_micro_batches(batch):
    params, plain = init_params(CFG, seed=0), init_params(CFG, seed=0)
    for p, precision in ((params, Precision("fp32")), (plain, None)):
        train_step(p, CFG, AdamW(p, lr=1e-2), *batch, precision=precision, micro_batches=2)
    for a, b in zip(leaves(params), leaves(plain)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"precision= .* does not combine with lora, checkpoint "
                                         r"or micro_batches"):
        train_step(params, CFG, AdamW(params), *batch, precision=Precision("bf16-mixed"),
                         micro_batches=2)
