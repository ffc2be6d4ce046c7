"""What the command-line tools share: one-line usage errors, option types, quiet exits.

Used by `python -m transformer_lab.chat`, `python -m transformer_lab.train`,
`python -m benchmarks`, the numbered demos (through demos/_common.py) and run_all.py.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

from ..parallel.comm import EXIT_INTERRUPTED  # noqa: F401  128 + SIGINT, for every CLI

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, then exit 2. The line names the problem;
    unless it is about one option's value (argparse then names the option), it also lists
    the valid options, built from the parser itself so that the list cannot go stale.
    quiet=True: print nothing, exit alike (the ranks of a data-parallel run but rank 0)."""

    quiet = False

    def _print_message(self, message, file=None):
        if not self.quiet:
            super()._print_message(message, file)

    def error(self, message):
        if not message.startswith("argument "):
            message += f" (valid options: {self.valid_options()}; --help for more)"
        self.usage_error(message)

    def usage_error(self, message):
        """Exit 2 with `prog: error: message` as the only output."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")

    def given(self, argv) -> set:
        """The dests of the options argv sets, however they were spelled (--steps 5,
        --steps=5, or an abbreviation such as --ste 5): argv parsed with no defaults."""
        saved = [(action, action.default) for action in self._actions]
        try:
            for action in self._actions:
                action.default = argparse.SUPPRESS
            return set(vars(self.parse_args(argv)))
        finally:
            for action, default in saved:
                action.default = default

    def valid_options(self) -> str:
        parts = []
        for action in self._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not action.option_strings:  # a positional argument
                parts.append(f"[{action.metavar or action.dest}]" if action.nargs == "?"
                             else action.metavar or action.dest)
                continue
            name = action.option_strings[-1]
            if action.nargs == 0:  # a flag
                parts.append(name)
            elif action.choices:
                parts.append(f"{name} {'|'.join(map(str, action.choices))}")
            else:
                parts.append(f"{name} {action.metavar or action.dest.upper()}")
        return ", ".join(parts)


# ---------------------------------------------------------------- option types
# Each turns the option's text into a value or raises ArgumentTypeError, which argparse
# reports as "argument --steps: must be >= 1, got 0": one line naming the option.

def int_at_least(low: int):
    """An argparse type: an integer >= low ("expected an integer, got 'x'" otherwise)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    parse.__name__ = f"int >= {low}"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def number_at_least(low: float, *, exclusive: bool = False):
    """An argparse type: a finite number >= low (> low when exclusive)."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or (exclusive and value == low):
            raise argparse.ArgumentTypeError(
                f"must be a finite number {'>' if exclusive else '>='} {low:g}, got {text}")
        return value
    parse.__name__ = f"number {'>' if exclusive else '>='} {low:g}"
    return parse


def non_empty_path(text):
    """An argparse type: a path, which must not be the empty string."""
    if not text:
        raise argparse.ArgumentTypeError("the path is empty ('')")
    return text


def silence_stdout():
    """After a broken pipe (the reader, e.g. `head`, has gone): send what is left, and the
    interpreter's final flush, to /dev/null, so that the exit is quiet. rich does the
    same for the demos."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        pass
