"""transformer_lab.structured: outputs held to a regex, a choice or a JSON schema.

    from transformer_lab.structured import compile_regex, schema_to_regex
    dfa = compile_regex(r"(yes|no)")      # regex.py: parse, NFA, DFA over bytes, minimise
    dfa = compile_regex(schema_to_regex({"type": "object", ...}))

- utf8.py         code point ranges as UTF-8 byte-range sequences
- regex.py        the pattern's syntax and its parser; compile_regex
- automaton.py    Thompson's NFA, subset construction, Moore's minimisation; the DFA
- json_schema.py  a JSON schema (or any JSON object, json_object_regex) as a regex
- index.py        TokenIndex: per DFA state, the vocabulary's allowed tokens and where
                  each leads; Guide: one output's walk through it
- distortion.py   exactly, on a small language: the masked sampler's distribution
                  against the model's own conditioned on the language
"""
from .automaton import DFA
from .index import Guide, TokenIndex
from .json_schema import json_object_regex, schema_to_regex
from .regex import compile_regex

__all__ = ["DFA", "TokenIndex", "Guide", "compile_regex", "schema_to_regex", "json_object_regex"]
