"""What every numbered demo shares: its command line, language choice and JSON output,
and the one copy of the real model (smollm2()) that the demos of a process read.

A demo module defines NUMBER, TITLE = {"zh": ..., "en": ...}, compute(quick=False)
returning plain results, and render(result, lang) printing them; its text in
both languages sits in the demo file itself. run_demo() turns such a module
into a script, and load_demos() lets run_all.py find them all.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

DEMOS_DIR = Path(__file__).resolve().parent
ROOT = DEMOS_DIR.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))
try:  # the runtime: an interpreter without it gets one line, not a traceback
    import numpy  # noqa: F401
    import rich  # noqa: F401
except ImportError as missing:
    sys.stderr.write(f"{Path(sys.argv[0]).name}: error: {missing.name} is not installed for "
                     f"{sys.executable}; activate the quick start's venv (. .venv/bin/activate) "
                     'or install: pip install -e ".[test,real,plots,parallel]"\n')
    raise SystemExit(2) from None

import _figures  # noqa: E402  (imports matplotlib only when figures are asked for)
import console  # noqa: E402
from console import to_jsonable  # noqa: E402
from transformer_lab.cli import EXIT_INTERRUPTED, OneLineParser  # noqa: E402

LANGS = ("zh", "en")
LANG_ENV = "TRANSFORMER_LAB_LANG"
NO_CHINESE_HINT = ("note: this terminal's encoding ({enc}) cannot show Chinese; "
                   "showing English instead. Use --lang en to choose it explicitly.")


class UsageError(Exception):
    """A bad command-line choice: reported in one line, exit status 2."""


def resolve_lang(cli_lang: str | None) -> str:
    """--lang, else TRANSFORMER_LAB_LANG, else Chinese; falls back to English where Chinese cannot print."""
    lang = cli_lang or os.environ.get(LANG_ENV) or "zh"
    if lang not in LANGS:
        source = "--lang" if cli_lang else LANG_ENV
        raise UsageError(f"invalid language {lang!r} from {source}; choose from: {', '.join(LANGS)}")
    if lang == "zh" and not console.can_encode("观察：注意力"):
        enc = getattr(sys.stdout, "encoding", None) or "unknown"
        sys.stderr.write(NO_CHINESE_HINT.format(enc=enc) + "\n")
        lang = "en"
    if not console.can_encode("µ≈√τ→"):
        # Symbols in the English text must not crash an ASCII terminal either.
        try:
            sys.stdout.reconfigure(errors="replace")
        except (AttributeError, ValueError):
            pass
    return lang


def add_lang_option(parser, text):
    """--lang (zh|en), with `text` as its help. resolve_lang checks it rather than argparse:
    it also reads TRANSFORMER_LAB_LANG and falls back to English where Chinese cannot print."""
    parser.add_argument("--lang", metavar="|".join(LANGS), help=text)


def demo_parser(prog: str, description: str) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=description)
    add_lang_option(parser, "zh (default) or en; also TRANSFORMER_LAB_LANG")
    parser.add_argument("--quick", action="store_true", help="smaller timing sizes")
    parser.add_argument("--json", action="store_true", help="print the computed results as JSON")
    parser.add_argument("--pause", action="store_true", help="wait for Enter between parts")
    parser.add_argument("--export", metavar="FILE", help="also write the output to .svg, .html or .txt")
    parser.add_argument("--figures", metavar="DIR",
                        help="also write PNG and SVG figures there (needs matplotlib)")
    return parser


# Options that write files, as (option, attribute of the parsed args). Each is checked
# before anything is computed, and none goes with --json.
OUTPUT_OPTIONS = (("--export", "export"), ("--export-dir", "export_dir"))


def check_outputs(args):
    """Check every file the run will write before any demo runs: UsageError, one line, if one cannot be."""
    given = [option for option, attr in OUTPUT_OPTIONS if getattr(args, attr, None)]
    if given and getattr(args, "json", False):
        raise UsageError(f"--json prints the computed results, not the tables, so {given[0]} would "
                         f"have nothing to write; use one or the other")
    if getattr(args, "export", None):
        try:
            console.check_export_path(args.export)
        except ValueError as e:
            raise UsageError(f"--export {e}") from None
    if getattr(args, "export_dir", None):
        check_export_dir(args.export_dir)


def check_export_dir(directory) -> None:
    """Create `directory` if needed and make sure a file can be written in it (UsageError if not)."""
    try:
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise UsageError(f"--export-dir {directory}: exists and is not a directory")
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise UsageError(f"--export-dir {directory}: cannot write there ({e.strerror or e})") from None


def export_name(module, suffix: str = ".svg") -> str:
    """A demo's file name in --export-dir: 03_causal_mask.svg."""
    return Path(module.__file__).stem + suffix


def render_demo(module, result, lang: str):
    """The demo's header, then its own render step."""
    console.set_lang(lang)
    console.print_header(f"{module.NUMBER:02d} · {module.TITLE[lang]}")
    module.render(result, lang)


def stop_quietly(body) -> int:
    """body()'s exit status; Ctrl-C ends it with 130 and Ctrl-D at a --pause prompt with 0,
    neither with a traceback. Nothing else in a demo reads the terminal, so an EOFError
    can only come from that prompt."""
    try:
        return body()
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return EXIT_INTERRUPTED
    except EOFError:  # Ctrl-D at the pause: the lecturer is done
        print()
        return 0


def run_demo(module, argv=None) -> int:
    """Run one demo module as a script: parse options, compute, then render or dump JSON."""
    prog = Path(module.__file__).name
    parser = demo_parser(prog, module.TITLE["en"])
    args = parser.parse_args(argv)
    try:
        lang = resolve_lang(args.lang)
        check_outputs(args)
        writer = _figures.prepare(args.figures, lang) if args.figures else None
    except (UsageError, _figures.FigureError) as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return 2
    console.set_pause(args.pause)

    def body():
        result = module.compute(quick=args.quick)
        if args.json:
            print(json.dumps(to_jsonable(result), ensure_ascii=False, indent=1))
        else:
            render_demo(module, result, lang)
            if args.export:
                console.export(args.export)
                sys.stderr.write(f"exported to {args.export}\n")
        if writer:
            writer.write(module, result)
            sys.stderr.write(writer.summary() + "\n")
        return 0
    return stop_quietly(body)


# ---------------------------------------------------------------- the real model

SMOLLM2 = {}  # "path", "model" (cfg, params, tokenizer) and "seconds": loaded once per process


def smollm2():
    """SmolLM2-135M-Instruct's (cfg, params, tokenizer) from the installed GGUF file, loaded
    on the first call and shared by every demo of the process, which read it and never
    change it (one copy: a run_all of six demos that use it holds it once). Raises what
    find_model and load_gguf raise: ImportError without gguf, FileNotFoundError without
    the file, OSError or ValueError for a file that does not load (SMOLLM2["path"] names it)."""
    if "model" not in SMOLLM2:
        from transformer_lab import find_model, load_gguf
        from transformer_lab.measure import timed
        path = SMOLLM2["path"] = find_model()
        SMOLLM2["model"], SMOLLM2["seconds"] = timed(lambda: load_gguf(path))
    return SMOLLM2["model"]


def load_demos() -> list:
    """Every demos/NN_name.py, imported by path and sorted by number."""
    modules = [_load(path) for path in sorted(DEMOS_DIR.glob("[0-9][0-9]_*.py"))]
    return sorted(modules, key=lambda m: m.NUMBER)


def load_demo(number: int):
    """Demo `number`'s module alone (demo 13 and 19 train with demo 11's setup), loaded once."""
    (path,) = DEMOS_DIR.glob(f"{number:02d}_*.py")
    return _load(path)


def _load(path):
    name = "demo_" + path.stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
