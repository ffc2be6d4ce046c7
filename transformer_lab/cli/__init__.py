"""What the command-line tools share: one-line usage errors and quiet exits.

Used by `python -m transformer_lab.chat` and `python -m benchmarks`; the demos
and run_all.py have the same behaviour through demos/_common.py.
"""
from __future__ import annotations

import argparse
import os
import sys

EXIT_USAGE = 2
# 128 + SIGINT: the status a shell reports for a command stopped by Ctrl-C.
EXIT_INTERRUPTED = 130


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, then exit 2. The line names the problem;
    unless it is about one option's value (argparse then names the option), it also lists
    the valid options, built from the parser itself so that the list cannot go stale."""

    def error(self, message):
        if not message.startswith("argument "):
            message += f" (valid options: {self.valid_options()}; --help for more)"
        self.usage_error(message)

    def usage_error(self, message):
        """Exit 2 with `prog: error: message` as the only output."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")

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


def silence_stdout():
    """After a broken pipe (the reader, e.g. `head`, has gone): send what is left, and the
    interpreter's final flush, to /dev/null, so that the exit is quiet. rich does the
    same for the demos."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        pass
