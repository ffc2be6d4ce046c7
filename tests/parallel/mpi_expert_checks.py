"""Run under mpiexec by tests/parallel/test_expert.py: expert parallel over MPI processes, each
rank its own rows, the logits equal one process's and the all_to_all bytes the routing's."""
import numpy as np

from transformer_lab import forward, init_params, llama_config
from transformer_lab.parallel import MPIComm, world
from transformer_lab.parallel.expert import ep_all_to_all_bytes, ep_forward, ep_shard

c = world()
assert isinstance(c, MPIComm), type(c)
for fields in (dict(), dict(router="sigmoid", n_group=4, topk_group=2, n_shared_experts=1,
                            first_dense_layers=1), dict(capacity_factor=0.75)):
    cfg = llama_config(vocab=40, d_model=16, n_heads=4, n_kv_heads=2, n_layers=3, d_ff=32,
                       max_seq=16, n_experts=8, experts_per_token=3, moe_d_ff=12,
                       dtype=np.float64, **fields)
    params = init_params(cfg, seed=3)  # every rank builds the same whole params
    for p in params["blocks"][cfg.first_dense_layers:]:
        p["moe"]["router"] *= 30.0
    tokens = np.random.default_rng(3).integers(0, cfg.vocab, (2 * c.size, 5))
    acts = {}
    ref = forward(params, cfg, tokens, acts=acts)
    c.reset_stats()
    mine = np.array_split(tokens, c.size)[c.rank]
    logits = ep_forward(ep_shard(params, cfg, c.rank, c.size), cfg, mine, c)
    np.testing.assert_allclose(logits, np.array_split(ref, c.size)[c.rank], rtol=0, atol=1e-12)
    layers = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
    want = sum(ep_all_to_all_bytes(cfg, np.array_split(acts[f"blocks[{i}].moe.experts"], c.size),
                                   c.rank) for i in layers)
    assert c.stats["all_to_all"] == {"calls": 3 * len(layers), "bytes": want}, c.stats
print(f"rank {c.rank}: expert parallel ok", flush=True)
