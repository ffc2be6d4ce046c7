"""python -m benchmarks [--quick] [--json PATH] [--only SECTION ...] [--no-torch]

`python -m benchmarks` works from the repository root. From anywhere else, give
the folder's path: `python path/to/transformer_lab/benchmarks --quick`.
Exit codes: 0 done, 2 bad options or a --json path that cannot be written
(checked before anything runs), 130 interrupted (Ctrl-C).
"""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as `python path/to/benchmarks`: import it from its repository
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.suite import DEFAULT_JSON, DEFAULT_SECTIONS, FULL, QUICK, SECTIONS, run_all  # noqa: E402
from transformer_lab.cli import EXIT_INTERRUPTED, OneLineParser  # noqa: E402

# Quick runs write their own file: latest.json holds the last full run, which the README cites.
QUICK_JSON = DEFAULT_JSON.with_name("quick.json")


def build_parser():
    parser = OneLineParser(
        prog="python -m benchmarks",
        description="transformer_lab benchmarks: attention_core throughput, forward tokens/s, "
                    "KV-cache decode and memory, a training step. Prints tables and writes the same "
                    "figures as JSON.",
        epilog="Run it from the repository root, or from anywhere as "
               "`python path/to/transformer_lab/benchmarks`.")
    parser.add_argument("--quick", action="store_true",
                        help="a short run at smaller sizes (T up to 512, contexts up to 512)")
    parser.add_argument("--json", metavar="PATH",
                        help="where to write the JSON results (default: benchmarks/results/"
                             "latest.json, or quick.json with --quick)")
    parser.add_argument("--no-json", action="store_true", help="do not write a JSON file")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION",
                        help=f"run only these sections ({', '.join(SECTIONS)}; without --only: "
                             f"{', '.join(DEFAULT_SECTIONS)})")
    parser.add_argument("--no-torch", action="store_true",
                        help="skip the PyTorch comparison even when PyTorch is installed")
    return parser


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def writable_json_path(text: str) -> Path:
    """The --json path, checked before minutes of benchmarking: its folder exists or can be
    made, and the file can be written. ValueError naming the problem otherwise."""
    if not text:
        raise ValueError("--json: the path is empty ('')")
    path = Path(text)
    if path.is_dir():
        raise ValueError(f"--json {text}: is a directory; give a file name")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):  # "a": an existing file is left as it is
            pass
    except (FileExistsError, NotADirectoryError):  # a file where a folder should be
        file = next(parent for parent in path.parents if parent.exists())
        raise ValueError(f"--json {text}: {file} is a file, not a folder") from None
    except OSError as exc:
        raise ValueError(f"--json {text}: cannot write there ({exc.strerror or exc})") from None
    if not existed:
        path.unlink()
    return path


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    json_path = None
    if not args.no_json:
        try:
            json_path = writable_json_path(args.json if args.json is not None
                                           else str(QUICK_JSON if args.quick else DEFAULT_JSON))
        except ValueError as exc:
            parser.usage_error(str(exc))
    profile = QUICK if args.quick else FULL
    try:
        run_all(profile, json_path, sections=tuple(args.only or DEFAULT_SECTIONS),
                use_torch=not args.no_torch, command=" ".join(["python -m benchmarks", *argv]))
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
