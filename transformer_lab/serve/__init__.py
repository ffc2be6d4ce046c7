"""transformer_lab.serve: a paged-KV serving engine with vLLM's offline API.

    from transformer_lab.serve import LLM, SamplingParams
    llm = LLM()                                   # SmolLM2-135M; LLM(path) for a GGUF file
    llm = LLM.from_params(cfg, params, tokenizer=None)  # any transformer_lab model
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=64))
    outs = llm.chat(conversations, SamplingParams(...))
    llm.stats()

The design, one job per file (after nano-vllm's layout, our own code):

- sequence.py     Sequence: token ids, status (waiting, running, finished), block_table,
                  num_cached_tokens (prefix hits), num_computed_tokens.
- block_manager.py  BlockManager: num_blocks blocks of block_size slots, a free list
                  (oldest freed reused first) and ref counts; a new block only at a block
                  boundary; prefix caching of full blocks by chained hashes, verified
                  against the stored ids; a shared block is never written.
- scheduler.py    Scheduler: waiting and running queues, rebuilt every step. Running
                  sequences decode (or continue a chunked prefill) first, then waiting
                  ones are admitted while the token budget, max_num_seqs and the free
                  blocks allow. Prefill and decode are mixed in one step (vLLM's choice;
                  mix_prefill_decode=False alternates as nano-vllm, for comparison). A
                  decode that finds no free block preempts the newest running sequence,
                  which is recomputed later. After the step, postprocess(chunks, tokens)
                  applies the picked tokens: computed positions (num_computed_tokens has
                  no other writer), rejected drafts' blocks freed, stops, finishes.
- speculative_config.py  LLM(speculative={"method": "ngram", "num_speculative_tokens": k})
                  in vLLM's names: each decoding sequence drafts with NgramDraft and its
                  chunk verifies the drafts in the same step (a ragged verify batch).
- model_runner.py ModelRunner: one forward() of the model itself per step over the
                  step's tokens concatenated [1, N] (no padding), with a StepCache that
                  stores K/V into the pool ([num_blocks, block_size, G, D] per layer) and
                  attends: prefill chunks one by one, decodes and verify chunks a group
                  at a time over their blocks gathered per step, each at its own position.
- tp_runner.py    LLM(tensor_parallel_size=N): the engine on rank 0 broadcasts each step's
                  batch; every rank runs parallel.tensor.tp_forward over its shard and a
                  KV pool of its own K/V groups (tp_worker.py: the MPI worker's entry).
- llm.py          LLM: checks requests (ValueError naming the request), adds them, steps
                  until done, samples each request with its own seeded generator
                  (temperature, top_k, top_p, min_p) or accepts its drafts, collects
                  outputs in prompt order with vLLM's metrics; chat() and chat_params()
                  (the chat template's stop ids, the server's too); a progress bar.
- step_stats.py   StepRecorder: the step log and the token counters stats() reports.
- structured_outputs.py  StructuredOutputsParams (vLLM's json=, regex=, choice=,
                  json_object=): each such request's Sequence walks a structured.Guide
                  and its logits are masked to the tokens that keep the output valid.

The OpenAI-compatible server (python -m transformer_lab.serve), one job per file too:

- openai_protocol.py  request bodies checked into GenerationRequests; responses, stream
                  chunks and OpenAI's error object (APIError with its HTTP status).
- text_stream.py  TextStream: a request's tokens to text, whole UTF-8 characters only,
                  stop strings cut and held back until ruled out.
- engine_loop.py  EngineLoop: the engine's steps in one thread; handlers submit requests
                  (503 past max_waiting) and read their tokens from a queue; aborts free
                  blocks before the next step; continuous, static or no batching, by
                  one admission rule (joining) that bench.replay shares.
- api_server.py   ApiServer: ThreadingHTTPServer routes, SSE streaming, disconnects,
                  /metrics in Prometheus text.
- __main__.py     the command line: one ready line, Ctrl-C / SIGTERM stop cleanly.
- bench.py        the load generator and vLLM's online metrics (TTFT, TPOT, ITL, goodput).

batch_invariant=True makes a request's tokens and logits bitwise those of the
request run alone: products in fixed row blocks (products.row_invariant_products) of the
size this BLAS computes alike at every row (products.invariant_block_rows, llm.invariant_rows),
attention per sequence over exactly its own keys, chunks cut at fixed points,
no prefix hits, and a preempted sequence replays its tokens one decode at a time.

What a demo can read: llm.step_log (StepRecord per step: sequences, prefill and
decode tokens, seconds, blocks in use, tokens cached, bytes gathered),
llm.scheduler.running / .waiting (Sequences with block_table), llm.block_manager.blocks
(ref_count, hash), llm.pool (the K/V arrays); llm.add_request() and llm.step() to
drive the engine one step at a time.
"""
from .llm import (DEFAULT_KV_CACHE_MEMORY, LLM, CompletionOutput, RequestMetrics, RequestOutput,
                  StepRecord, chat_prompt)
from .sampling_params import SamplingParams
from .structured_outputs import StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput", "RequestMetrics",
           "StepRecord", "chat_prompt", "DEFAULT_KV_CACHE_MEMORY"]
