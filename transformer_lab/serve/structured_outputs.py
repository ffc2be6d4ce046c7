"""StructuredOutputsParams: hold a request's output to a JSON schema, a regex or a choice.

vLLM's names (SamplingParams(structured_outputs=StructuredOutputsParams(...))):

    json=schema         a JSON schema, a dict or JSON text (structured.schema_to_regex)
    regex=pattern       the whole output matches it (structured.compile_regex's syntax)
    choice=[str, ...]   the output is exactly one of the strings
    json_object=True    any JSON object, nested at most JSON_OBJECT_DEPTH deep

Exactly one of them, or a ValueError (so is schema text that is not JSON). The engine compiles the constraint into a DFA
and its TokenIndex over the tokenizer's vocabulary (once per distinct constraint, then
cached) and masks every token the output could not continue with, before temperature,
top-k, top-p and min-p, as vLLM does. The end of sequence is allowed only where the
output is complete; max_tokens reached before that finishes with "length", the text as
far as it got.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..structured import json_object_regex, schema_to_regex
from ..structured.json_schema import escape

KINDS = ("json", "regex", "choice", "json_object")


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: object = None  # a schema: dict or JSON text
    regex: str | None = None
    choice: tuple | None = None
    json_object: bool | None = None

    def __post_init__(self):
        if self.choice is not None and not isinstance(self.choice, (str, bytes)):
            try:
                object.__setattr__(self, "choice", tuple(self.choice))
            except TypeError:
                pass
        problem = self.problem()
        if problem:
            raise ValueError(f"StructuredOutputsParams: {problem}")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def problem(self) -> str | None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            return (f"give exactly one of {', '.join(KINDS)}; got "
                    f"{', '.join(given) if given else 'none'}")
        if self.json_object not in (None, False, True):
            return f"json_object must be True, got {self.json_object!r}"
        if self.json is not None and not isinstance(self.json, (dict, str)):
            return f"json must be a schema (a dict or JSON text), got {type(self.json).__name__}"
        if isinstance(self.json, str):  # cheap to check here; the rest waits for the engine
            try:
                json.loads(self.json)
            except ValueError as e:
                return f"json: schema is not JSON: {e}"
        if self.regex is not None and not isinstance(self.regex, str):
            return f"regex must be a string, got {type(self.regex).__name__}"
        if self.choice is not None:
            if not isinstance(self.choice, tuple) or not all(isinstance(c, str) for c in self.choice):
                return f"choice must be a list of strings, got {self.choice!r:.60}"
            if not self.choice:
                return "choice is an empty list: give at least one string"
            if "" in self.choice:
                return "choice holds an empty string"
        return None

    def to_regex(self) -> str:
        """The constraint as one regex (ValueError naming what is wrong with a schema)."""
        if self.regex is not None:
            return self.regex
        if self.choice is not None:
            return "(" + "|".join(escape(c) for c in self.choice) + ")"
        if self.json_object:
            return json_object_regex()
        return schema_to_regex(self.json)

    def key(self) -> tuple:
        """What identifies the constraint, for the engine's cache of compiled ones."""
        value = getattr(self, self.kind)
        if isinstance(value, dict):
            value = json.dumps(value, sort_keys=True)
        return self.kind, value
