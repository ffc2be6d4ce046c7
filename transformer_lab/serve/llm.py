"""LLM: the offline serving API (vLLM's): add requests, step the engine until done, collect.

    llm = LLM()                                   # SmolLM2-135M from find_model()
    llm = LLM("runs/json/model.npz")              # a fine-tuned model, alone (train --init)
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
    outs[0].text, outs[0].token_ids, outs[0].finish_reason, outs[0].metrics.ttft

Each step: the Scheduler picks the chunks, the ModelRunner runs one forward
over them against the paged pool, each sequence that finished a chunk at its
end samples its next token with its own generator (with speculative=,
serve/speculative_config.py, a decoding sequence's chunk also verifies its
drafts, and speculative.accept picks its 1 to k + 1 new tokens), the
Scheduler's postprocess applies those tokens, and the StepRecorder logs the step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import weakref
from dataclasses import dataclass

import numpy as np

from ..products import invariant_block_rows, row_invariant_products
from ..params import PACKED_MODULES_BY_KEYS as PACKED_KEYS, PackedGroup, check_params
from ..pretrained.chat_template import apply_chat_template, encode_chat, stop_token_ids
from ..validate import check_int
from ..speculative import Sampler, accept
from ..structured import Guide, TokenIndex, compile_regex
from .block_manager import BlockManager
from .kv_pool import PagedKVPool, check_kv_cache_dtype
from .model_runner import ModelRunner
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence
from .speculative_config import SpeculativeConfig
from .step_stats import StepRecord, StepRecorder
from .tp_runner import TPModelRunner, check_tensor_parallel

# Without num_blocks or kv_cache_memory, the pool holds max_num_seqs full-length
# sequences, capped at this many bytes (256 MiB: 5 825 SmolLM2 tokens, 364 blocks of 16).
DEFAULT_KV_CACHE_MEMORY = 256 * 2**20
# Rows per product in batch_invariant mode (products.row_invariant_products), the first of
# these that this BLAS computes alike at every row of the block (products.invariant_block_rows,
# checked when the engine is made): a GEMM of 32 rows costs little more than one of 8 (the
# weight's packing dominates both), and a prefill then needs a quarter as many calls.
INVARIANT_ROWS = (32, 16, 8, 4, 2, 1)


def chat_prompt(messages, add_generation_prompt=True) -> str:
    """The model's chat template (pretrained/chat_template.py) applied to one conversation
    [{"role", "content"}, ...]."""
    return apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


# ---------------------------------------------------------------- outputs

@dataclass
class RequestMetrics:
    """perf_counter() times of one request, and vLLM's latency figures from them."""
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_generated_tokens: int

    @property
    def ttft(self) -> float:
        """Time to first token: arrival to the first generated token."""
        return self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float:
        """End to end: arrival to the last token."""
        return self.finish_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (E2E - TTFT) / (n - 1); None for n = 1."""
        n = self.num_generated_tokens
        return (self.e2e - self.ttft) / (n - 1) if n > 1 else None


@dataclass
class CompletionOutput:
    """vLLM's per-completion output (RequestOutput.outputs[0])."""
    index: int
    text: str | None
    token_ids: list
    finish_reason: str


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list
    token_ids: list  # the generated ones, a stop token included
    text: str | None  # None without a tokenizer; a final stop token is not in it
    finish_reason: str  # "stop" (end of sequence or a stop token) or "length" (max_tokens)
    metrics: RequestMetrics
    finished: bool = True

    @property
    def outputs(self) -> list[CompletionOutput]:
        """vLLM's form: one completion per request here."""
        return [CompletionOutput(0, self.text, self.token_ids, self.finish_reason)]


# ---------------------------------------------------------------- the engine

def product_weights(params, cfg) -> list:
    """One weight of each shape and memory order that the model's products multiply by
    (packed Q/K/V and gate/up where the params hold them packed, the tied head as
    tok_emb.T, a mixture of experts' router, experts and shared experts): what
    invariant_block_rows checks."""
    weights = [params["tok_emb"].T if cfg.tie_embeddings else params["lm_head"]["w"]]
    for block in params["blocks"]:
        for group in (block["attn"], block.get("mlp", {})):
            packed = group.packed.values() if isinstance(group, PackedGroup) else ()
            in_packed = {k for name in group.packed for k in PACKED_KEYS[name]} \
                if isinstance(group, PackedGroup) else set()
            weights += list(packed)
            weights += [w for k, w in group.items()
                        if k not in in_packed and isinstance(w, np.ndarray) and w.ndim == 2]
        moe = block.get("moe", {})  # a mixture of experts: one expert of each stack is enough
        weights += [moe[k][0] for k in ("w_gate", "w_up", "w_down") if k in moe]
        weights += [w for k, w in moe.items() if k in ("router", "shared_gate")]
        weights += list(moe.get("shared", {}).values())
    unique = {}
    for w in weights:
        unique.setdefault((w.shape, w.strides, w.dtype), w)
    return list(unique.values())


def _positive_int(name, value, *, allow_none=False):
    if allow_none and value is None:
        return None
    return check_int(value, f"LLM: {name}", low=1,
                     what="an int >= 1 or None" if allow_none else None)


class LLM:
    """The serving engine. Attributes a demo may read:

    cfg, params, tokenizer; block_manager (its .blocks with ref_count and hash), scheduler
    (.waiting, .running: Sequences with .block_table, .num_computed_tokens), pool
    (PagedKVPool; with tensor parallel, rank 0's: its K/V groups), step_log (a StepRecord
    per step), num_blocks, block_size.

    tensor_parallel_size=N (vLLM's name) splits the model over N ranks (serve/tp_runner.py):
    worker processes under mpiexec (distributed_executor_backend="mpi", the default) or
    threads of this process ("threads"). close(), a with block or the process's exit ends
    them.
    """

    def __init__(self, model=None, *, dtype=np.float32, **options):
        from ..pretrained.model_file import load_model
        cfg, params, tokenizer = load_model(model, dtype=dtype)  # a GGUF file or a model.npz
        self._setup(cfg, params, tokenizer, **options)

    @classmethod
    def from_params(cls, cfg, params, tokenizer=None, **options):
        """An engine over any transformer_lab model (float64 included)."""
        self = cls.__new__(cls)
        self._setup(cfg, params, tokenizer, **options)
        return self

    def _setup(self, cfg, params, tokenizer, *, block_size=16, num_blocks=None,
               kv_cache_memory=None, max_num_seqs=32, max_num_batched_tokens=1024,
               enable_prefix_caching=True, batch_invariant=False, mix_prefill_decode=True,
               speculative=None, kv_cache_dtype="auto", tensor_parallel_size=1,
               distributed_executor_backend=None):
        self._finalizer = None
        check_params(params, cfg)
        if cfg.attention == "mla":
            # An MLA block would be one [block_size, kv_lora_rank + rope] array per layer,
            # read by the absorbed attention; the pool holds per-head K and V only, so far.
            raise ValueError("LLM: the paged KV pool holds per-head K and V blocks; MLA's latent "
                             "cache is not served yet (use generate() or KVCache for MLA)")
        self.cfg, self.params, self.tokenizer = cfg, params, tokenizer
        self.block_size = _positive_int("block_size", block_size)
        self.max_num_seqs = _positive_int("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = _positive_int("max_num_batched_tokens",
                                                    max_num_batched_tokens)
        for name, value in (("enable_prefix_caching", enable_prefix_caching),
                            ("batch_invariant", batch_invariant),
                            ("mix_prefill_decode", mix_prefill_decode)):
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"LLM: {name} must be True or False, got {value!r}")
        if num_blocks is not None and kv_cache_memory is not None:
            raise ValueError("LLM: give num_blocks or kv_cache_memory, not both")
        self.kv_cache_dtype = check_kv_cache_dtype(kv_cache_dtype)
        per_block = PagedKVPool.bytes_per_block(cfg, self.block_size, kv_cache_dtype)
        if num_blocks is None:
            memory = _positive_int("kv_cache_memory", kv_cache_memory, allow_none=True)
            if memory is None:
                memory = min(DEFAULT_KV_CACHE_MEMORY,
                             self.max_num_seqs * cfg.max_seq * per_block // self.block_size)
            num_blocks = memory // per_block
            if num_blocks < 1:
                raise ValueError(f"LLM: kv_cache_memory={memory} bytes holds no block of "
                                 f"{per_block} bytes")
        self.num_blocks = _positive_int("num_blocks", num_blocks)
        self.tensor_parallel_size = check_tensor_parallel(cfg, tensor_parallel_size)
        if self.tensor_parallel_size > 1 and batch_invariant:
            raise ValueError("LLM: batch_invariant=True is not supported with "
                             f"tensor_parallel_size={self.tensor_parallel_size} (the all-reduces "
                             f"add the ranks' partial sums in their own order)")
        self.speculative = SpeculativeConfig.from_dict(speculative)
        self.batch_invariant = bool(batch_invariant)
        # Batch invariance needs a sequence's computation to depend on it alone: prefix hits
        # (which depend on what ran before) are off, and chunks are cut at fixed points.
        self.enable_prefix_caching = bool(enable_prefix_caching) and not self.batch_invariant
        self.block_manager = BlockManager(self.num_blocks, self.block_size,
                                          self.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=self.max_num_seqs,
                                   max_num_batched_tokens=self.max_num_batched_tokens,
                                   mix=bool(mix_prefill_decode), canonical=self.batch_invariant,
                                   speculative=self.speculative,
                                   eos_id=None if tokenizer is None else tokenizer.eos_id)
        if self.tensor_parallel_size > 1:
            # Last: from here on there are workers to end (close, or the finalizer at exit).
            self.runner = TPModelRunner(params, cfg, self.tensor_parallel_size,
                                        num_blocks=self.num_blocks, block_size=self.block_size,
                                        kv_cache_dtype=kv_cache_dtype,
                                        backend=distributed_executor_backend or "mpi")
            self._finalizer = weakref.finalize(self, self.runner.close)
            self.pool = self.runner.pool
        else:
            if distributed_executor_backend not in (None, "threads", "mpi"):
                raise ValueError(f"LLM: distributed_executor_backend must be threads or mpi, "
                                 f"got {distributed_executor_backend!r}")
            self.pool = PagedKVPool(cfg, self.num_blocks, self.block_size, kv_cache_dtype)
            self.runner = ModelRunner(params, cfg, self.pool,
                                      batch_invariant=self.batch_invariant)
        self.invariant_rows = (invariant_block_rows(product_weights(params, cfg), INVARIANT_ROWS)
                               if self.batch_invariant else None)
        self.recorder = StepRecorder(self.block_size)
        self._constraints = {}  # (constraint, end ids) -> its TokenIndex, compiled once
        self._next_index = 0
        self.reset_stats()

    @property
    def step_log(self) -> list[StepRecord]:
        """A StepRecord per step since reset_stats() (the recorder's log)."""
        return self.recorder.log

    def close(self):
        """End the tensor-parallel workers (nothing to do at tensor_parallel_size=1); the
        engine cannot step after it."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def reset_stats(self):
        """Zero the counters of stats() and empty the step log (the cache keeps its blocks)."""
        self.recorder.reset()
        if self.tensor_parallel_size > 1:
            self.runner.comm.reset_stats()
        bm = self.block_manager
        bm.peak_blocks_in_use = bm.blocks_in_use
        bm.prefix_hit_tokens = bm.prefix_query_tokens = 0
        self.scheduler.preemptions = 0

    def stats(self) -> dict:
        """The counters since reset_stats(); with tensor parallel also the bytes rank 0
        sent in all-reduces (the blocks') and all-gathers (the sampled rows' logits),
        comm.stats' counts, and tp_all_reduce_bytes_per_token over the tokens computed."""
        bm = self.block_manager
        out = dict(num_blocks=bm.num_blocks, blocks_in_use=bm.blocks_in_use,
                   peak_blocks_in_use=bm.peak_blocks_in_use,
                   prefix_hit_tokens=bm.prefix_hit_tokens,
                   prefix_query_tokens=bm.prefix_query_tokens,
                   preemptions=self.scheduler.preemptions, steps=len(self.step_log),
                   **self.recorder.counts)
        if self.tensor_parallel_size > 1:
            comm = self.runner.comm
            tokens = out["prefill_tokens_computed"] + out["decode_tokens"]
            out.update(tp_all_reduce_bytes=comm.bytes_sent("all_reduce"),
                       tp_all_reduce_calls=comm.stats.get("all_reduce", {}).get("calls", 0),
                       tp_all_gather_bytes=comm.bytes_sent("all_gather"),
                       tp_all_reduce_bytes_per_token=comm.bytes_sent("all_reduce") / tokens
                       if tokens else 0.0)
        return out

    # ------------------------------------------------------------ requests

    def _token_ids(self, index, prompt):
        """(text or None, ids) of one prompt: a string, ids, or vLLM's {"prompt": ...} or
        {"prompt_token_ids": ...} (beside which a "prompt" is the ids' text, not encoded)."""
        text = None
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                text, prompt = prompt.get("prompt"), prompt["prompt_token_ids"]
                if text is not None and not isinstance(text, str):
                    raise ValueError(f"request {index}: 'prompt' beside 'prompt_token_ids' is "
                                     f"their text, a string; got {type(text).__name__}")
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError(f"request {index}: a dict prompt needs 'prompt' or "
                                 f"'prompt_token_ids', got keys {sorted(prompt)}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"request {index}: a text prompt needs a tokenizer; this LLM "
                                 f"has none (pass token ids, or tokenizer= to from_params)")
            text, prompt = prompt, self.tokenizer.encode(prompt)
        ids = np.asarray(prompt)
        if ids.ndim != 1:
            raise ValueError(f"request {index}: a prompt is a string or a 1-D list of token "
                             f"ids, got shape {ids.shape}")
        if ids.size == 0:
            raise ValueError(f"request {index}: the prompt is empty")
        if not np.issubdtype(ids.dtype, np.integer) or ids.dtype == np.bool_:
            raise ValueError(f"request {index}: token ids must be integers, got dtype {ids.dtype}")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.cfg.vocab:
            raise ValueError(f"request {index}: token id {lo if lo < 0 else hi} is out of range "
                             f"[0, {self.cfg.vocab})")
        return text, [int(t) for t in ids]

    def _check_request(self, index, ids, params):
        if not isinstance(params, SamplingParams):
            raise ValueError(f"request {index}: sampling params must be a SamplingParams, got "
                             f"{type(params).__name__}")
        problem = params.problem(self.cfg.vocab)
        if problem:
            raise ValueError(f"request {index}: bad SamplingParams: {problem}")
        if params.structured_outputs is not None:
            try:
                self.constraint_index(params)
            except ValueError as exc:
                raise ValueError(f"request {index}: structured_outputs: {exc}") from None
        total = len(ids) + params.max_tokens
        if total > self.cfg.max_seq:
            raise ValueError(f"request {index}: prompt ({len(ids)} tokens) + max_tokens "
                             f"({params.max_tokens}) = {total} exceeds max_seq={self.cfg.max_seq}")
        # The last token is sampled but never fed back, so its K/V are never stored.
        blocks = self.block_manager.blocks_for(total - 1)
        if blocks > self.num_blocks:
            raise ValueError(f"request {index}: needs {blocks} KV blocks of {self.block_size} "
                             f"tokens ({total - 1} positions) but the whole pool has "
                             f"{self.num_blocks}")

    def _requests(self, prompts, sampling_params):
        """Every request checked before any work: [(text, ids, params)]."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            raise ValueError("generate: no prompts")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        sampling_params = list(sampling_params)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(sampling_params)} "
                             f"SamplingParams; give one for all or one per prompt")
        requests = []
        for index, (prompt, params) in enumerate(zip(prompts, sampling_params)):
            text, ids = self._token_ids(index, prompt)
            self._check_request(index, ids, params)
            requests.append((text, ids, params))
        return requests

    def add_request(self, prompt, params=None) -> Sequence:
        """Queue one request (checked as generate checks it); step() runs it."""
        (text, ids, params), = self._requests([prompt], params)
        return self._add(text, ids, params, time.perf_counter())

    def _add(self, text, ids, params, arrival):
        seq = Sequence(self._next_index, ids, params, arrival_time=arrival, prompt=text)
        if params.structured_outputs is not None:
            seq.guide = Guide(self.constraint_index(params))
        self._next_index += 1
        self.scheduler.add(seq)
        return seq

    def constraint_index(self, params) -> TokenIndex:
        """The TokenIndex of params.structured_outputs, compiled the first time it is asked
        for (ValueError naming a bad schema or regex). The output may end with the
        tokenizer's eos or any of params.stop_token_ids."""
        if self.tokenizer is None:
            raise ValueError("structured outputs need a tokenizer; this LLM has none")
        eos = self.tokenizer.eos_id
        ends = tuple(sorted(set(params.stop_token_ids) | ({eos} if eos is not None else set())))
        key = (params.structured_outputs.key(), ends)
        if key not in self._constraints:
            dfa = compile_regex(params.structured_outputs.to_regex())
            self._constraints[key] = TokenIndex(dfa, self.tokenizer, eos_ids=ends)
        return self._constraints[key]

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort_request(self, seq) -> bool:
        """Stop a request that add_request() returned, waiting or running: its blocks are
        free when this returns and it finishes with finish_reason "abort". False if it had
        already finished. (A server calls this for a client that went away.)"""
        if seq.is_finished:
            return False
        self.scheduler.abort(seq)
        seq.finish_time = time.perf_counter()
        return True

    # ------------------------------------------------------------ one step

    def step(self) -> list[Sequence]:
        """Schedule, run one forward, pick the tokens, and let the scheduler apply them;
        the sequences that finished in this step."""
        chunks = self.scheduler.schedule()
        if not chunks:
            raise RuntimeError("the scheduler found nothing to run (a request larger than "
                               "the pool should have been refused)")
        start = time.perf_counter()
        invariant = (row_invariant_products(self.invariant_rows) if self.batch_invariant
                     else contextlib.nullcontext())
        with invariant:
            logits = self.runner.run(chunks)  # [one row per sampling chunk (1 + j: verify), V]
        tokens = self._pick(chunks, logits)
        finished = self.scheduler.postprocess(chunks, tokens)
        self.recorder.record(chunks, tokens, time.perf_counter() - start,
                             block_manager=self.block_manager, running=self.scheduler.running,
                             gathered_bytes=self.runner.last_gathered_bytes)
        return finished

    def _pick(self, chunks, logits) -> list:
        """Per chunk, the tokens it picks from its logits rows: None for a chunk that picks
        none; [token] for a decode or a prefill's end; a verify chunk's accepted drafts,
        then the target's own token (speculative.accept)."""
        tokens, row = [], 0
        for chunk in chunks:
            if not chunk.sample:
                tokens.append(None)
                continue
            seq, j = chunk.seq, len(chunk.drafts)
            rows = logits[row:row + j + 1]
            self._check_finite(seq, rows)
            if seq.guide is not None:
                rows = self._constrained(seq, rows, chunk.drafts)
            if j:
                a, token = accept(rows, chunk.drafts, None, self._sampler(seq))
                tokens.append([*chunk.drafts[:a], token])
            else:
                tokens.append([self._sampler(seq).pick(rows[0])[0]])
            row += j + 1
        return tokens

    @staticmethod
    def _constrained(seq, rows, drafts):
        """rows [1 + j, V] with every token seq's constraint forbids at -inf (before the
        sampler's temperature, top-k, top-p and min-p): row i in the state after the output
        and drafts[:i]. A forbidden draft is then rejected by the row before it, as if the
        target had; the rows after it are never read."""
        index = seq.guide.index
        state = seq.guide.state_after(seq.output_token_ids)
        if state is None:
            raise RuntimeError(f"request {seq.index}: its output left its constraint")
        keep = np.zeros(rows.shape, dtype=bool)  # [1 + j, V]; a model's vocab may be padded
        for i in range(len(rows)):
            keep[i, :index.vocab] = index.mask(state)
            if i < len(drafts) and keep[i, drafts[i]]:
                state = index.next_state(state, drafts[i])
        return np.where(keep, rows, -np.inf)

    def _sampler(self, seq) -> Sampler:
        """How seq's verify pass picks (the single-sequence path's Sampler, seq's generator)."""
        p = seq.params
        return Sampler(p.greedy, float(p.temperature), p.k, seq.rng, float(p.top_p),
                       float(p.min_p))

    @staticmethod
    def _check_finite(seq, logits):
        if not np.isfinite(logits).all():
            raise ValueError(f"request {seq.index}: the logits at position "
                             f"{len(seq) - 1} are not finite; check the params")

    # ------------------------------------------------------------ generate and chat

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True) -> list[RequestOutput]:
        """One output per prompt, in prompt order. prompts: strings (needs a tokenizer),
        lists of token ids, or vLLM's dicts; sampling_params: one for all, or one each.
        Every request is checked before any work (ValueError naming its index)."""
        requests = self._requests(prompts, sampling_params)
        arrival = time.perf_counter()
        seqs = [self._add(text, ids, params, arrival) for text, ids, params in requests]
        with _progress(len(seqs), use_tqdm) as progress:
            done = 0
            while any(not s.is_finished for s in seqs):
                done += len(self.step())
                progress(done, sum(len(s.output_token_ids) for s in seqs),
                         self.block_manager.blocks_in_use, self.num_blocks)
        return [self._output(seq) for seq in seqs]

    def chat(self, messages, sampling_params=None, *, use_tqdm=True,
             add_generation_prompt=True) -> list[RequestOutput]:
        """generate() over conversations put through the model's chat template: one
        conversation [{"role": ..., "content": ...}, ...] or a list of them."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer; this LLM has none")
        if isinstance(messages, (list, tuple)) and messages and isinstance(messages[0], dict):
            messages = [messages]
        prompts = [self.chat_prompt_ids(list(conversation), add_generation_prompt)
                   for conversation in messages]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        sampling_params = [self.chat_params(p) for p in sampling_params]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def chat_prompt_ids(self, conversation, add_generation_prompt=True) -> dict:
        """One conversation as a prompt {"prompt_token_ids", "prompt"}: the template's markers
        as special ids, each message's content as ordinary text whatever it holds, so no
        message can open a turn of its own (chat_template.encode_chat)."""
        return {"prompt_token_ids": encode_chat(self.tokenizer, conversation, add_generation_prompt),
                "prompt": chat_prompt(conversation, add_generation_prompt)}

    @property
    def chat_stop_ids(self) -> tuple:
        """The ids that end an assistant's turn (the end of turn and the tokenizer's eos),
        sorted; () without a tokenizer, or for a model without the ChatML end of turn."""
        if self.tokenizer is None:
            return ()
        try:
            return tuple(sorted(stop_token_ids(self.tokenizer)))
        except ValueError:  # no <|im_end|>: the tokenizer's eos still ends a turn
            return ()

    def chat_params(self, params=None) -> SamplingParams:
        """params (SamplingParams() when None) that also stop at the end of an assistant's
        turn: how chat() and the server's /v1/chat/completions both stop. With ignore_eos
        the turn's end is ignored too, as vLLM ignores a model's end-of-turn eos ids, so a
        benchmark's fixed-length chat request keeps its length."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"chat: sampling params must be a SamplingParams, got "
                             f"{type(params).__name__}")
        if params.ignore_eos:
            return params
        extra = tuple(t for t in self.chat_stop_ids if t not in params.stop_token_ids)
        return dataclasses.replace(params, stop_token_ids=params.stop_token_ids + extra)

    def _output(self, seq) -> RequestOutput:
        tokens = seq.output_token_ids
        text = None
        if self.tokenizer is not None:
            shown = tokens[:-1] if seq.finish_reason == "stop" else tokens
            text = self.tokenizer.decode(shown)
        metrics = RequestMetrics(seq.arrival_time, seq.first_scheduled_time,
                                 seq.first_token_time, seq.finish_time, len(tokens))
        return RequestOutput(str(seq.index), seq.prompt, seq.token_ids[:seq.num_prompt_tokens],
                             list(tokens), text, seq.finish_reason, metrics)

    def __repr__(self):
        return (f"LLM(layers={self.cfg.n_layers}, d={self.cfg.d_model}, {np.dtype(self.cfg.dtype)}, "
                f"{self.num_blocks} blocks of {self.block_size}, max_num_seqs={self.max_num_seqs}, "
                f"prefix_caching={self.enable_prefix_caching}, "
                f"batch_invariant={self.batch_invariant}"
                + (f", tensor_parallel_size={self.tensor_parallel_size})"
                   if self.tensor_parallel_size > 1 else ")"))


@contextlib.contextmanager
def _progress(total, use_tqdm):
    """A rich progress bar on a terminal (requests done, generated tokens/s, KV blocks in
    use); nothing when piped or use_tqdm is False. Yields update(done, tokens, used, blocks)."""
    from rich.console import Console
    console = Console(file=sys.stderr)
    if not use_tqdm or not console.is_terminal:
        yield lambda *counts: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn
    start = time.perf_counter()
    with Progress(TextColumn("requests"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[speed]}"), TextColumn("{task.fields[kv]}"),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        task = bar.add_task("generate", total=total, speed="", kv="")

        def update(done, tokens, used, blocks):
            rate = tokens / max(time.perf_counter() - start, 1e-9)
            bar.update(task, completed=done, speed=f"{rate:,.1f} tok/s",
                       kv=f"KV blocks {used}/{blocks}")
        yield update
