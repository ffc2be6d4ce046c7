"""Load demos by number and render them into a recording console, for the demo tests."""

import console
from _common import load_demos, render_demo  # demos/ is on sys.path through conftest.py

from paths import ROOT


def demo(number):
    for module in load_demos():
        if module.NUMBER == number:
            return module
    raise LookupError(f"no demo {number}")


_QUICK_RESULTS = {}
# Demos whose --quick run is too long for the suite, and the smaller run the tests use:
# demo 21 feeds SmolLM2 512 tokens one at a time (about 30 s), its stand-in 160.
SUITE_OPTIONS = {17: {"stand_in": True}, 21: {"stand_in": True}}


def quick_result(number):
    """demo(number).compute(quick=True), computed once per test session: the training demos
    take seconds even when quick, and several test modules read the same result. Callers
    must not modify it (copy.deepcopy first)."""
    if number not in _QUICK_RESULTS:
        _QUICK_RESULTS[number] = demo(number).compute(quick=True,
                                                      **SUITE_OPTIONS.get(number, {}))
    return _QUICK_RESULTS[number]


def rendered_text(module, result, lang, width=80):
    """Everything the demo's render step prints, as plain text at the given width."""
    console.reset_console(width=width, color_system=None, force_terminal=False,
                          file=open("/dev/null", "w", encoding="utf-8"))
    render_demo(module, result, lang)
    return console.get_console().export_text(clear=False)


class ScriptedTimings:
    """A stand-in for transformer_lab.measure.run_side_by_side that times nothing.

    plan(names, k) gives the repeats for the k-th call (from 0) with this tuple of
    names: {name: [seconds, ...]} or {name: ([seconds, ...], [waited, ...])}. The
    functions are not called, so a demo's compute() runs on synthetic timings.
    """

    def __init__(self, plan):
        self.plan = plan
        self.calls = []

    def __call__(self, fns, *, repeats=5, warmup=1):
        names = tuple(fns)
        k = self.calls.count(names)
        self.calls.append(names)
        out = {}
        for name, value in self.plan(names, k).items():
            times, waits = value if isinstance(value, tuple) else (value, [0.0] * len(value))
            out[name] = {"times": list(times), "waits": list(waits)}
        return out


def jittered(seconds, spread=1.05, n=5):
    """n repeats around `seconds`, the slowest `spread` times the fastest."""
    return [seconds * (1 + (spread - 1) * i / (n - 1)) for i in range(n)]


def written_without_missing_glyphs(module, result, tmp_path, lang):
    """Write the demo's figures into tmp_path; their file names, sorted. Fails on a warning
    about a missing glyph, and skips without matplotlib or, for zh, without a Chinese font."""
    import warnings

    import pytest
    pytest.importorskip("matplotlib")
    import _figures
    writer = _figures.prepare(tmp_path, lang)
    if lang == "zh" and writer.lang != "zh":
        pytest.skip("no Chinese font installed (e.g. apt-get install fonts-noto-cjk)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = writer.write(module, result)
    assert not [w for w in caught if "glyph" in str(w.message).lower()]
    return sorted(p.name for p in paths)
