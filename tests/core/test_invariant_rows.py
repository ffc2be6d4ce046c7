"""Batch invariance's products: the block size is checked on this BLAS, not assumed.

products.invariant_block_rows picks the largest row count at which a GEMM gives a row the same
bits wherever it sits in the block; under row_invariant_products(rows) a row's product must
then be the same alone or among any others, at any offset."""
import numpy as np
import pytest

from transformer_lab import init_params, llama_config
from transformer_lab.products import invariant_block_rows, matmul_rows, row_invariant_products
from transformer_lab.serve.llm import INVARIANT_ROWS, product_weights


def weights():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape).astype(np.float32) for shape in ((64, 128), (96, 40))] \
        + [rng.standard_normal((101, 64)).astype(np.float32).T]  # a tied head's transposed view


def test_the_chosen_rows_give_each_row_the_same_bits_at_every_offset():
    ws = weights()
    rows = invariant_block_rows(ws, INVARIANT_ROWS)
    assert rows in INVARIANT_ROWS
    rng = np.random.default_rng(1)
    for w in ws:
        x = rng.standard_normal((3 * rows + 5, w.shape[0])).astype(np.float32)
        with row_invariant_products(rows):
            alone = matmul_rows(x[7:8], w)[0]
            for start in range(0, 8):  # row 7 at every offset of a block, among other rows
                got = matmul_rows(x[start:start + 2 * rows + 3], w)[7 - start]
                assert got.tobytes() == alone.tobytes()


def test_one_row_always_qualifies_and_the_candidates_are_tried_in_order():
    ws = weights()
    assert invariant_block_rows(ws, (1,)) == 1
    assert invariant_block_rows(ws, (2, 1)) in (2, 1)
    assert invariant_block_rows([], (32, 1)) == 32  # nothing to multiply: nothing can differ


def test_product_weights_lists_each_product_shape_once():
    cfg = llama_config(vocab=101, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=128,
                       max_seq=32, dtype=np.float32)
    from transformer_lab import pack_weights
    for params in (init_params(cfg, seed=0), pack_weights(init_params(cfg, seed=0), cfg)):
        shapes = sorted(w.shape for w in product_weights(params, cfg))
        assert len(shapes) == len(set((w.shape, w.strides) for w in product_weights(params, cfg)))
        assert (64, 101) in shapes  # the tied head, tok_emb.T
        assert (128, 64) in shapes and (64, 64) in shapes  # w_down [d_ff, d], wo [H*D, d]
