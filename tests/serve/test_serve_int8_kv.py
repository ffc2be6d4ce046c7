"""The engine's int8 KV pool: blocks in the same memory, what a block holds as it fills, the
greedy outputs against the float pool, and the bad option."""
import numpy as np
import pytest

from serve_helpers import model, no_leaks, prompts
from transformer_lab import llama_config
from transformer_lab.measure.agreement import forced_agreement, greedy_agreement
from transformer_lab.serve import LLM, SamplingParams
from transformer_lab.serve.kv_pool import PagedKVPool

SMOLLM2 = llama_config(vocab=49152, d_model=576, n_heads=9, n_kv_heads=3, n_layers=30,
                       d_ff=1536, max_seq=8192, dtype=np.float32)
POOL_CFG = llama_config(vocab=64, d_model=64, n_heads=4, n_kv_heads=2, n_layers=1, d_ff=64,
                        max_seq=64, dtype=np.float32)


def test_the_same_memory_holds_over_3_5_times_the_blocks():
    for bs in (16, 32):
        f32 = PagedKVPool.bytes_per_block(SMOLLM2, bs, "float32")
        int8 = PagedKVPool.bytes_per_block(SMOLLM2, bs, "int8")
        assert f32 == 2 * 30 * 3 * 64 * 4 * bs
        assert int8 == 2 * 30 * 3 * 64 * bs + 30 * 2 * (3 * 64 + bs * 3)  # codes + fp16 scales
        assert f32 / int8 >= 3.5
    memory = 40 * PagedKVPool.bytes_per_block(SMOLLM2, 16, "float32")
    cfg, params = model("llama_gqa")
    a = LLM.from_params(cfg, params, kv_cache_memory=memory // 40 * 40)
    b = LLM.from_params(cfg, params, kv_cache_memory=memory // 40 * 40, kv_cache_dtype="int8")
    assert b.num_blocks >= 3.5 * a.num_blocks and b.pool.nbytes <= a.pool.nbytes


def _fill(pool, x, steps):
    """Write x [n, G, D] into block 0 in pieces of the given sizes, as prefill then decodes."""
    start = 0
    for n in steps:
        slots = np.arange(start, start + n)
        pool.store(0, slots, x[slots], x[slots])
        start += n
    k, v = pool.gather(0, np.array([[0]]))
    return k[0, :start], v[0, :start]


def test_a_block_written_whole_is_rounded_once_per_channel():
    pool = PagedKVPool(POOL_CFG, 2, 16, "int8")
    x = np.random.default_rng(0).standard_normal((16, 2, 16)).astype(np.float32)
    x[:, 0, 3] *= 30  # an outlier key channel: its own scale
    k, v = _fill(pool, x, [16])
    step = np.abs(x).max(axis=0) / 127  # per channel over the block
    assert (np.abs(k - x) <= 0.5 * step * 1.002 + 1e-7).all()
    assert pool.k_scale[0].dtype == np.float16 and pool.v_scale[0].shape == (2, 16, 2)
    v_step = np.abs(x).max(axis=-1, keepdims=True) / 127  # values: per token and head
    assert (np.abs(v - x) <= 0.5 * v_step * 1.002 + 1e-7).all()


def test_a_block_filled_token_by_token_never_clips_and_stays_close():
    pool = PagedKVPool(POOL_CFG, 2, 16, "int8")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 2, 16)).astype(np.float32)
    x[10, 1, 5] = 40.0  # a late large key: its channel's scale grows, held rows re-quantized
    k, _ = _fill(pool, x, [3] + [1] * 13)
    step = np.abs(x).max(axis=0) / 127
    err = np.abs(k - x)
    assert err.max() > 0 and (err <= 1.5 * step + 1e-6).all()  # no clipping anywhere
    assert np.abs(k[10, 1, 5] - 40.0) <= 0.5 * step[1, 5] * 1.002
    whole, _ = _fill(PagedKVPool(POOL_CFG, 2, 16, "int8"), x, [16])
    # rounded again only where a channel's scale grew: a little more error, not more
    assert np.linalg.norm(k - x) < 2 * np.linalg.norm(whole - x)


def test_a_write_at_a_blocks_first_slot_forgets_its_earlier_owner():
    pool = PagedKVPool(POOL_CFG, 2, 16, "int8")
    big = np.full((16, 2, 16), 100.0, np.float32)
    _fill(pool, big, [16])
    small = np.random.default_rng(2).standard_normal((4, 2, 16)).astype(np.float32) * 0.01
    k, _ = _fill(pool, small, [4])
    assert np.abs(k - small).max() <= 0.5 * np.abs(small).max() / 127 * 1.01


def test_greedy_outputs_agree_with_the_float_pool():
    cfg, params = model("llama_gqa")
    ps = prompts(cfg)
    sp = SamplingParams(max_tokens=24, temperature=0)
    runs = {}
    for dtype in ("auto", "int8"):
        llm = LLM.from_params(cfg, params, block_size=4, num_blocks=200, kv_cache_dtype=dtype)
        runs[dtype] = [o.outputs[0].token_ids for o in llm.generate(ps, sp)]
        no_leaks(llm)
    a = greedy_agreement(params, cfg, ps, runs["auto"], runs["int8"])
    assert a["tokens"] == 24 * len(ps) and a["agree"] >= 0.95
    for p in a["parted"]:  # where they part, the float model's top two were close
        assert p["gap"] < 0.5


def test_greedy_agreement_is_counted_position_by_position():
    cfg, params = model("llama_gqa")
    a = greedy_agreement(params, cfg, [[1, 2, 3], [4, 5]], [[7, 8, 9], [1, 2]], [[7, 8, 9], [1, 3]])
    assert (a["tokens"], a["same"], a["identical"]) == (5, 4, 1)
    assert [(p["request"], p["at"]) for p in a["parted"]] == [(1, 1)] and a["parted"][0]["gap"] >= 0


def test_teacher_forced_agreement_judges_each_position_in_the_references_context():
    cfg, params = model("llama_gqa")
    ps = prompts(cfg)
    sp = SamplingParams(max_tokens=12, temperature=0)
    llm = LLM.from_params(cfg, params, block_size=4, num_blocks=200)
    llm.generate(ps[:1], sp, use_tqdm=False)  # request numbers no longer start at 0
    greedy = [o.outputs[0].token_ids for o in llm.generate(ps, sp, use_tqdm=False)]
    same = forced_agreement(llm, ps, greedy, sp)  # its own greedy tokens: every position agrees
    assert (same["tokens"], same["same"], same["misses"]) == (12 * len(ps), 12 * len(ps), [])
    edited = [list(t) for t in greedy]
    edited[1][3] = (edited[1][3] + 1) % cfg.vocab  # a token the model would not pick
    forced = forced_agreement(llm, ps, edited, sp)
    miss = next(m for m in forced["misses"] if (m["request"], m["at"]) == (1, 3))
    assert miss["margin"] < 0 and miss["gap"] > 0
    assert all(m["request"] == 1 and m["at"] >= 3 for m in forced["misses"])
    no_leaks(llm)


@pytest.mark.parametrize("bad", ["fp8", "INT8", None, 8])
def test_an_unknown_kv_cache_dtype_is_one_clear_line(bad):
    cfg, params = model("llama_gqa")
    with pytest.raises(ValueError) as info:
        LLM.from_params(cfg, params, kv_cache_dtype=bad)
    assert str(info.value) == ("LLM: kv_cache_dtype must be one of auto, float32, int8, "
                               f"got {bad!r}")


def test_the_server_cli_refuses_an_unknown_kv_cache_dtype_with_exit_2(capsys):
    from transformer_lab.cli.serve import build_parser
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--kv-cache-dtype", "fp8"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "--kv-cache-dtype: invalid choice: 'fp8'" in err
    assert build_parser().parse_args(["--kv-cache-dtype", "int8"]).kv_cache_dtype == "int8"
