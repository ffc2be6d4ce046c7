"""Each serving fact in one home: the scheduler applies a step's tokens and alone writes
num_computed_tokens, a recorder keeps the step statistics, LLM owns the chat stop ids
(the server asks it), "an int, not a bool" is validate.check_int's, and one admission
rule serves EngineLoop and bench.replay."""
import ast
from pathlib import Path

import pytest

from api_helpers import MERGES, TOKENS, TYPES, tiny_llm
from serve_helpers import model, no_leaks, prompts
from transformer_lab.pretrained.tokenizer import BPETokenizer
from transformer_lab.serve import LLM, SamplingParams
from transformer_lab.serve import openai_protocol as protocol
from transformer_lab.serve.api_server import ApiServer
from transformer_lab.serve.bench import replay
from transformer_lab.serve.engine_loop import EngineLoop, joining
from transformer_lab.serve.step_stats import COUNTS, StepRecorder

SERVE = Path(__import__("transformer_lab.serve", fromlist=["x"]).__file__).parent


def assignments(attribute):
    """The serve/ files that assign `<something>.attribute = ...`."""
    files = set()
    for path in SERVE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr == attribute:
                        files.add(path.name)
    return files


def test_num_computed_tokens_has_one_writer_besides_the_sequence_itself():
    assert assignments("num_computed_tokens") == {"scheduler.py", "sequence.py"}


def test_no_local_int_not_bool_checks_in_serve():
    for path in SERVE.glob("*.py"):
        text = path.read_text()
        assert "isinstance(value, bool) or not isinstance" not in text, path.name
        assert "def _is_int" not in text, path.name


@pytest.mark.parametrize("make, message", [
    (lambda: tiny_llm(max_num_seqs=True), "LLM: max_num_seqs must be an int >= 1, got True"),
    (lambda: tiny_llm(kv_cache_memory=2.0), "LLM: kv_cache_memory must be an int >= 1 or None"),
    (lambda: tiny_llm(speculative={"method": "ngram", "num_speculative_tokens": True}),
     r"LLM: speculative\['num_speculative_tokens'\] must be an int >= 1, got True"),
    (lambda: EngineLoop(tiny_llm(), max_waiting=False), "EngineLoop: max_waiting must be an int "
                                                        ">= 0, got False"),
    (lambda: SamplingParams(seed=True), "seed must be None or an int >= 0, got True"),
])
def test_a_bool_is_not_a_count_anywhere_in_serve(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_postprocess_applies_the_picked_tokens_and_the_recorder_counts_them():
    cfg, params = model("llama_gqa")
    llm = LLM.from_params(cfg, params, block_size=4, num_blocks=40,
                          speculative={"method": "ngram", "num_speculative_tokens": 3})
    rep = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2]  # the n-gram draft proposes 3 1 2 ...
    outs = llm.generate([rep, prompts(cfg, [5])[0]], SamplingParams(max_tokens=9), use_tqdm=False)
    log, stats = llm.step_log, llm.stats()
    for name in COUNTS:
        assert name in stats
    assert stats["decode_tokens"] + stats["prefill_tokens_computed"] == \
        sum(r.prefill_tokens + r.decode_tokens for r in log)
    assert stats["spec_accepted_tokens"] == sum(r.accepted_tokens for r in log) > 0
    assert [len(o.token_ids) for o in outs] == [9, 9]
    no_leaks(llm)
    recorder = StepRecorder(4)
    assert recorder.log == [] and set(recorder.counts.values()) == {0}


def test_chat_stops_at_the_ids_the_llm_owns_offline_and_over_http():
    llm = tiny_llm()
    assert llm.chat_stop_ids == (2,)  # <|im_end|>, also the toy tokenizer's eos
    other = BPETokenizer(TOKENS, MERGES, TYPES, pre="gpt2", eos_id=0)  # <|endoftext|>
    llm = LLM.from_params(llm.cfg, llm.params, other)
    assert llm.chat_stop_ids == (0, 2)  # the end of turn besides the tokenizer's eos
    asked = SamplingParams(max_tokens=3, stop_token_ids=(7, 2))
    assert llm.chat_params(asked).stop_token_ids == (7, 2, 0)
    # ignore_eos ignores the end of turn too (vLLM's eos ids), so a chat keeps its length.
    fixed = SamplingParams(max_tokens=3, stop_token_ids=(7,), ignore_eos=True)
    assert llm.chat_params(fixed).stop_token_ids == (7,)
    server = ApiServer(llm, port=0)  # not started: its checks are enough
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "stop_token_ids": [7]}
    chat = protocol.parse_chat(body, server.model)
    assert chat.params.stop_token_ids == llm.chat_params(SamplingParams(stop_token_ids=(7,))
                                                         ).stop_token_ids
    plain = protocol.parse_completion({"prompt": "hi", "max_tokens": 3, "stop_token_ids": [7]},
                                      server.model)
    assert plain.params.stop_token_ids == (7,)  # a completion stops only where asked
    offline = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=3),
                       use_tqdm=False)[0]
    assert offline.prompt_token_ids == chat.prompt_ids
    assert LLM.from_params(llm.cfg, llm.params).chat_stop_ids == ()
    with pytest.raises(ValueError, match="chat: sampling params must be a SamplingParams"):
        llm.chat_params({"max_tokens": 3})


@pytest.mark.parametrize("batching, idle, expected", [
    ("continuous", False, 5), ("continuous", True, 5), ("static", False, 0),
    ("static", True, 3), ("none", True, 1), ("none", False, 0)])
def test_one_admission_rule(batching, idle, expected):
    assert joining(batching, 5, idle, 3) == expected
    assert joining(batching, 0, idle, 3) == 0


def test_replay_admits_by_the_rule_static_batches_wait_for_an_idle_engine():
    llm = tiny_llm(max_num_seqs=2)
    requests = [([5 + i, 6], SamplingParams(max_tokens=3)) for i in range(4)]
    results, _ = replay(llm, requests, [0.0] * 4, batching="static")
    assert all(r.ok for r in results)
    first = [r.e2e for r in results[:2]]
    assert min(r.ttft for r in results[2:]) >= max(first) - 1e-12  # the next batch waited
