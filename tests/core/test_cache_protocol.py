"""The cache protocol forward() relies on: declared once (cache.CacheProtocol), met by
KVCache, MLAKVCache and the engine's StepCache, and nothing more asked of a cache."""
import numpy as np
import pytest

import transformer_lab as tl
from transformer_lab.cache import CACHE_CALLS, CacheProtocol, KVCache, MLAKVCache
from transformer_lab.streaming_cache import StreamingCache, StreamingCacheReference
from transformer_lab.serve.model_runner import StepCache

MLA = tl.Config(vocab=40, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_seq=32,
                attention="mla", kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                v_head_dim=6)


class ListeningCache:
    """The four calls around a KVCache, and the optional members at their defaults: what
    forward() may ask."""

    rotates_keys, attended, weights = False, None, None

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        if name not in CACHE_CALLS:
            raise AttributeError(name)
        method = getattr(self.inner, name)

        def call(*args, **kw):
            self.calls.append(name)
            return method(*args, **kw)
        return call


def test_the_protocol_is_its_four_calls_in_order():
    assert CACHE_CALLS == ("check", "positions", "attend", "advance")
    for cls in (KVCache, MLAKVCache, StreamingCache, StreamingCacheReference, StepCache):
        assert CacheProtocol in cls.__mro__  # (issubclass refuses a protocol with data members)
        # each call is the class's own, not the protocol's empty declaration
        assert all(getattr(cls, name) is not getattr(CacheProtocol, name) for name in CACHE_CALLS)


@pytest.mark.parametrize("cfg", [tl.TINY, MLA], ids=["gqa", "mla"])
def test_forward_asks_a_cache_only_the_four_calls_and_attend_returns_the_output(cfg):
    params = tl.init_params(cfg)
    tokens = np.array([[1, 2, 3, 4]])
    cache = ListeningCache(KVCache(cfg, 1, 8))
    logits = tl.forward(params, cfg, tokens, cache=cache)
    np.testing.assert_allclose(logits, tl.forward(params, cfg, tokens), atol=1e-12)
    L = cfg.n_layers
    assert cache.calls == ["positions", "check"] + ["attend"] * L + ["advance"]


def test_an_mla_config_makes_an_mla_cache_through_kvcache():
    cache = KVCache(MLA, 2, 8, mla_path="naive")
    assert type(cache) is MLAKVCache and cache.mla and cache.mla_path == "naive"
    assert repr(cache).startswith("MLAKVCache(layers=2, batch=2, length=0/8")
    plain = KVCache(tl.TINY, 1, 4)
    assert type(plain) is KVCache and not plain.mla
    with pytest.raises(ValueError, match="mla_path is an MLA cache's option"):
        KVCache(tl.TINY, 1, 4, mla_path="naive")
    with pytest.raises(ValueError, match="attention is 'gqa', not 'mla'"):
        MLAKVCache(tl.TINY, 1, 4)


def test_recording_through_a_cache_needs_what_it_attended_over():
    cache = ListeningCache(KVCache(tl.TINY, 1, 8))  # the four calls, no attended
    with pytest.raises(ValueError, match="acts need a cache that keeps what it attended over"):
        tl.forward(tl.init_params(tl.TINY), tl.TINY, np.array([[1, 2]]), cache=cache, acts={})


def test_a_cache_without_the_four_calls_is_refused():
    with pytest.raises(ValueError, match="cache must follow cache.CacheProtocol, got dict"):
        tl.forward(tl.init_params(tl.TINY), tl.TINY, np.array([[1, 2]]), cache={})


def test_the_optional_members_are_declared_with_the_defaults_forward_assumes():
    assert CacheProtocol.rotates_keys is False
    assert CacheProtocol.attended is None and CacheProtocol.weights is None
    assert KVCache.weights is None and StreamingCache.rotates_keys
    assert StepCache.attended is None  # the engine's pool records nothing
    duck = ListeningCache(KVCache(tl.TINY, 1, 8))
    assert isinstance(duck, CacheProtocol)

    class FourCallsOnly:  # without the optional members it is not a cache to forward()
        check = positions = attend = advance = staticmethod(lambda *args, **kw: None)
    assert not isinstance(FourCallsOnly(), CacheProtocol)
    with pytest.raises(ValueError, match="cache must follow cache.CacheProtocol, got FourCallsOnly"):
        tl.forward(tl.init_params(tl.TINY), tl.TINY, np.array([[1, 2]]), cache=FourCallsOnly())
