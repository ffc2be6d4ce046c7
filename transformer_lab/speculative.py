"""Speculative decoding that is exact: draft k tokens cheaply, verify them in one pass.

A draft proposes the next k tokens; the target model runs once over the last
token and the k drafts (k + 1 positions against its KV cache) and so has its
distribution at every one of them. Drafts are accepted by the rule of
Leviathan et al. and Chen et al. (2023), the target's token is appended at the
first rejection (or a bonus token after k acceptances), and the rejected
positions are rolled back in the target's cache and the draft's:

* greedy: accept while the draft equals the target's argmax, so the tokens are
  exactly those of plain greedy decoding;
* sampling: accept a drafted x with probability min(1, p(x) / q(x)), on a
  rejection sample from norm(max(0, p - q)), after k acceptances one bonus token
  from p; each new token is then distributed exactly as the target's p. A
  deterministic draft (the n-gram one) has a one-hot q: the same rule.

p and q are shaped by temperature and top-k with generation.next_token_probs,
the distribution sample_next draws from.

    tokens, stats = speculative_generate(params, cfg, prompt, 64, draft=NgramDraft(), k=4)

A draft is any object with start(tokens, room), propose(tokens, k, sampler) ->
(ids, q or None) and rollback(length); NgramDraft and ModelDraft are the two here.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .cache import KVCache
from .config import Config
from .generation import _check_sampling, _finite, draw, next_token_probs
from .model import check_tokens, forward
from .params import check_params
from .validate import check_int

DRAFT_CALLS = ("start", "propose", "rollback")


# ---------------------------------------------------------------- how a token is picked

@dataclass
class Sampler:
    """How the next token is picked, shared by the draft and the verifier: argmax when
    greedy (or temperature 0), else a draw from next_token_probs(logits, temperature, top_k,
    top_p, min_p): the verifier's p is then exactly the distribution sample_next draws from."""
    greedy: bool
    temperature: float
    top_k: int | None
    rng: np.random.Generator
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def deterministic(self) -> bool:
        return bool(self.greedy or self.temperature == 0)

    def probs(self, logits):
        """Shaped distributions, float64, one per row of logits [n, V]."""
        return next_token_probs(logits, temperature=self.temperature, top_k=self.top_k,
                                top_p=self.top_p, min_p=self.min_p)

    def pick(self, logits):
        """(token, its distribution [V] or None when deterministic) for logits [V]."""
        if self.deterministic:
            return int(np.argmax(logits)), None
        q = self.probs(logits[None])  # [1, V]
        return int(draw(q, self.rng)[0]), q[0]


# ---------------------------------------------------------------- drafts

class NgramDraft:
    """Prompt lookup: the longest n-gram (max_n down to min_n) that ends the sequence and
    occurred earlier in it proposes the tokens that followed its latest occurrence. No
    model, no cache; deterministic, so its q is one-hot. Where the continuation runs into
    the sequence's end it goes on with its own proposals: a repeat keeps repeating."""
    vocab = None  # works with any vocabulary

    def __init__(self, max_n=3, min_n=1):
        self.max_n = check_int(max_n, "NgramDraft: max_n", low=1)
        self.min_n = check_int(min_n, "NgramDraft: min_n", low=1)
        if self.min_n > self.max_n:
            raise ValueError(f"NgramDraft: min_n ({min_n}) must be <= max_n ({max_n})")

    def __repr__(self):
        return f"NgramDraft(max_n={self.max_n}, min_n={self.min_n})"

    def start(self, tokens, room):
        pass

    def match(self, tokens):
        """(n, start) of the longest n-gram ending `tokens` that occurred earlier, its latest
        earlier start; (0, None) when none did."""
        seq = np.asarray(tokens)
        L = len(seq)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(seq[:L - 1], n)  # starts 0..L-1-n
            hits = np.flatnonzero((windows == seq[L - n:]).all(axis=1))
            if hits.size:
                return n, int(hits[-1])
        return 0, None

    def propose(self, tokens, k, sampler=None):
        n, start = self.match(tokens)
        if start is None:
            return [], None
        seq, L, out = np.asarray(tokens), len(tokens), []
        for i in range(k):
            at = start + n + i  # < L + i, so a position past the end is one already proposed
            out.append(int(seq[at]) if at < L else out[at - L])
        return out, None

    def rollback(self, length):
        pass


class ModelDraft:
    """A smaller model with the target's vocabulary decodes the k drafts with its own
    KVCache; after verification its rejected positions are truncated away."""

    def __init__(self, params, cfg: Config, name="model"):
        if not isinstance(cfg, Config):
            raise ValueError(f"ModelDraft: cfg must be a Config, got {type(cfg).__name__}")
        check_params(params, cfg)  # once: proposing then runs forward unchecked
        self.params, self.cfg, self.name = params, cfg, name
        self.vocab = cfg.vocab
        self.cache = None

    def __repr__(self):
        return f"ModelDraft({self.name}, {self.cfg.n_layers} layers)"

    def start(self, tokens, room):
        self.cache = KVCache(self.cfg, 1, max(1, min(self.cfg.max_seq, int(room))))

    def propose(self, tokens, k, sampler):
        """Up to k tokens (fewer where the draft's context ends) and their q [n, V], or None
        when picking is deterministic. Feeds what its cache lacks, then one token a step."""
        cache, L = self.cache, len(tokens)
        n = min(k, cache.max_len - L + 1)  # positions fed: up to L + n - 2 < max_len
        if n < 1:
            return [], None
        held = cache.length
        logits = forward(self.params, self.cfg, np.asarray(tokens[held:L])[None],
                         cache=cache, logits_at=[-1], check=False)[0, 0]
        out, qs = [], []
        for i in range(n):
            token, q = sampler.pick(_finite(logits, i))
            out.append(token)
            qs.append(q)
            if i + 1 < n:
                logits = forward(self.params, self.cfg, np.array([[token]]), cache=cache,
                                 check=False)[0, -1]
        return out, (None if sampler.deterministic else np.stack(qs))

    def rollback(self, length):
        """The sequence agrees with what was fed up to `length` positions: drop the rest."""
        self.cache.truncate(min(int(length), self.cache.length))


def truncated_draft(params, cfg: Config, n_layers):
    """Self-speculation (as LayerSkip does, here without its training): the target's first
    n_layers blocks with its final norm and head, as a ModelDraft. Shares the arrays."""
    n_layers = check_int(n_layers, "truncated_draft: n_layers", low=1)
    if n_layers > cfg.n_layers:
        raise ValueError(f"truncated_draft: n_layers={n_layers} exceeds the model's {cfg.n_layers}")
    draft = {key: value for key, value in params.items() if key != "blocks"}
    draft["blocks"] = list(params["blocks"][:n_layers])
    return ModelDraft(draft, cfg.replace(n_layers=n_layers), name=f"first {n_layers} layers")


def _check_draft(draft, vocab):
    missing = [name for name in DRAFT_CALLS if not callable(getattr(draft, name, None))]
    if missing:
        raise ValueError(f"draft must be an NgramDraft, a ModelDraft or an object with "
                         f"{', '.join(DRAFT_CALLS)}; {type(draft).__name__} has no "
                         f"{', '.join(missing)}")
    dv = getattr(draft, "vocab", None)
    if dv is not None and dv != vocab:
        raise ValueError(f"the draft's vocabulary has {dv} tokens but the target's has {vocab}; "
                         f"a draft must share the target's vocabulary")


# ---------------------------------------------------------------- the acceptance rule

def accept(logits, drafts, q, sampler):
    """(accepted count a, the token appended after them) for the target's logits [j+1, V]
    at the last token and j drafts, by the rule: greedy, while the draft is the argmax;
    sampling, drafted x with probability min(1, p(x)/q(x)), then a token from
    norm(max(0, p - q)) at the first rejection, or from p after all j. q [j, V] is the
    draft's distribution, None for a deterministic draft (one-hot rows)."""
    j = len(drafts)
    if sampler.deterministic:
        best = np.argmax(logits, axis=-1)  # [j+1]
        a = 0
        while a < j and drafts[a] == best[a]:
            a += 1
        return a, int(best[a])
    p = sampler.probs(logits)  # [j+1, V]
    if q is None:
        q = np.zeros((j, p.shape[-1]))
        q[np.arange(j), drafts] = 1.0
    for i, x in enumerate(drafts):
        if sampler.rng.random() * q[i, x] < p[i, x]:  # u < p/q, u uniform in [0, 1)
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        # All zero means p <= q everywhere, so p == q and this branch had probability 0
        # (rounding made it possible): p is then what the residual stands for.
        return i, int(draw((residual if residual.sum() > 0 else p[i])[None], sampler.rng)[0])
    return j, int(draw(p[j:j + 1], sampler.rng)[0])


def expected_tokens_per_pass(alpha, k):
    """(1 - α^(k+1)) / (1 - α): tokens one pass yields when each of k drafts is accepted
    with probability α independently (k + 1 at α = 1)."""
    if alpha is None:
        return None
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def break_even_alpha(cost, k):
    """The α at which k drafts per pass pay for a pass costing `cost` decode steps: the
    root of expected_tokens_per_pass(α, k) = cost. 0 when cost <= 1 (any α pays), None
    when cost > k + 1 (not even α = 1 pays)."""
    if cost <= 1:
        return 0.0
    if cost > k + 1:
        return None
    lo, hi = 0.0, 1.0  # the expected tokens grow with α: bisect
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_pass(mid, k) < cost else (lo, mid)
    return (lo + hi) / 2


# ---------------------------------------------------------------- the decoding loop

class SpeculativeDecoder:
    """One sequence decoded speculatively. passes() yields each pass's new tokens; the
    target's cache is .cache, the draft .draft, the figures .stats.

    The target's cache holds every token but the last: a pass feeds the last token and
    the drafts, so k + 1 positions, then keeps the last token and the accepted drafts.
    """

    def __init__(self, params, cfg: Config, prompt, max_new_tokens, *, draft=None, k=4,
                 greedy=True, temperature=1.0, top_k=None, top_p=1.0, min_p=0.0, seed=None):
        prompt = check_tokens(prompt, cfg)
        if prompt.shape[0] != 1:
            raise ValueError(f"speculative decoding takes one sequence, prompt [1, T]; got "
                             f"shape {prompt.shape}")
        max_new_tokens = check_int(max_new_tokens, "max_new_tokens", low=0)
        T = prompt.shape[1]
        if T + max_new_tokens > cfg.max_seq:
            raise ValueError(f"prompt ({T}) + max_new_tokens ({max_new_tokens}) exceeds "
                             f"max_seq={cfg.max_seq}")
        self.k = check_int(k, "k (drafts per pass)", low=1)
        _check_sampling(greedy, temperature, top_k, cfg.vocab, seed, top_p, min_p)
        draft = NgramDraft() if draft is None else draft
        _check_draft(draft, cfg.vocab)
        check_params(params, cfg)
        self.params, self.cfg, self.draft = params, cfg, draft
        self.sampler = Sampler(bool(greedy), float(temperature), top_k, np.random.default_rng(seed),
                               float(top_p), float(min_p))
        self.max_new_tokens, self.prompt_len = max_new_tokens, T
        self.tokens = np.zeros(T + max_new_tokens, dtype=prompt.dtype)
        self.tokens[:T] = prompt[0]
        self.length = T
        self.cache = KVCache(cfg, 1, max(1, T + max_new_tokens))
        self.stats = {"draft": repr(draft), "k": self.k, "new_tokens": 0, "target_passes": 0,
                      "drafted": 0, "tested": 0, "accepted": 0, "acceptance_rate": None,
                      "accepted_per_drafted": None, "tokens_per_pass": None,
                      "expected_tokens_per_pass": None, "prefill_seconds": 0.0,
                      "draft_seconds": 0.0, "verify_seconds": 0.0}
        self._draft_lengths = []  # drafts per pass, for the expected tokens per pass

    def _check_proposal(self, drafts, q, k):
        if len(drafts) > k:
            raise ValueError(f"the draft proposed {len(drafts)} tokens; at most {k} were asked for")
        if drafts and not all(isinstance(t, (int, np.integer)) and 0 <= t < self.cfg.vocab
                              for t in drafts):
            raise ValueError(f"the draft proposed ids outside [0, {self.cfg.vocab}): {drafts}")
        if q is not None and (np.shape(q) != (len(drafts), self.cfg.vocab)
                              or not all(q[i, t] > 0 for i, t in enumerate(drafts))):
            raise ValueError(f"the draft's q must be [{len(drafts)}, {self.cfg.vocab}] and give "
                             f"each drafted token a probability > 0")

    def passes(self):
        """Yield the new tokens of each pass (a list of 1 to k + 1 ids) until max_new_tokens."""
        if self.max_new_tokens == 0:
            return
        start = time.perf_counter()
        T = self.prompt_len
        if T > 1:
            forward(self.params, self.cfg, self.tokens[None, :T - 1], cache=self.cache,
                    logits_at=[-1], check=False)  # only the cache is wanted
        self.draft.start(self.tokens[:T], T + self.max_new_tokens)
        self.stats["prefill_seconds"] = time.perf_counter() - start
        while self.length < T + self.max_new_tokens:
            yield self.step()

    def step(self):
        """One pass: draft, verify in one forward, accept, roll both caches back."""
        L, st = self.length, self.stats
        left = self.prompt_len + self.max_new_tokens - L  # tokens still to come, >= 1
        k = min(self.k, left - 1)  # the pass yields up to k + 1: never past the budget
        start = time.perf_counter()
        drafts, q = self.draft.propose(self.tokens[:L], k, self.sampler) if k > 0 else ([], None)
        drafts = [int(t) for t in drafts]
        self._check_proposal(drafts, q, k)
        mid = time.perf_counter()
        fed = np.array([[self.tokens[L - 1], *drafts]], dtype=self.tokens.dtype)  # [1, 1 + j]
        logits = forward(self.params, self.cfg, fed, cache=self.cache, check=False)[0]  # [1+j, V]
        a, token = accept(_finite(logits, L - self.prompt_len), drafts, q, self.sampler)
        new = drafts[:a] + [token]
        self.cache.truncate(L + a)  # keeps the last token and the accepted drafts
        end = time.perf_counter()
        self.draft.rollback(L + a)  # the draft agrees with the sequence up to there
        self.tokens[L:L + a + 1] = new
        self.length = L + a + 1
        st["draft_seconds"] += mid - start + time.perf_counter() - end
        st["verify_seconds"] += end - mid
        st["target_passes"] += 1
        st["new_tokens"] += len(new)
        st["drafted"] += len(drafts)
        st["accepted"] += a
        st["tested"] += a + (a < len(drafts))  # the first rejected draft was tested too
        self._draft_lengths.append(len(drafts))
        st["acceptance_rate"] = alpha = st["accepted"] / st["tested"] if st["tested"] else None
        st["accepted_per_drafted"] = st["accepted"] / st["drafted"] if st["drafted"] else None
        st["tokens_per_pass"] = st["new_tokens"] / st["target_passes"]
        st["expected_tokens_per_pass"] = None if alpha is None else float(np.mean(
            [expected_tokens_per_pass(alpha, j) for j in self._draft_lengths]))
        return new


def speculative_generate(params, cfg: Config, prompt, max_new_tokens, *, draft=None, k=4,
                         greedy=True, temperature=1.0, top_k=None, top_p=1.0, min_p=0.0,
                         seed=None):
    """(tokens [1, T + n], stats) for a prompt [1, T], as generate takes and returns them.

    draft: NgramDraft(max_n=3, min_n=1) when None, or a ModelDraft; k drafts per pass
    (fewer where the budget or the context ends). Greedy gives exactly generate's greedy
    tokens; sampling gives exactly its distribution (not its samples for a seed).

    stats: target_passes; drafted, tested (accepted plus the first rejected of each
    pass) and accepted; acceptance_rate α = accepted / tested, the per-token acceptance
    probability the formula assumes (accepted_per_drafted beside it); tokens_per_pass
    and expected_tokens_per_pass, (1 - α^(k+1)) / (1 - α) averaged over the passes
    with each pass's own number of drafts; prefill_seconds, draft_seconds, verify_seconds.
    """
    dec = SpeculativeDecoder(params, cfg, prompt, max_new_tokens, draft=draft, k=k,
                             greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p,
                             min_p=min_p, seed=seed)
    for _ in dec.passes():
        pass
    return dec.tokens[None, :dec.length].copy(), dict(dec.stats)


def speculative_stream(params, cfg: Config, prompt, max_new_tokens, *, draft=None, k=4,
                       greedy=True, temperature=1.0, top_k=None, top_p=1.0, min_p=0.0, seed=None,
                       stats=None):
    """Yield the new tokens one at a time as [1] arrays, as generate_stream does, decoding
    speculatively; `stats`, a dict if given, holds speculative_generate's figures, updated
    after every pass (so it is current when the caller stops early at a stop token)."""
    dec = SpeculativeDecoder(params, cfg, prompt, max_new_tokens, draft=draft, k=k,
                             greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p,
                             min_p=min_p, seed=seed)
    for new in dec.passes():
        if stats is not None:
            stats.update(dec.stats)
        for token in new:
            yield np.array([token])


# ---------------------------------------------------------------- for the chat CLI

def parse_speculate(text):
    """"ngram" or "ngram:K" (the --speculate option) -> (NgramDraft(), K, 4 by default).
    ValueError naming the valid forms otherwise."""
    method, colon, k = str(text).partition(":")
    if method != "ngram" or (colon and not (k.isascii() and k.isdigit() and int(k) >= 1)):
        raise ValueError(f"--speculate takes ngram or ngram:K with K an int >= 1, got {text!r}")
    return NgramDraft(), int(k) if k else 4


def stats_line(stats):
    """One line for stderr: α, tokens per pass against the formula, passes."""
    alpha, tpp, exp = (stats.get(key) for key in ("acceptance_rate", "tokens_per_pass",
                                                   "expected_tokens_per_pass"))
    if not stats.get("target_passes"):
        return "[speculative: no pass ran]"
    a = "n/a (nothing drafted)" if alpha is None else f"{alpha:.2f}"
    e = "" if exp is None else f" (formula {exp:.2f})"
    return (f"[speculative {stats['draft']}, k={stats['k']}: α {a} | accepted "
            f"{stats['accepted']}/{stats['drafted']} drafted | {tpp:.2f} tokens per target "
            f"pass{e} | {stats['target_passes']} passes for {stats['new_tokens']} tokens]")


def chi2_sf(x, df):
    """P(χ² with df degrees of freedom >= x): the regularized upper incomplete gamma
    Q(df/2, x/2), by its series below s + 1 and its continued fraction above."""
    df = check_int(df, "chi2_sf: df", low=1)
    if not x > 0:
        return 1.0
    return regularized_gamma_q(df / 2.0, x / 2.0)


def regularized_gamma_q(s, x):
    """Q(s, x) = Γ(s, x) / Γ(s) for s > 0, x >= 0 (Numerical Recipes' gser and gcf)."""
    if x <= 0:
        return 1.0
    log_prefix = s * math.log(x) - x - math.lgamma(s)
    if x < s + 1:  # the series of P(s, x) converges fast here
        term = total = 1.0 / s
        a = s
        for _ in range(10_000):
            a += 1
            term *= x / a
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    tiny = 1e-300  # Lentz's continued fraction for Q(s, x)
    b = x + 1 - s
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - s)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-16:
            break
    return math.exp(log_prefix) * h
