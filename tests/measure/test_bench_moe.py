"""The MoE decode benchmark runs end to end at tiny sizes (correctness only: no timing is
asserted): the experts read against the batch, the bytes from them, the suite's section."""
import pytest

from benchmarks.bench_moe import moe_config, print_moe, run_moe
from benchmarks.output import Output
from benchmarks.suite import DEFAULT_SECTIONS, SECTIONS
from transformer_lab.measure.expert_load import decode_weight_bytes


def test_the_moe_section_on_a_tiny_model():
    cfg = moe_config(vocab=64, d_model=16, n_heads=2, n_kv_heads=1, n_layers=2, d_ff=32,
                     moe_d_ff=8, max_seq=16)
    r = run_moe(cfg=cfg, batches=(1, 8), repeats=1)
    one, eight = r["rows"]
    assert (one["B"], eight["B"]) == (1, 8)
    assert one["experts_read"] == one["expected"] == 2
    assert one["bytes_moe"] == one["bytes_formula"] == decode_weight_bytes(cfg, 2)
    assert one["bytes_dense"] == pytest.approx(one["bytes_moe"], rel=0.01)  # the same FLOPs
    assert 2 < eight["experts_read"] <= 8 and eight["bytes_moe"] > one["bytes_moe"]
    assert eight["moe"]["repeats"] == eight["dense"]["repeats"] == 1
    print_moe(Output(quiet=True), r)


def test_moe_is_a_section_run_when_named():
    assert "moe" in SECTIONS and "moe" not in DEFAULT_SECTIONS
