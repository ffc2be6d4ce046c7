"""Sampling and generation: pick the next token, prefill once, then decode with the cache.

generate() takes a [B, T] batch, or a list of prompts of different lengths:
those are prefilled together, each row then decodes at its own position, and
every row comes back as if its prompt had been run alone.
"""
from __future__ import annotations

import numpy as np

from .cache import KVCache
from .config import Config
from .model import check_tokens, forward
from .ops import softmax
from .params import check_params
from .validate import check_int, check_number


def _check_sampling(greedy, temperature, top_k, vocab, seed=None, top_p=1.0, min_p=0.0):
    """The sampling arguments, each checked by name: bad ones are a ValueError, not a
    NumPy error (or worse, taken silently: top_k=True is not 1)."""
    if not isinstance(greedy, (bool, np.bool_)):
        raise ValueError(f"greedy must be True or False, got {greedy!r}")
    check_number(temperature, "temperature", low=0)
    if top_k is not None:
        check_int(top_k, "top_k", low=1, high=vocab, what=f"None or an int in [1, {vocab}]")
    check_number(top_p, "top_p", low=0, high=1, low_open=True)
    check_number(min_p, "min_p", low=0, high=1)
    generator = (np.random.Generator, np.random.SeedSequence)
    if seed is not None and not isinstance(seed, generator):
        check_int(seed, "seed", low=0, what="None or an int >= 0")


def next_token_probs(logits, *, temperature=1.0, top_k=None, top_p=1.0, min_p=0.0):
    """The distribution sample_next draws from, per row of logits [B, vocab], in float64:
    softmax of logits / temperature, then cut, in HF transformers' order, to
      top_k   the k largest logits (every logit tied with the k-th stays);
      top_p   the nucleus: the most likely tokens until their mass reaches top_p;
      min_p   the tokens at least min_p times as likely as the most likely one;
    each cut renormalized before the next. top_p=1 and min_p=0 cut nothing.

    The nucleus rule, exactly: a token stays when the tokens strictly more likely than it
    hold less than top_p of the mass. So the smallest set of most likely tokens whose
    mass reaches top_p stays, together with every token tied with the least likely of
    them: a tie at the boundary stays whole, whatever order a sort would put it in
    (HF's TopPLogitsWarper keeps the same set when there is no tie there, and keeps the
    tied tokens its sort happens to put first when there is). The most likely token
    always stays. The masses are float64 sums.

    The one definition of how sampling shapes a distribution: speculative decoding shapes
    the target's and the draft's with it too. temperature > 0 here; temperature 0 (or
    greedy) means argmax, which has no distribution to shape.
    """
    logits = np.asarray(logits).astype(np.float64) / float(temperature)
    if top_k is not None:
        kth = np.sort(logits, axis=-1)[..., -top_k][..., None]  # the k-th largest per row
        logits = np.where(logits < kth, -np.inf, logits)
    p = softmax(logits, axis=-1)
    if top_p < 1:
        p = _renormalized(np.where(p >= _nucleus_floor(p, top_p)[..., None], p, 0.0))
    if min_p > 0:
        p = _renormalized(np.where(p >= min_p * p.max(axis=-1, keepdims=True), p, 0.0))
    return p


def _nucleus_floor(p, top_p):
    """Per row of p [..., V], the least probability a token in the nucleus has: sorted
    from most to least likely, the tokens before the i-th hold `above[i]`, and the i-th
    stays while that is below top_p (the first always does)."""
    ordered = -np.sort(-p, axis=-1)  # [..., V], most likely first
    above = np.zeros_like(ordered)  # [..., V], the mass before each
    np.cumsum(ordered[..., :-1], axis=-1, out=above[..., 1:])
    kept = (above < top_p).sum(axis=-1)  # [...], >= 1: above is non-decreasing
    return np.take_along_axis(ordered, kept[..., None] - 1, axis=-1)[..., 0]


def _renormalized(p):
    return p / p.sum(axis=-1, keepdims=True)


def draw(p, rng):
    """One token per row of probabilities p [B, vocab], by inverting the cumulative
    distribution at one uniform draw per row; a drawn token always has probability > 0."""
    # The token is the first whose running total exceeds u * total. `<=` skips tokens of
    # probability 0 (their running total does not grow) even when u is exactly 0.
    cumulative = np.cumsum(p, axis=-1)  # [B, V]
    if not (cumulative[:, -1] > 0).all():
        bad = int(np.argmin(cumulative[:, -1] > 0))
        raise ValueError(f"sample_next: logits row {bad} gives no token a probability "
                         f"(all -inf, or NaN)")
    u = rng.random((p.shape[0], 1)) * cumulative[:, -1:]
    picked = (cumulative <= u).sum(axis=-1)
    # Rounding can leave u at the total itself (u = 1 - 2^-53 times a sum that is
    # not exactly 1), which would run past the last token that has any probability:
    # cap at that token.
    last_possible = p.shape[-1] - 1 - np.argmax(p[:, ::-1] > 0, axis=-1)
    return np.minimum(picked, last_possible)


def sample_next(logits, *, greedy=False, temperature=1.0, top_k=None, top_p=1.0, min_p=0.0,
                rng=None, allowed=None):
    """Pick the next token per row of logits [B, vocab]: argmax, or a sample from
    next_token_probs (temperature, then top-k, top-p and min-p).

    allowed [B, vocab] (bool), if given, masks the rest to -inf before all of those: how a
    structured output (a regex's token index) keeps the text valid. The sampler then draws
    from the model's distribution renormalised over the allowed tokens.

    A sampled token always has probability > 0, however the uniform draw falls.
    """
    logits = np.asarray(logits)
    if logits.ndim != 2 or logits.shape[-1] == 0:
        raise ValueError(f"sample_next expects logits [B, vocab], got shape {logits.shape}")
    if allowed is not None:
        allowed = np.asarray(allowed)
        if allowed.shape != logits.shape or allowed.dtype != np.bool_:
            raise ValueError(f"sample_next: allowed must be a bool array of the logits' shape "
                             f"{logits.shape}, got {allowed.dtype} {allowed.shape}")
        if not allowed.any(axis=-1).all():
            raise ValueError(f"sample_next: allowed row {int(np.argmin(allowed.any(axis=-1)))} "
                             f"allows no token")
        logits = np.where(allowed, logits, -np.inf)
    _check_sampling(greedy, temperature, top_k, logits.shape[-1], top_p=top_p, min_p=min_p)
    if greedy or temperature == 0:
        return np.argmax(logits, axis=-1)
    p = next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    return draw(p, np.random.default_rng() if rng is None else rng)


def _finite(logits, step):
    """The logits, if every one is finite: NaN or inf logits mean broken params, and
    sampling from them would quietly yield token 0 forever."""
    if not np.isfinite(logits).all():
        raise ValueError(f"logits at step {step} are not finite; check the params "
                         f"(step 0 is the prompt's, step n picks new token n)")
    return logits


def _prompts(prompt, cfg: Config):
    """(tokens [B, T], lengths [B] or None): a [B, T] array as it is, or a list of 1-D prompts
    padded on the right to the longest (the padding is never attended to: it lies after
    each row's last real token, and the causal mask hides it)."""
    if not isinstance(prompt, (list, tuple)):
        return check_tokens(prompt, cfg), None
    if not prompt:
        raise ValueError("prompts must hold at least one prompt, got an empty list")
    rows = []
    for i, p in enumerate(prompt):
        p = np.asarray(p)
        if p.ndim != 1 or p.size == 0:
            raise ValueError(f"prompt {i} must be a non-empty 1-D sequence of token ids, "
                             f"got shape {p.shape}")
        rows.append(check_tokens(p[None, :], cfg)[0])
    lengths = np.array([len(r) for r in rows])
    tokens = np.zeros((len(rows), int(lengths.max())), dtype=np.result_type(*rows))  # [B, T]
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    return tokens, lengths


def generate_stream(params, cfg: Config, prompt, max_new_tokens, *, greedy=False,
                    temperature=1.0, top_k=None, top_p=1.0, min_p=0.0, seed=None,
                    use_cache=True):
    """Yield the new tokens [B] one step at a time: prefill once, then decode with the cache.

    prompt is [B, T], or a list of B 1-D prompts of any lengths: each row then
    sits at its own positions. Stops with a ValueError naming the step if the
    logits there are not finite.
    """
    prompt, lengths = _prompts(prompt, cfg)
    B, T = prompt.shape
    check_int(max_new_tokens, "max_new_tokens", low=0)
    if T + max_new_tokens > cfg.max_seq:  # T: the longest prompt, the others padded to it
        raise ValueError(
            f"prompt ({T}) + max_new_tokens ({max_new_tokens}) exceeds max_seq={cfg.max_seq}")
    _check_sampling(greedy, temperature, top_k, cfg.vocab, seed, top_p, min_p)
    # The params are checked once here, not by every forward below: a step changes
    # only the cache and the tokens, which forward still checks.
    check_params(params, cfg)
    if max_new_tokens == 0:
        return
    rng = np.random.default_rng(seed)
    pick = dict(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                rng=rng)
    last = np.full(B, T - 1) if lengths is None else lengths - 1  # each row's last prompt token
    if use_cache:
        cache = KVCache(cfg, B, T + max_new_tokens)
        logits = forward(params, cfg, prompt, cache=cache, logits_at=last[:, None],
                         check=False)[:, 0]  # [B, V]
        if lengths is not None:
            for row, length in enumerate(lengths):  # forget the padding: rows at their own lengths
                cache.truncate_row(row, int(length))
        for step in range(max_new_tokens):
            nxt = sample_next(_finite(logits, step), **pick)  # [B]
            yield nxt
            if step + 1 < max_new_tokens:
                logits = forward(params, cfg, nxt[:, None], cache=cache, check=False)[:, -1]
    else:
        # No cache: every step runs each sequence whole, rows of different lengths one by one.
        rows = [slice(None)] if lengths is None else [slice(i, i + 1) for i in range(B)]
        seqs = [prompt] if lengths is None else [prompt[i:i + 1, :n] for i, n in enumerate(lengths)]
        for step in range(max_new_tokens):
            logits = np.concatenate([forward(params, cfg, s, logits_at=[-1], check=False)[:, 0]
                                     for s in seqs])
            nxt = sample_next(_finite(logits, step), **pick)
            yield nxt
            seqs = [np.concatenate([s, nxt[r, None]], axis=1) for s, r in zip(seqs, rows)]


def generate(params, cfg: Config, prompt, max_new_tokens, *, greedy=False, temperature=1.0,
             top_k=None, top_p=1.0, min_p=0.0, seed=None, use_cache=True):
    """The prompt followed by max_new_tokens generated tokens: [B, T + n] for a [B, T]
    prompt; for a list of 1-D prompts, a list of 1-D arrays, each its prompt and n new tokens."""
    tokens, lengths = _prompts(prompt, cfg)
    new = list(generate_stream(params, cfg, prompt, max_new_tokens, greedy=greedy,
                               temperature=temperature, top_k=top_k, top_p=top_p,
                               min_p=min_p, seed=seed, use_cache=use_cache))
    new = np.stack(new, axis=1).astype(tokens.dtype) if new else tokens[:, :0]  # [B, n]
    if lengths is None:
        return np.concatenate([tokens, new], axis=1)
    return [np.concatenate([tokens[i, :n], new[i]]) for i, n in enumerate(lengths)]
