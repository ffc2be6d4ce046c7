"""Checking arguments by name: one place for "an int, but not a bool".

Python's bool is an int (True == 1), so isinstance(x, int) lets True through as a
count of 1. Every integer argument of the package is checked here instead, so that
top_k=True or steps=2.0 is a ValueError naming the argument, never taken silently.
"""
from __future__ import annotations

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
