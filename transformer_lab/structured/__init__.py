"""transformer_lab.structured: outputs held to a regex, a choice or a JSON schema.

    from transformer_lab.structured import compile_regex
    dfa = compile_regex(r"(yes|no)")      # regex.py: parse, NFA, DFA over bytes, minimise

- utf8.py       code point ranges as UTF-8 byte-range sequences
- regex.py      the pattern's syntax and its parser; compile_regex
- automaton.py  Thompson's NFA, subset construction, Moore's minimisation; the DFA
"""
from .automaton import DFA
from .regex import compile_regex

__all__ = ["DFA", "compile_regex"]
