"""python -m transformer_lab.train --experts: a mixture of experts trained from scratch through
the one training loop, its options' errors, the report (the loss against FLOPs, the load
per expert and what a capacity dropped) and --resume keeping the experts."""
from __future__ import annotations

import json

import numpy as np
import pytest

import transformer_lab as tl
from transformer_lab.cli import train
from transformer_lab.measure.flops import train_step_flops
from transformer_lab.measure.moe_study import active_params, param_count


@pytest.mark.parametrize("argv,needle", [
    (["--experts", "2", "--top-k", "3"], "--top-k (3) must be at most --experts (2)"),
    (["--top-k", "2"], "--top-k applies to a mixture of experts: give --experts E too"),
    (["--balance-coef", "0.1"], "--balance-coef applies to a mixture of experts"),
    (["--capacity-factor", "1.5"], "--capacity-factor applies to a mixture of experts"),
    (["--experts", "0"], "--experts: must be >= 1, got 0"),
    (["--experts", "4", "--top-k", "0"], "--top-k: must be >= 1, got 0"),
    (["--experts", "4", "--capacity-factor", "0"], "--capacity-factor: must be a finite number > 0"),
    (["--experts", "4", "--balance-coef", "-1"], "--balance-coef: must be a finite number >= 0"),
    (["--experts", "4", "--arch", "gpt2"], "--experts needs --arch llama"),
    (["--init", "smollm2", "--task", "json-extract", "--experts", "4"],
     "--experts applies to training from scratch, not to fine-tuning with --init"),
])
def test_bad_expert_options_exit_2_with_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as info:
        train.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m transformer_lab.train: error: ")
    assert needle in err, err


def test_a_quick_moe_run_reports_flops_load_and_drops_then_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--task", "addition", "--quick", "--experts", "4", "--top-k", "2",
              "--capacity-factor", "1.0", "--samples", "1", "--out", str(out)]
    assert train.main([*common, "--steps", "5"]) == 0
    text = capsys.readouterr().out
    cfg, params, extra = tl.load_checkpoint(out / "checkpoint.npz")
    assert (cfg.n_experts, cfg.experts_per_token, cfg.capacity_factor) == (4, 2, 1.0)
    assert cfg.balance_loss_coef == train.MOE_DEFAULTS["balance_coef"]
    assert params["blocks"][0]["moe"]["w_gate"].shape == (4, cfg.d_model, cfg.d_ff)
    assert (f"mixture of experts: 4 experts of width {cfg.d_ff} per block, top-2, balance coef "
            f"0.01, capacity factor 1; {active_params(cfg):,} of the {param_count(cfg):,} "
            f"params active per token") in text
    per_step = train_step_flops(cfg, train.QUICK["batch"], cfg.max_seq)
    history = json.loads((out / "history.json").read_text())["history"]
    assert [r["flops"] for r in history] == [per_step * s for s in range(1, 6)]
    assert "loss against steps and training FLOPs" in text
    assert f"step      5  {5 * per_step:.3e} FLOPs  loss" in text
    choices = train.QUICK["batch"] * cfg.max_seq * 2
    assert f"expert load on a held-out batch of {choices // 2} tokens ({choices} choices" in text
    for i in range(cfg.n_layers):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"  layer {i}: CV "))
        load = [int(v) for v in line.split("load ")[1].split(",")[0].split()]
        assert len(load) == 4 and sum(load) == choices and "dropped (" in line
    assert "of 1 right" in text

    assert train.main([*common, "--steps", "7", "--resume"]) == 0
    assert "resuming at step 5" in capsys.readouterr().out
    assert tl.load_checkpoint(out / "checkpoint.npz")[2]["step"] == 7
    with pytest.raises(SystemExit) as info:
        train.main([*common, "--steps", "9", "--resume", "--experts", "8"])
    assert info.value.code == 2
    assert "has --experts 4; --experts 8 would need a new run" in capsys.readouterr().err


def test_the_readme_command_defaults_to_top_2_and_a_dense_run_has_no_moe_report(tmp_path,
                                                                                capsys):
    args = train.resolve(train.build_parser().parse_args(["--experts", "8"]),
                         train.build_parser())
    assert (args.experts, args.top_k, args.balance_coef, args.capacity_factor) == \
        (8, 2, 0.01, None)
    one = train.resolve(train.build_parser().parse_args(["--experts", "1"]),
                        train.build_parser())
    assert one.top_k == 1  # at most E
    assert train.main(["--quick", "--steps", "2", "--samples", "0",
                       "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "mixture of experts" not in text and "expert load" not in text
    assert "loss against steps and training FLOPs" in text
    cfg, _, _ = tl.load_checkpoint(tmp_path / "checkpoint.npz")
    assert cfg.n_experts == 0


def test_loss_against_flops_rows_by_hand():
    history = [{"step": s, "loss": float(10 - s), "flops": 100 * s} for s in range(1, 11)]
    lines = train.loss_against_flops(history, points=2)
    assert lines[1:] == ["  step      5  5.000e+02 FLOPs  loss 7.000",
                         "  step     10  1.000e+03 FLOPs  loss 2.000"]
    assert train.loss_against_flops([{"step": 1, "loss": 1.0}]) == []  # an old checkpoint's
    assert np.isclose(float(lines[2].split()[-1]), np.mean([10 - s for s in range(6, 11)]))
