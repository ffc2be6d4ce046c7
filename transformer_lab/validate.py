"""Checking arguments by name: one place for "an int, but not a bool", and one for "a
finite number in a range, not a bool".

Python's bool is an int (True == 1), so isinstance(x, int) lets True through as a
count of 1. Every integer and number argument of the package is checked here instead,
so that top_k=True, steps=2.0 or lr=nan is a ValueError naming the argument, never
taken silently.
"""
from __future__ import annotations

import math

import numpy as np


def is_int(value) -> bool:
    """Whether value is an int or a NumPy integer, and not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(value, name: str, *, low=None, high=None, what: str | None = None) -> int:
    """value as a Python int, if it is an int (not a bool) within [low, high].

    Otherwise a ValueError "{name} must be {what}, got {value!r}"; what defaults to
    "an int", "an int >= low", "an int <= high" or "an int in [low, high]", and a
    caller may give its own wording (e.g. "a positive int").
    """
    if is_int(value) and (low is None or value >= low) and (high is None or value <= high):
        return int(value)
    if what is None:
        what = ("an int" if low is None and high is None
                else f"an int >= {low}" if high is None
                else f"an int <= {high}" if low is None
                else f"an int in [{low}, {high}]")
    raise ValueError(f"{name} must be {what}, got {value!r}")


def check_number(value, name: str, *, low=None, high=None, low_open=False, high_open=False,
                 what: str | None = None) -> float:
    """value as a Python float, if it is a finite int or float (not a bool) within [low,
    high]; low_open / high_open leave the bound itself out.

    Otherwise a ValueError "{name} must be {what}, got {value!r}"; what defaults to "a
    finite number", "a finite number >= low" (> when open), "... <= high", or "a number
    in [low, high]" with a round bracket at an open end."""
    number = isinstance(value, (int, float, np.integer, np.floating)) \
        and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)
    if number and (low is None or value > low or (value == low and not low_open)) \
            and (high is None or value < high or (value == high and not high_open)):
        return float(value)
    if what is None:
        what = ("a finite number" if low is None and high is None
                else f"a finite number {'>' if low_open else '>='} {low}" if high is None
                else f"a finite number {'<' if high_open else '<='} {high}" if low is None
                else f"a number in {'(' if low_open else '['}{low}, {high}"
                     f"{')' if high_open else ']'}")
    raise ValueError(f"{name} must be {what}, got {value!r}")
