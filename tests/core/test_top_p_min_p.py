"""top_p (nucleus) and min_p in next_token_probs and sample_next: the rule against a
readable reference written from its statement, against HF transformers' warpers where
torch is installed, ties at the nucleus's edge kept whole, draws checked by χ² against
the enumerated distribution, and bad values refused by name."""
import numpy as np
import pytest

from transformer_lab.generation import next_token_probs, sample_next
from transformer_lab.speculative import chi2_sf


def reference(logits, temperature=1.0, top_k=None, top_p=1.0, min_p=0.0):
    """The rule as stated, one token at a time: softmax(logits / T); top-k keeps the logits
    >= the k-th largest; a token stays in the nucleus when the tokens strictly more likely
    than it hold less than top_p; min_p keeps p >= min_p * max p; renormalize after each."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    if top_k is not None:
        kth = sorted(z, reverse=True)[top_k - 1]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1:
        keep = [sum(q for q in p if q > x) < top_p for x in p]
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    if min_p > 0:
        p = np.where(p >= min_p * p.max(), p, 0.0)
        p /= p.sum()
    return p


def chi2_p(counts, p):
    """χ² goodness of fit of counts [V] to p [V]; a token of probability 0 must never occur."""
    assert not counts[p == 0].any(), "a token outside the kept set was drawn"
    n, cells = counts.sum(), p > 0
    stat = float(((counts[cells] - n * p[cells]) ** 2 / (n * p[cells])).sum())
    return chi2_sf(stat, int(cells.sum()) - 1)


def draws(logits, n, seed=0, **shape):
    """n tokens drawn for one row of logits, in one vectorized call: counts [V]."""
    rows = np.tile(np.asarray(logits, dtype=np.float64), (n, 1))
    tokens = sample_next(rows, rng=np.random.default_rng(seed), **shape)
    return np.bincount(tokens, minlength=rows.shape[1])


# ---------------------------------------------------------------- the rule

@pytest.mark.parametrize("seed", range(30))
def test_the_distribution_is_the_stated_rule(seed):
    rng = np.random.default_rng(seed)
    V = int(rng.integers(2, 12))
    logits = rng.normal(size=V) * 2
    if seed % 3 == 0:  # ties: a few values repeated
        logits = rng.choice(logits[:3], size=V)
    shape = dict(temperature=float(rng.uniform(0.3, 2.0)),
                 top_k=None if seed % 2 else int(rng.integers(1, V + 1)),
                 top_p=float(rng.choice([1.0, rng.uniform(0.05, 1.0)])),
                 min_p=float(rng.choice([0.0, rng.uniform(0.0, 1.0)])))
    got = next_token_probs(logits[None], **shape)[0]
    np.testing.assert_allclose(got, reference(logits, **shape), rtol=1e-12, atol=0)
    assert got.dtype == np.float64 and got[np.argmax(logits)] > 0  # the likeliest stays


def test_a_tie_at_the_nucleus_edge_stays_whole():
    # 0.4 alone holds less than 0.5, so the next most likely token joins: two tie at 0.2,
    # and both stay (a sort would put one first; the rule does not depend on it).
    p = np.array([0.1, 0.2, 0.4, 0.2, 0.1])
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 3, 4, 1]):
        kept = next_token_probs(np.log(p[order])[None], top_p=0.5)[0]
        np.testing.assert_allclose(kept, np.where(p[order] >= 0.2, p[order], 0) / 0.8,
                                   rtol=1e-12)
    # Where the mass before a token reaches top_p exactly, it leaves: 0.5 + 0.25 = 0.75.
    p = np.array([0.5, 0.25, 0.125, 0.125])
    np.testing.assert_allclose(next_token_probs(np.log(p)[None], top_p=0.75)[0],
                               [2 / 3, 1 / 3, 0, 0], rtol=1e-12)
    np.testing.assert_allclose(next_token_probs(np.log(p)[None], top_p=0.7501)[0],
                               p, rtol=1e-12)  # the tie at 0.125 joins whole


def test_top_p_1_and_min_p_0_change_nothing_and_min_p_1_keeps_the_likeliest():
    logits = np.array([[0.3, -50.0, 2.0, 2.0, 1.0]])
    base = next_token_probs(logits)
    assert np.array_equal(next_token_probs(logits, top_p=1.0, min_p=0.0), base)
    np.testing.assert_allclose(next_token_probs(logits, min_p=1.0)[0], [0, 0, 0.5, 0.5, 0])
    np.testing.assert_allclose(next_token_probs(logits, top_p=1e-9)[0], [0, 0, 0.5, 0.5, 0])


def test_matches_hf_transformers_warpers():
    torch = pytest.importorskip("torch", reason="HF's warpers need torch")
    warpers = pytest.importorskip("transformers.generation.logits_process",
                                  reason="HF transformers is not installed")
    rng = np.random.default_rng(1)
    for trial in range(40):
        logits = rng.normal(size=(3, 17)) * 3  # continuous draws: no ties at the edge
        top_p, min_p = float(rng.uniform(0.05, 0.99)), float(rng.uniform(0.01, 0.5))
        for kw, warper in ((dict(top_p=top_p), warpers.TopPLogitsWarper(top_p)),
                           (dict(min_p=min_p), warpers.MinPLogitsWarper(min_p))):
            scores = warper(None, torch.tensor(logits))
            want = torch.softmax(scores, dim=-1).numpy()
            np.testing.assert_allclose(next_token_probs(logits, **kw), want, rtol=1e-10,
                                       atol=1e-15)


# ---------------------------------------------------------------- the draws

@pytest.mark.parametrize("shape", [dict(top_p=0.5), dict(top_p=0.9, temperature=0.7),
                                   dict(min_p=0.3), dict(top_k=4, top_p=0.6, min_p=0.2)],
                         ids=["ties_at_the_edge", "top_p_0.9_T0.7", "min_p", "all_three"])
def test_draws_follow_the_enumerated_distribution(shape):
    logits = np.log(np.array([0.1, 0.2, 0.4, 0.2, 0.05, 0.05]))
    p = reference(logits, **shape)
    counts = draws(logits, 20000, **shape)
    assert chi2_p(counts, p) > 0.001
    if shape == dict(top_p=0.5):
        assert counts[1] > 0 and counts[3] > 0 and counts[[0, 4, 5]].sum() == 0


def test_the_chi2_check_catches_a_tie_broken_by_order():
    # A sort-order rule keeps one of the two tokens tied at the edge: the draws of the
    # whole-tie rule do not fit it.
    logits = np.log(np.array([0.1, 0.2, 0.4, 0.2, 0.1]))
    one_of_them = np.array([0, 1 / 3, 2 / 3, 0, 0])
    counts = draws(logits, 5000, top_p=0.5)
    with pytest.raises(AssertionError, match="outside the kept set"):
        chi2_p(counts, one_of_them)


# ---------------------------------------------------------------- bad values

@pytest.mark.parametrize("kw, message", [
    (dict(top_p=0.0), r"top_p must be a number in \(0, 1\], got 0.0"),
    (dict(top_p=1.5), r"top_p must be a number in \(0, 1\], got 1.5"),
    (dict(top_p=True), r"top_p must be a number in \(0, 1\], got True"),
    (dict(top_p="0.5"), r"top_p must be a number in \(0, 1\]"),
    (dict(top_p=float("nan")), r"top_p must be a number in \(0, 1\], got nan"),
    (dict(min_p=-0.1), r"min_p must be a number in \[0, 1\], got -0.1"),
    (dict(min_p=2), r"min_p must be a number in \[0, 1\], got 2"),
])
def test_bad_top_p_and_min_p_are_named(kw, message):
    with pytest.raises(ValueError, match=message):
        sample_next(np.zeros((1, 4)), rng=np.random.default_rng(0), **kw)
