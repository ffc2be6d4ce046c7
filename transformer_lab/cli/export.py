"""Export a model to a GGUF file, for llama.cpp, Ollama and HF transformers.

    python -m transformer_lab.export runs/json/model.npz runs/json/model-q8_0.gguf --type q8_0
    llama-cli -m runs/json/model-q8_0.gguf -cnv          # then llama.cpp's own command line

IN is a model.npz that a fine-tune wrote (python -m transformer_lab.train --init ...) or a
GGUF file (written again, e.g. in another type); OUT is written atomically. --type is what
the matrices are stored in (f32, f16, bf16, q8_0, q4_0, q4_1; default q8_0); norm gains
stay f32. pretrained/gguf_write.py writes the file.

Exit codes: 0 written, 1 OUT could not be written (a missing folder, a full disk),
2 bad options, or IN missing, unreadable or not a llama model with its tokenizer,
130 interrupted (Ctrl-C; OUT is left as it was).
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import EXIT_INTERRUPTED, OneLineParser, non_empty_path
from ..pretrained.gguf_write import DTYPES, check_llama, save_gguf
from ..pretrained.model_file import load_model

DEFAULT_TYPE = "q8_0"


def build_parser():
    p = OneLineParser(prog="python -m transformer_lab.export",
                      description="Write a model.npz (or a GGUF file) as a llama GGUF file.")
    p.add_argument("model", metavar="IN", type=non_empty_path,
                   help="a model.npz written by a fine-tune, or a GGUF file")
    p.add_argument("out", metavar="OUT", type=non_empty_path, help="the GGUF file to write")
    p.add_argument("--type", choices=DTYPES, metavar="TYPE", default=DEFAULT_TYPE,
                   help=f"storage type of the matrices: {', '.join(DTYPES)} (default {DEFAULT_TYPE})")
    p.add_argument("--name", metavar="NAME", help="general.name in the file (default: OUT's name)")
    return p


def export(model, out, dtype, name=None, parser=None) -> Path:
    """Load `model` and write it to `out` as GGUF in `dtype`; a bad model is a usage error
    through `parser` (else ValueError)."""
    try:
        if not Path(model).is_file():
            raise FileNotFoundError(f"{model}: no such file")
        cfg, params, tokenizer = load_model(model)
        check_llama(cfg)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        if parser is None:
            raise
        parser.usage_error(f"{model}: {str(exc).splitlines()[0]}")
    try:
        return save_gguf(out, params, cfg, tokenizer, dtype=dtype, name=name)
    except ValueError as exc:  # the weights themselves (NaN, rows not whole blocks)
        if parser is None:
            raise
        parser.usage_error(f"{model}: {exc}")


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if Path(args.out).suffix.lower() != ".gguf":
        parser.usage_error(f"OUT {args.out} should end in .gguf (llama.cpp and HF look for it)")
    try:
        path = export(args.model, args.out, args.type, args.name, parser)
    except KeyboardInterrupt:
        print("interrupted; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:
        print(f"error: cannot write {args.out}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({args.type}, {path.stat().st_size / 2**20:,.1f} MiB) from {args.model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
