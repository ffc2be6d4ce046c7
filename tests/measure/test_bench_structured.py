"""The structured-outputs benchmark runs end to end on a tiny chat model (correctness only:
no timing is asserted): under the schema every reply parses and validates."""
from benchmarks.bench_structured import print_structured, run_structured, structured_targets
from benchmarks.output import Output
from tiny_model import tiny_chat_config, tiny_tokenizer
from transformer_lab import init_params
from transformer_lab.serve import LLM
from transformer_lab.training.chat_tasks import fits_answer_schema


def test_the_structured_section_on_a_tiny_model():
    cfg = tiny_chat_config(max_seq=384)
    llm = LLM.from_params(cfg, init_params(cfg, seed=0), tiny_tokenizer())
    result = run_structured(2, llm=llm)
    rows = {r["constraint"]: r for r in result["validity"]}
    # A random model may run a string to max_tokens; whatever ends, ends valid.
    assert rows["schema"]["valid"] + rows["schema"]["length"] == 2
    assert rows["json_object"]["parse"] + rows["json_object"]["length"] == 2
    assert result["mask_of_step"] > 0
    targets = structured_targets(result)
    assert [t["name"] for t in targets][0].startswith("structured outputs")
    print_structured(Output(quiet=True), result)
    assert structured_targets({"skipped": "no model"})[0]["met"] is None


def test_the_schema_check_by_hand():
    assert fits_answer_schema({"name": "Ada", "age": 36, "city": "Paris"})
    assert fits_answer_schema({"age": 36, "name": "Ada", "city": "Paris"})  # any order, as JSON
    assert not fits_answer_schema({"name": "Ada", "age": 36.0, "city": "Paris"})
    assert not fits_answer_schema({"name": "Ada", "age": True, "city": "Paris"})
    assert not fits_answer_schema({"name": "Ada", "age": 36, "city": "Paris", "x": 1})
