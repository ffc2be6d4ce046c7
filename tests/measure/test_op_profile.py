"""benchmarks/op_profile.py: every op of a decode step and of a prefill is counted once
per call, the logits are those of an unwrapped forward, and the wrappers are gone after.
Correctness only: no timing is asserted."""
import numpy as np

from benchmarks.op_profile import OPS, op_profile
from transformer_lab import TINY, KVCache, forward, init_params, pack_weights
from transformer_lab import cache as cache_module
from transformer_lab import model

CFG = TINY
PARAMS = pack_weights(init_params(CFG, seed=3), CFG)
PROMPT = np.random.default_rng(0).integers(0, CFG.vocab, size=(1, 6))


def _calls(profile):
    return {label: calls for label, _, calls in profile["rows"]}


def test_a_decode_step_counts_each_op_per_layer():
    cache = KVCache(CFG, 1, 7)
    forward(PARAMS, CFG, PROMPT, cache=cache)
    logits = []

    def step():
        cache.truncate(6)
        logits.append(forward(PARAMS, CFG, PROMPT[:, :1], cache=cache))
    profile = op_profile(step, steps=2)
    L = CFG.n_layers
    assert _calls(profile) == {
        "weight products (4 per layer)": 4 * L, "the head (its product)": 1,
        "attention_core": L, "the cache write (KVCache._store)": L,
        # q and k are neighbouring columns of the packed Q/K/V product: one rotation a layer
        "apply_rope (q and k)": L, "RoPE cos/sin (once a step)": 1, "rms_norm": 2 * L + 1,
        "silu": L, "embed": 1, "the rest (adds, reshapes, Python)": 0}
    assert len(logits) == 2 + 2 * 2
    for got in logits[1:]:  # every step, timed or not, gives the same logits
        np.testing.assert_array_equal(got, logits[0])
    assert profile["rows"][-1][0].startswith("the rest")
    assert all(ms >= 0 for _, ms, _ in profile["rows"][:-1])


def test_the_wrappers_are_removed_afterwards():
    before = {(where, name): getattr(where, name) for _, where, name in OPS}
    op_profile(lambda: forward(PARAMS, CFG, PROMPT), steps=1)
    for (where, name), f in before.items():
        assert getattr(where, name) is f
    assert "_store" not in vars(cache_module.KVCache)  # inherited, as before
    assert model.matmul_rows.__module__ == "transformer_lab.products"
