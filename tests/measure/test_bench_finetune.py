"""The finetune benchmark section on a tiny model (the real run needs SmolLM2): its rows,
ratios and ledger are computed and printed; no timing is asserted."""
import numpy as np

from benchmarks.bench_finetune import print_finetune, run_finetune
from benchmarks.output import Output
from transformer_lab import init_params, llama_config, pack_weights


def test_finetune_section_on_a_tiny_model():
    cfg = llama_config(vocab=64, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
                       max_seq=16, tie_embeddings=True, dtype=np.float32)
    params = pack_weights(init_params(cfg), cfg)
    r = run_finetune(repeats=1, use_torch=False, model=(cfg, params, "tiny"), B=2, T=8)
    assert r["torch_skipped"] and "full_over_torch" not in r
    assert r["lora_params"] < r["params"] and r["adamw_over_bare"] > 0
    assert [(e["lora"], e["checkpoint"]) for e in r["ledger"]] == \
        [(False, False), (False, True), (True, False), (True, True)]
    assert all(e["traced_peak"] > 0 and e["total"] > e["activations"] for e in r["ledger"])
    print_finetune(Output(quiet=True), r)
    print_finetune(Output(quiet=True), {"skipped": "no model"})


def test_the_fine_tune_step_has_its_target_row():
    from benchmarks.suite import FINETUNE_TORCH_RATIO_MAX, evaluate_targets
    for ratio, met in ((1.2, True), (1.6, False), (None, None)):
        section = {"full_over_torch": ratio, "torch_skipped": "no torch"}
        (row,) = [t for t in evaluate_targets({"finetune": section}) if "fine-tune" in t["name"]]
        assert row["met"] is met and row["target"] == f"<= {FINETUNE_TORCH_RATIO_MAX}x"
        assert row["measured_text"] == (f"{ratio:.2f}x" if ratio else "skipped: no torch")
