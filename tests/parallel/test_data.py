"""Data parallel through the one train_step: on 1..4 in-process ranks, with ZeRO 0..3, the
params, loss and grad norm after a few steps equal one process on the same global batches
(float64 1e-10), batches that do not divide by the ranks included (token-weighted);
micro-batches and block recompute too; LoRA's adapters (their grads are what is
all-reduced); the bytes of a step read from comm.stats (stages
0-2: 2 (N-1) Psi b summed over the ranks, stage 3 one more all-gather of the blocks and
one of the ends); buckets, overlap on and off, and the errors."""
import numpy as np
import pytest

from transformer_lab import AdamW, init_params, llama_config, named_params
from transformer_lab.parallel import run_ranks
from transformer_lab.parallel.data import data_parallel, shard_rows
from transformer_lab.training import LoRA
from transformer_lab.training.step import train_step

KW = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
CFG = llama_config(vocab=11, d_model=8, n_heads=2, n_layers=2, d_ff=16, max_seq=8,
                   dtype=np.float64)


def batches(steps, rows, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        t = rng.integers(0, CFG.vocab, (rows, 7))
        targets = np.roll(t, -1, axis=1)
        targets[:, :2] = -1  # unsupervised positions, unevenly spread over the rows
        targets[rng.random(rows) < 0.4, 2:4] = -1
        out.append((t, targets))
    return out


def one_process(data, **options):
    params = init_params(CFG, seed=3)
    opt = AdamW(params, **KW)
    history = [train_step(params, CFG, opt, t, y, clip=0.5, **options) for t, y in data]
    return params, history, opt.state_dict()


def parallel(n, zero, data, *, bucket_mb=1e-4, overlap=True, **options):
    def body(comm):
        params = init_params(CFG, seed=3 + comm.rank)  # rank 0's are broadcast
        opt, dp = data_parallel(comm, params, zero, bucket_mb=bucket_mb, overlap=overlap, **KW)
        history = []
        for t, y in data:
            mine = dp.shard(t, y)
            history.append(train_step(params, CFG, opt, *mine, clip=0.5, grad_sync=dp,
                                      **options))
        full = {k: a.copy() for k, a in named_params(opt.full_params() if zero else params)}
        return full, history, opt.state_dict(), dp.timings

    return run_ranks(n, body)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_equal_to_one_process(n, zero):
    data = batches(3, 6)  # 6 rows: 4 ranks get 2, 2, 1, 1
    want, history, state = one_process(data)
    want = dict(named_params(want))
    for got, got_history, got_state, _ in parallel(n, zero, data):
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12, err_msg=k)
            np.testing.assert_allclose(got_state["m"][k], state["m"][k], rtol=1e-9, atol=1e-14)
            np.testing.assert_allclose(got_state["v"][k], state["v"][k], rtol=1e-9, atol=1e-16)
        np.testing.assert_allclose(np.array(got_history), np.array(history), rtol=1e-10)


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_micro_batches_and_recompute(zero):
    data = batches(2, 8, seed=1)
    want, history, _ = one_process(data, micro_batches=2, checkpoint=True)
    for got, got_history, _, _ in parallel(2, zero, data, micro_batches=2, checkpoint=True):
        for k, a in named_params(want):
            np.testing.assert_allclose(got[k], a, rtol=1e-10, atol=1e-12, err_msg=k)
        np.testing.assert_allclose(np.array(got_history), np.array(history), rtol=1e-10)


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_lora_adapters_equal_one_process(zero):
    """Data parallel over LoRA: the trainable params are the adapters, so they are what is
    broadcast, all-reduced (or reduce-scattered) and stepped; the frozen weights never move."""
    data = batches(3, 6)

    def adapted():
        params = init_params(CFG, seed=3)
        lora = LoRA.init(params, CFG, rank=2, alpha=4, targets=LoRA.ALL_LINEAR, seed=1)
        for _, a in named_params(lora.adapters):
            a += 0.01  # B starts at zero: make every adapter's grad nonzero from the start
        return params, lora
    params, lora = adapted()
    opt = AdamW(lora.adapters, **KW)
    history = [train_step(params, CFG, opt, t, y, clip=0.5, lora=lora) for t, y in data]

    def body(comm):
        p, ranked = adapted()
        ranked_opt, dp = data_parallel(comm, ranked.adapters, zero, bucket_mb=1e-4, **KW)
        got = [train_step(p, CFG, ranked_opt, *dp.shard(t, y), clip=0.5, lora=ranked,
                          grad_sync=dp) for t, y in data]
        return dict(named_params(ranked.adapters)), got, ranked_opt.state_dict()

    for got, got_history, state in run_ranks(2, body):
        for k, a in named_params(lora.adapters):
            np.testing.assert_allclose(got[k], a, rtol=1e-10, atol=1e-14, err_msg=k)
            np.testing.assert_allclose(state["m"][k], opt.m[k], rtol=1e-9, atol=1e-14)
        np.testing.assert_allclose(np.array(got_history), np.array(history), rtol=1e-10)


def test_overlap_off_gives_the_same_bits_and_buckets_follow_bucket_mb():
    data = batches(2, 4)
    on = parallel(2, 0, data, overlap=True)
    off = parallel(2, 0, data, overlap=False)
    for (a, *_), (b, *_) in zip(on, off):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    one_bucket = parallel(2, 0, data, bucket_mb=100)
    assert one_bucket[0][3]["buckets"] == 1
    assert on[0][3]["buckets"] == 4  # a tiny bucket_mb: a bucket per unit (head, 2 blocks, embed)
    assert on[0][3]["comm_s"] > 0 and on[0][3]["exposed_s"] >= 0


@pytest.mark.parametrize("n", [2, 4])
def test_bytes_of_a_step(n):
    params = init_params(CFG, seed=3)
    psi = sum(a.nbytes for _, a in named_params(params))
    blocks = sum(a.nbytes for k, a in named_params(params) if k.startswith("blocks"))
    data = batches(1, 4)

    def body(comm, zero):
        p = init_params(CFG, seed=3)
        opt, dp = data_parallel(comm, p, zero, **KW)
        t, y = dp.shard(*data[0])
        comm.reset_stats()
        train_step(p, CFG, opt, t, y, clip=0.5, grad_sync=dp)
        return comm.stats

    def total(stats, call):
        return sum(s.get(call, {"bytes": 0})["bytes"] for s in stats)

    scalars = 3 * 2 * (n - 1) * 8  # the supervised count, the loss, the norm: one number each
    dp = run_ranks(n, body, 0)
    assert total(dp, "all_reduce") == 2 * (n - 1) * psi + scalars - 2 * (n - 1) * 8
    for zero in (1, 2):
        st = run_ranks(n, body, zero)
        assert total(st, "reduce_scatter") + total(st, "all_gather") == 2 * (n - 1) * psi
    st = run_ranks(n, body, 3)
    assert total(st, "reduce_scatter") == (n - 1) * psi
    # every unit gathered for the forward, the blocks again for their backward
    assert total(st, "all_gather") == (n - 1) * (psi + blocks)


def test_uneven_shards_and_errors():
    class C:
        size, rank = 4, 3
    assert shard_rows(6, C) == (5, 6)
    with pytest.raises(ValueError, match="cannot be shared by 4 ranks"):
        run_ranks(4, lambda c: data_parallel(c, init_params(CFG), 0)[1].shard(
            np.zeros((3, 7), int), np.zeros((3, 7), int)))
    with pytest.raises(ValueError, match="zero"):
        run_ranks(1, lambda c: data_parallel(c, init_params(CFG), 4))
    with pytest.raises(ValueError, match="bucket_mb"):
        run_ranks(1, lambda c: data_parallel(c, init_params(CFG), 0, bucket_mb=0))
