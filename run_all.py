#!/usr/bin/env python3
"""Run every lecture demo in order, in one process.

    python run_all.py                 # all demos, Chinese
    python run_all.py --lang en --quick
    python run_all.py --only 1,3,5 --export slides.svg
    python run_all.py --json > results.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "demos"))

import console  # noqa: E402
from _common import (LANGS, OneLineParser, UsageError, load_demos, render_demo,  # noqa: E402
                     resolve_lang, stop_quietly)
from console import to_jsonable  # noqa: E402

EXPORT_SUFFIXES = (".svg", ".html", ".htm", ".txt")
DONE = {"zh": "全部演示完成：{n} 个，用时 {t}", "en": "All demos done: {n} in {t}"}


def parse_only(text: str, numbers: list[int]) -> list[int]:
    valid = ", ".join(str(n) for n in numbers)
    chosen = []
    for part in text.split(","):
        part = part.strip()
        # ASCII digits only: int() also reads "١" as 1 and str.isdigit() accepts "²".
        if not (part.isascii() and part.isdigit()) or int(part) not in numbers:
            raise UsageError(f"unknown demo number {part!r} in --only; valid demos: {valid}")
        chosen.append(int(part))
    return chosen


def main(argv=None) -> int:
    demos = load_demos()
    numbers = [d.NUMBER for d in demos]
    parser = OneLineParser(
        prog="run_all.py", description="Run the transformer_lab lecture demos in order.",
        valid_hint="valid options: --only N,N  --lang zh|en  --quick  --export FILE.svg|.html|.txt  "
                   "--json  --pause")
    parser.add_argument("--only", help=f"comma-separated demo numbers ({', '.join(map(str, numbers))})")
    parser.add_argument("--lang", help=f"{' or '.join(LANGS)}; also TRANSFORMER_LAB_LANG")
    parser.add_argument("--quick", action="store_true", help="smaller timing sizes")
    parser.add_argument("--export", metavar="FILE", help="write everything printed to .svg, .html or .txt")
    parser.add_argument("--json", action="store_true", help="computed results as JSON, no tables")
    parser.add_argument("--pause", action="store_true", help="wait for Enter between demos and parts")
    args = parser.parse_args(argv)
    try:
        lang = resolve_lang(args.lang)
        chosen = parse_only(args.only, numbers) if args.only is not None else numbers
        if args.export and Path(args.export).suffix.lower() not in EXPORT_SUFFIXES:
            raise UsageError(f"--export {args.export!r}: choose a file ending in "
                             f"{', '.join(EXPORT_SUFFIXES)}")
    except UsageError as e:
        sys.stderr.write(f"run_all.py: error: {e}\n")
        return 2

    console.set_pause(args.pause)
    start = time.perf_counter()
    results = {}
    for demo in demos:
        if demo.NUMBER not in chosen:
            continue
        result = demo.compute(quick=args.quick)
        if args.json:
            results[f"{demo.NUMBER:02d}"] = {"title": demo.TITLE[lang], "result": result}
            continue
        if results:
            console.pause()
        render_demo(demo, result, lang)
        results[f"{demo.NUMBER:02d}"] = True
    if args.json:
        print(json.dumps(to_jsonable({"lang": lang, "demos": results}), ensure_ascii=False, indent=1))
        return 0
    console.print_text("\n" + DONE[lang].format(n=len(results), t=console.fmt_time(time.perf_counter() - start)),
                       style="bold green")
    if args.export:
        console.export(args.export)
        sys.stderr.write(f"exported to {args.export}\n")
    return 0


if __name__ == "__main__":
    sys.exit(stop_quietly(main))  # Ctrl-C: exit 130; Ctrl-D at a --pause prompt: stop, exit 0
