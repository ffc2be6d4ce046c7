"""transformer_lab's benchmarks: run them all with `python -m benchmarks` (add --quick for a short run).

Sections: attention_core throughput against a hand-written batched-matmul and an
einsum formulation and the machine's float32 matmul peak; forward tokens/s of a
mid-size model (and of the same model in PyTorch eager, when PyTorch is
installed); KV-cache decode against recomputing the prefix; KV-cache memory; one
training step (forward, backward, AdamW) against PyTorch eager, with its FLOP/s and
activation memory.
Every figure printed is also written to a JSON file with a record of the machine.
Benchmarks report numbers; the tests check correctness, never timings.
"""
from .suite import FULL, QUICK, Profile, evaluate_targets, run_all

__all__ = ["FULL", "QUICK", "Profile", "evaluate_targets", "run_all"]
