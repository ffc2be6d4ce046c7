"""console/text.py: what test_console.py does not already pin of the formats, wrapping and --json values."""
import json
import math

import numpy as np
import pytest
from rich.cells import cell_len

from console import fmt_bytes, fmt_float, fmt_num, fmt_pct, fmt_time, to_jsonable, wrap_text


def test_to_jsonable_gives_plain_json_types():
    value = {1: np.arange(3), "x": (np.float32(1.5), float("nan"), -math.inf),
             "y": [np.bool_(True), np.int64(7), {"z": np.eye(2)}], "s": "观察"}
    plain = to_jsonable(value)
    assert plain == {"1": [0, 1, 2], "x": [1.5, None, None],
                     "y": [True, 7, {"z": [[1.0, 0.0], [0.0, 1.0]]}], "s": "观察"}
    assert type(plain["y"][1]) is int and type(plain["y"][0]) is bool
    json.dumps(plain, allow_nan=False)  # strict JSON: no NaN or Infinity tokens


def test_to_jsonable_turns_non_finite_array_entries_into_null():
    assert to_jsonable(np.array([1.0, np.nan, np.inf])) == [1.0, None, None]


@pytest.mark.parametrize("x, text", [(float("inf"), "inf "), (float("nan"), "nan "), (-3e15, "-3.0 P"),
                                     (999.4, "999 "), (999.5, "1.0 K"), (0.001234, "0.00123 ")])
def test_fmt_num_edges(x, text):
    assert fmt_num(x) == text


def test_fmt_float_edges():
    assert fmt_float(float("inf")) == "inf" and fmt_float(float("-inf")) == "-inf"
    assert fmt_float(1e5) == "1.00e+05" and fmt_float(99999.0) == "99999.0000"
    assert fmt_float(0.001) == "0.0010" and fmt_float(0.0009) == "9.00e-04"
    assert fmt_float(0.5, digits=2) == "0.50" and fmt_float(np.float32(0.25)) == "0.2500"


def test_fmt_time_boundaries():
    assert [fmt_time(s) for s in (999e-9, 1e-6, 999e-6, 1e-3, 0.999, 1.0)] == [
        "999 ns", "1.00 µs", "999.00 µs", "1.00 ms", "999.00 ms", "1.00 s"]


def test_wrap_text_never_breaks_after_opening_punctuation():
    lines = wrap_text("一二三四五六七（八九）十" * 4, 8)
    assert all(cell_len(line) <= 8 for line in lines)
    assert not any(line.endswith(("（", "“")) for line in lines)


def test_wrap_text_keeps_a_word_longer_than_the_line_whole():
    assert wrap_text("a supercalifragilistic word", 10) == ["a", "supercalifragilistic", "word"]
    assert wrap_text("", 10) == [""]


@pytest.mark.parametrize("x, text", [
    (0.123, "12.3%"), (1.0, "100.0%"), (0.0041, "0.41%"), (0.000052, "0.0052%"), (0, "0%"),
    (0.00999, "1.0%"), (None, "-"), (-0.5, "-50.0%"),
])
def test_fmt_pct_gives_one_decimal_and_two_digits_below_one_percent(x, text):
    assert fmt_pct(x) == text


@pytest.mark.parametrize("n, text", [
    (512, "512 B"), (0, "0 B"), (16 * 1024, "16.0 KiB"), (1.25 * 2 ** 20, "1.25 MiB"),
    (538 * 2 ** 20, "538 MiB"), (2.1 * 2 ** 30, "2.10 GiB"), (1023.9, "1.00 KiB"),
    (99.96 * 2 ** 20, "100 MiB"), (np.int64(3 * 2 ** 30), "3.00 GiB"),
])
def test_fmt_bytes_gives_binary_units_to_three_digits(n, text):
    assert fmt_bytes(n) == text


def test_fmt_bytes_in_a_given_unit_binary_or_decimal():
    assert [fmt_bytes(5.4e8, "GB"), fmt_bytes(1.342e12, "GB"), fmt_bytes(87.06e6, "MB"),
            fmt_bytes(768, "KiB")] == ["0.54 GB", "1342 GB", "87.1 MB", "0.75 KiB"]
    with pytest.raises(ValueError, match="unit must be one of"):
        fmt_bytes(1, "gb")
