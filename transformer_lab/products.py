"""How x [M, in] @ w [in, out] is computed: the one place the product's form is chosen.

Every weight product of the core (model.py's linear layers, the packed ones, the head,
and mla.py's projections) goes through matmul_rows, so the decode step, the prefill
and the speculative verify pass all take the same choice. row_invariant_products makes
a row's result independent of the rows that share its product (the serving engine's
batch_invariant mode).
"""
from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from .precision import product

# The form, by the number of rows M. OpenBLAS's GEMM packs the weight into its buffers
# on every call, which costs more than the arithmetic when M is small, while a GEMV
# streams the weight once per row without packing. So M = 2..4 takes a GEMV per row,
# M = 5..7 is zero-padded to one GEMM of 8 rows, and the rest is one GEMM (the dated
# measurements: docs/performance.md, "How products.py chose its forms"; `python -m
# benchmarks --only serving` re-measures every form side by side, small_m_table).
# A row's GEMV result equals the M = 1 product's, so small decode batches give the
# same bits as one sequence alone. (On this OpenBLAS a GEMM row also comes out the same
# for any M >= 2, but no BLAS promises that: batch invariance uses fixed shapes below.)
_invariant_rows = contextvars.ContextVar("invariant_rows", default=0)

# The two storages of a weight w [in, out]: row-major [in, out] (init_params' arrays,
# what x @ W reads plainly), or row-major [out, in] seen through its transpose (which a
# GEMM reads as W^T x^T). Packed params (params.pack_weights, load_gguf) hold both: each
# matrix has its longer side contiguous (params.packed_order, measured there).
IN_OUT, OUT_IN = "in_out", "out_in"
# M -> form, for each storage; M not listed takes one GEMM. For OUT_IN, M=2 takes a GEMV
# per row (its rows keep the M=1 bits, as for IN_OUT) and the rest one GEMM.
FORMS = {
    IN_OUT: {**{m: "gemv_rows" for m in range(2, 5)}, **{m: "pad8" for m in range(5, 8)}},
    OUT_IN: {2: "gemv_rows"},
}
_PAD_TO = 8
# From this many rows, an OUT_IN GEMM reads the weight through its transpose (x @ W, BLAS's
# trans flag) instead of computing (W^T x^T)^T and copying it to row-major: the copy of a
# [M, out] result is strided, and for the head (out = 49,152) it cost more than the GEMM.
_DIRECT_FROM = 128


def storage(w):
    """OUT_IN when w [in, out] is the transposed view of a row-major [out, in] array."""
    flags = w.flags  # the transpose is row-major exactly when w is column-major
    return OUT_IN if flags.f_contiguous and not flags.c_contiguous else IN_OUT


def matmul_rows(x, w):
    """x [..., in] @ w [in, out] as 2-D products over all rows (NumPy's matmul of a stacked
    [B, T, in] by a 2-D weight can be several times slower). The form depends on w's
    storage and the row count M (see above): one GEMM, one GEMV per row, or a GEMM padded
    to 8 rows. Under row_invariant_products(rows), always GEMMs of exactly `rows` rows
    (zero-padded), so each row's result is the same whatever rows share the product.
    Returns a row-major [..., out] in the dtype of x and w. Under
    precision.computing_in(fmt) the inputs and the output are rounded to fmt."""
    y = product(x.reshape(-1, x.shape[-1]), w, _chosen_form)  # [M, out]
    return y.reshape(*x.shape[:-1], w.shape[-1])


def _chosen_form(x2, w):
    kind, rows = storage(w), _invariant_rows.get()  # the storage read once per product
    if rows:
        return _fixed_block_product(x2, w, rows, kind)
    return _product(FORMS[kind].get(x2.shape[0], "gemm"), x2, w, kind)


def product_form(form, x2, w):
    """x2 [M, in] @ w [in, out] by the named form, row-major [M, out]: "gemm" (one call;
    for OUT_IN storage and 1 < M < _DIRECT_FROM the weight is on the left, (W^T x^T)^T),
    "gemv_rows" (one GEMV per row) or "pad8" (one GEMM of the rows padded with zeros to a
    multiple of 8)."""
    return _product(form, x2, w, storage(w))


def _product(form, x2, w, kind):
    if form == "gemv_rows":
        y = np.empty((x2.shape[0], w.shape[1]), dtype=np.result_type(x2.dtype, w.dtype))
        for i in range(x2.shape[0]):
            np.matmul(x2[i], w, out=y[i])
        return y
    if form == "pad8":
        return _fixed_block_product(x2, w, _PAD_TO, kind)
    if kind == OUT_IN and 1 < x2.shape[0] < _DIRECT_FROM:
        return np.ascontiguousarray((w.T @ x2.T).T)
    return x2 @ w


def _fixed_block_product(x2, w, rows, kind):
    """x2 [M, in] @ w as GEMMs of exactly `rows` rows each, the last block zero-padded."""
    m = x2.shape[0]
    padded = -(-m // rows) * rows
    if padded != m:
        x2 = np.concatenate([x2, np.zeros((padded - m, x2.shape[1]), dtype=x2.dtype)])
    y = np.empty((padded, w.shape[1]), dtype=np.result_type(x2.dtype, w.dtype))
    for i in range(0, padded, rows):
        y[i:i + rows] = _product("gemm", x2[i:i + rows], w, kind)
    return y[:m]


def invariant_block_rows(weights, candidates=(32, 16, 8, 4, 2, 1), *, seed=0):
    """The largest row count in `candidates` at which a GEMM of exactly that many rows gives
    every row the same bits wherever it sits in the block, for each weight in `weights`.

    No BLAS promises this: a kernel may sum a row's products in another order at another
    place in its tile (this OpenBLAS on one AMD EPYC: rows 16-31 of a 32-row GEMM differ
    from rows 0-15; on an Intel Xeon 32 rows agreed). So it is checked, not assumed: one
    GEMM per candidate and weight, with the same two random rows repeated down the block,
    and every copy must equal the first bit for bit. The order of a row's sum does not
    depend on its values, so two rows find a difference. One row (a GEMV) always qualifies.
    Measured under the BLAS thread count in force: call it where the products will run."""
    rng = np.random.default_rng(seed)
    for rows in candidates:  # one row, a GEMV, needs no check
        if rows == 1 or all(_same_at_every_row(rng, w, rows) for w in weights):
            return rows
    return 1


def _same_at_every_row(rng, w, rows):
    probe = rng.standard_normal((2, w.shape[0])).astype(w.dtype)  # [2, in]
    x = np.tile(probe, (-(-rows // 2), 1))[:rows]  # [rows, in]: the two rows, alternating
    y = _fixed_block_product(x, w, rows, storage(w))  # the form row_invariant_products runs
    return bool(np.array_equal(y[0::2], np.broadcast_to(y[0], y[0::2].shape))
                and np.array_equal(y[1::2], np.broadcast_to(y[1], y[1::2].shape)))


@contextlib.contextmanager
def row_invariant_products(rows=8):
    """Within the block, every product in matmul_rows runs as GEMMs of exactly `rows`
    rows: BLAS picks its kernel and blocking by shape, so a fixed shape makes a row's
    result independent of how many rows share the product (the serving engine's
    batch_invariant mode), at a `rows` that invariant_block_rows found this BLAS to compute
    alike at every row of the block. Costs the padding, and small-M forms are not used."""
    token = _invariant_rows.set(int(rows))
    try:
        yield
    finally:
        _invariant_rows.reset(token)
