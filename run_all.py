#!/usr/bin/env python3
"""Run every lecture demo in order, in one process.

    python run_all.py                 # all demos, Chinese
    python run_all.py --lang en --quick
    python run_all.py --only 1,3,5 --export slides.svg
    python run_all.py --export-dir slides/    # one SVG per demo: slides/03_causal_mask.svg, ...
    python run_all.py --json > results.json
    python run_all.py --figures figures/  # also PNG and SVG figures (needs matplotlib)

In a notebook: from run_all import run_demo; run_demo(3, lang="en")
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "demos"))

import _common  # noqa: E402, F401  (first: it names a missing runtime in one line)
import _figures  # noqa: E402
import console  # noqa: E402
from _common import (LANGS, UsageError, add_lang_option, check_outputs,  # noqa: E402
                     export_name, load_demos, render_demo, resolve_lang, stop_quietly)
from console import to_jsonable  # noqa: E402
from transformer_lab.cli import OneLineParser  # noqa: E402  (importable once _common has run)

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


def build_parser(numbers: list[int]) -> OneLineParser:
    parser = OneLineParser(prog="run_all.py",
                           description="Run the transformer_lab lecture demos in order.")
    parser.add_argument("--only", metavar="N,N",
                        help=f"comma-separated demo numbers ({', '.join(map(str, numbers))})")
    add_lang_option(parser, f"{' or '.join(LANGS)}; also TRANSFORMER_LAB_LANG")
    parser.add_argument("--quick", action="store_true", help="smaller timing sizes")
    parser.add_argument("--export", metavar="FILE", help="write everything printed to .svg, .html or .txt")
    parser.add_argument("--export-dir", metavar="DIR", help="write one SVG per demo into DIR, for slides")
    parser.add_argument("--json", action="store_true", help="computed results as JSON, no tables")
    parser.add_argument("--pause", action="store_true", help="wait for Enter between demos and parts")
    parser.add_argument("--figures", metavar="DIR", help="also write PNG and SVG figures there "
                        "(needs matplotlib)")
    return parser


def main(argv=None) -> int:
    demos = load_demos()
    numbers = [d.NUMBER for d in demos]
    args = build_parser(numbers).parse_args(argv)
    try:
        lang = resolve_lang(args.lang)
        chosen = parse_only(args.only, numbers) if args.only is not None else numbers
        check_outputs(args)  # every file this run writes, before any demo runs
        writer = _figures.prepare(args.figures, lang) if args.figures else None
    except (UsageError, _figures.FigureError) as e:
        sys.stderr.write(f"run_all.py: error: {e}\n")
        return 2

    console.set_pause(args.pause)
    start = time.perf_counter()
    results = {}
    for demo in demos:
        if demo.NUMBER not in chosen:
            continue
        result = demo.compute(quick=args.quick)
        if writer:
            writer.write(demo, result)
        if args.json:
            results[f"{demo.NUMBER:02d}"] = {"title": demo.TITLE[lang], "result": result}
            continue
        if results:
            console.pause()
        start_mark = console.mark()
        render_demo(demo, result, lang)
        if args.export_dir:
            console.export(Path(args.export_dir) / export_name(demo), start=start_mark)
        results[f"{demo.NUMBER:02d}"] = True
    if writer:
        sys.stderr.write(writer.summary() + "\n")
    if args.json:
        print(json.dumps(to_jsonable({"lang": lang, "demos": results}), ensure_ascii=False, indent=1))
        return 0
    console.print_text("\n" + DONE[lang].format(n=len(results), t=console.fmt_time(time.perf_counter() - start)),
                       style="bold green")
    if args.export:
        console.export(args.export)
        sys.stderr.write(f"exported to {args.export}\n")
    if args.export_dir:
        sys.stderr.write(f"exported {len(results)} files to {args.export_dir}\n")
    return 0


def run_demo(number: int, lang: str = "zh", quick: bool = False, width: int = 80) -> None:
    """Run one demo in a notebook cell (or a Python session): one output, no SystemExit.

        from run_all import run_demo
        run_demo(3, lang="en")

    In Jupyter the demo is recorded and shown once, as coloured HTML that keeps
    Chinese aligned (plain text for viewers without HTML); elsewhere it prints to the
    terminal. Returns None, so the cell shows no Out[] value. A bad number or
    language raises ValueError.
    """
    demos = {d.NUMBER: d for d in load_demos()}
    if number not in demos:
        raise ValueError(f"run_demo: no demo {number!r}; valid demos: {', '.join(map(str, demos))}")
    if lang not in LANGS:
        raise ValueError(f"run_demo: invalid lang {lang!r}; choose from: {', '.join(LANGS)}")
    demo = demos[number]
    result = demo.compute(quick=quick)
    from rich.console import _is_jupyter
    if not _is_jupyter():
        render_demo(demo, result, lang)
        return None
    from IPython.display import display
    with console.recording(width=width) as c:
        render_demo(demo, result, lang)
    display({"text/html": console.html_fragment(c), "text/plain": c.export_text(clear=False)}, raw=True)
    return None


if __name__ == "__main__":
    sys.exit(stop_quietly(main))  # Ctrl-C: exit 130; Ctrl-D at a --pause prompt: stop, exit 0
