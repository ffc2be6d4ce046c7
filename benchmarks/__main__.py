"""python -m benchmarks [--quick] [--json PATH] [--only SECTION ...] [--no-torch]"""
from __future__ import annotations

import argparse
import sys

from .suite import DEFAULT_JSON, FULL, QUICK, SECTIONS, run_all


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="transformer_lab benchmarks: attention_core throughput, forward tokens/s, "
                    "KV-cache decode and memory, a training step. Prints tables and writes the same "
                    "figures as JSON.")
    parser.add_argument("--quick", action="store_true",
                        help="a short run at smaller sizes (T up to 512, contexts up to 512)")
    parser.add_argument("--json", metavar="PATH", default=str(DEFAULT_JSON),
                        help="where to write the JSON results "
                             "(default: benchmarks/results/latest.json)")
    parser.add_argument("--no-json", action="store_true", help="do not write a JSON file")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION",
                        help=f"run only these sections ({', '.join(SECTIONS)})")
    parser.add_argument("--no-torch", action="store_true",
                        help="skip the PyTorch comparison even when PyTorch is installed")
    return parser.parse_args(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    profile = QUICK if args.quick else FULL
    run_all(profile, None if args.no_json else args.json, sections=tuple(args.only or SECTIONS),
            use_torch=not args.no_torch, command=" ".join(["python -m benchmarks", *argv]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
