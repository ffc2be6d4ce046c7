"""A JSON schema as a regex: the JSON texts a model may write that the schema accepts.

    schema_to_regex({"type": "object", "properties": {"name": {"type": "string"}},
                     "required": ["name"]})
    # '\\{[ ]?"name"[ ]?:[ ]?"(...)*"[ ]?\\}', roughly

Every string the regex matches parses as JSON and validates against the schema; it is
a subset of the valid texts, chosen as outlines chooses it:

- whitespace is tight: at most one space where JSON allows whitespace (small models
  loop on whitespace when it is free);
- an object's properties come in their declared order; one not in `required` may be
  left out; no property beyond `properties` is written (additionalProperties may be
  false or absent: the texts are valid either way). Without `properties`, an object
  whose additionalProperties is a schema maps strings to it;
- `pattern` is unanchored, as JSON Schema says (a leading ^ or trailing $ anchors it),
  and its characters are written as themselves: any that JSON must escape (", \\ and
  control characters) are left out of its classes;
- enum and const values are written in compact JSON (json.dumps, no spaces).

Supported: type (one or a list) object (properties, required, additionalProperties),
string (enum, const, minLength, maxLength, pattern), integer, number, boolean, null,
array (items, minItems, maxItems); enum, const, anyOf, an allOf of one schema; local
$ref ("#", "#/$defs/..." or "#/definitions/..."), each recursion cut at max_ref_depth.
Annotations (title, description, default, examples, $schema, $id, ...) constrain
nothing. Any other keyword is a ValueError naming it, never silently ignored.

json_object_regex(depth) is any JSON object, nested at most depth levels deep.
"""
from __future__ import annotations

import json

from .regex import parse
from .utf8 import complement, merge_ranges

WS = "[ ]?"  # at most one space
STRING_CHAR = r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'  # one JSON string character
STRING = f'"{STRING_CHAR}*"'
INTEGER = r"-?(0|[1-9][0-9]*)"
NUMBER = INTEGER + r"(\.[0-9]+)?([eE][+-]?[0-9]+)?"
SCALARS = {"string": STRING, "integer": INTEGER, "number": NUMBER, "boolean": "(true|false)",
           "null": "null"}
JSON_OBJECT_DEPTH = 3  # json_object=True: objects and arrays nested at most this deep
MAX_REF_DEPTH = 3
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
               "readOnly", "writeOnly", "deprecated", "$defs", "definitions"}
KEYWORDS = {  # what each type may hold besides the keywords any schema may
    "object": {"properties", "required", "additionalProperties"},
    "string": {"minLength", "maxLength", "pattern"},
    "array": {"items", "minItems", "maxItems"},
    "integer": set(), "number": set(), "boolean": set(), "null": set()}
ANY_SCHEMA = {"type", "enum", "const", "anyOf", "allOf", "$ref"}
META = set("\\.^$*+?{}[]|()")


def escape(text) -> str:
    """text as a regex that matches it literally."""
    return "".join("\\" + c if c in META else c for c in text)


def compact(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def schema_to_regex(schema, *, max_ref_depth=MAX_REF_DEPTH) -> str:
    """The regex of the JSON texts (tight whitespace) that validate against schema, a dict
    or JSON text. ValueError naming an unsupported keyword or a malformed schema."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise ValueError(f"schema is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"schema must be a JSON object (a dict), got {type(schema).__name__}")
    regex = Converter(schema, max_ref_depth).convert(schema, "#", 0)
    if regex is None:
        raise ValueError(f"schema: its $ref recursion does not end within {max_ref_depth} levels")
    return regex


def json_object_regex(depth=JSON_OBJECT_DEPTH) -> str:
    """Any JSON object, nested at most depth levels deep (json_object=True)."""
    return _object_of(_any_value(depth - 1))


def _any_value(depth):
    scalars = "|".join(SCALARS.values())
    if depth <= 0:
        return f"({scalars})"
    inner = _any_value(depth - 1)
    return f"({scalars}|{_object_of(inner)}|{_array_of(inner, 0, None)})"


def _object_of(value):
    member = f"{STRING}{WS}:{WS}{value}"
    return rf"\{{{WS}({member}({WS},{WS}{member})*)?{WS}\}}"


def _array_of(item, lo, hi):
    """[item, ...] with lo..hi items (hi None: any number)."""
    rest = f"({WS},{WS}{item})"
    if hi == 0:
        body = ""
    elif lo == 0:
        body = f"({item}{rest}{{0,{hi - 1}}})?" if hi is not None else f"({item}{rest}*)?"
    else:
        body = f"{item}{rest}{{{lo - 1},{'' if hi is None else hi - 1}}}"
    return rf"\[{WS}{body}{WS}\]"


class Converter:
    def __init__(self, root, max_ref_depth):
        self.root, self.max_ref_depth = root, max_ref_depth

    def convert(self, schema, where, depth):
        """The regex of schema (at JSON pointer `where`), or None: nothing within the $ref
        depth bound (a branch that recursion alone would fill)."""
        if schema is True or schema == {}:
            return _any_value(JSON_OBJECT_DEPTH)
        if not isinstance(schema, dict):
            raise ValueError(f"schema at {where} must be an object, got {schema!r:.60}")
        types = schema.get("type")
        types = [types] if isinstance(types, str) else types
        allowed = set(ANY_SCHEMA) | ANNOTATIONS
        for t in types or ():
            if t not in KEYWORDS:
                raise ValueError(f"schema at {where}: unsupported type {t!r}")
            allowed |= KEYWORDS[t]
        if types is None:  # no type: take the keywords of whichever type they belong to
            allowed |= set().union(*KEYWORDS.values())
        unknown = sorted(set(schema) - allowed)
        if unknown:
            raise ValueError(f"schema at {where}: unsupported keyword {unknown[0]!r}")
        if "$ref" in schema:
            return self.ref(schema["$ref"], where, depth)
        if "allOf" in schema:
            if not isinstance(schema["allOf"], list) or len(schema["allOf"]) != 1:
                raise ValueError(f"schema at {where}: allOf is supported with one schema only")
            return self.convert(schema["allOf"][0], f"{where}/allOf/0", depth)
        if "const" in schema:
            return escape(compact(schema["const"]))
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise ValueError(f"schema at {where}: enum must be a non-empty list")
            return "(" + "|".join(escape(compact(v)) for v in values) + ")"
        if "anyOf" in schema:
            options = schema["anyOf"]
            if not isinstance(options, list) or not options:
                raise ValueError(f"schema at {where}: anyOf must be a non-empty list")
            return _alternatives(self.convert(s, f"{where}/anyOf/{i}", depth)
                                 for i, s in enumerate(options))
        if types is None:
            raise ValueError(f"schema at {where} has no type, enum, const, anyOf or $ref")
        return _alternatives(self.typed(t, schema, where, depth) for t in types)

    def ref(self, ref, where, depth):
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise ValueError(f"schema at {where}: only local $refs (#/...) are supported, "
                             f"got {ref!r}")
        if depth >= self.max_ref_depth:
            return None
        target = self.root
        for part in ref[2:].split("/") if ref != "#" else ():
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise ValueError(f"schema at {where}: $ref {ref!r} points at nothing")
            target = target[part]
        return self.convert(target, ref, depth + 1)

    def typed(self, kind, schema, where, depth):
        if kind == "string":
            return string_regex(schema, where)
        if kind == "array":
            return self.array(schema, where, depth)
        if kind == "object":
            return self.object(schema, where, depth)
        return SCALARS[kind]

    def array(self, schema, where, depth):
        lo, hi = _bounds(schema, "minItems", "maxItems", where)
        item = self.convert(schema.get("items", True), f"{where}/items", depth)
        if item is None:
            return _array_of("", 0, 0) if lo == 0 else None
        return _array_of(item, lo, hi)

    def object(self, schema, where, depth):
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties", True)
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise ValueError(f"schema at {where}: properties must be an object and required "
                             f"a list")
        missing = [name for name in required if name not in properties]
        if missing:
            raise ValueError(f"schema at {where}: required property {missing[0]!r} is not "
                             f"in properties")
        if not properties:
            value = None if extra is False else self.convert(
                extra, f"{where}/additionalProperties", depth)
            return _object_of(value) if value is not None else rf"\{{{WS}\}}"
        if isinstance(extra, dict) and extra:
            raise ValueError(f"schema at {where}: additionalProperties as a schema beside "
                             f"properties is not supported")
        members = []  # (regex of '"name": value', required)
        for name, sub in properties.items():
            value = self.convert(sub, f"{where}/properties/{name}", depth)
            if value is None:
                if name in required:
                    return None
                continue
            members.append((f"{escape(compact(name))}{WS}:{WS}{value}", name in required))
        return rf"\{{{WS}{_members(members)}{WS}\}}"


def _members(members) -> str:
    """The members in order, separated by commas, the optional ones perhaps left out.
    after(i): members i.. when one was written before them (each one comma-led);
    first(i): members i.. when none was (the first one written has no comma)."""
    after = first = ""  # after(n), first(n): nothing is left to write
    for regex, required in reversed(members):  # from after(i + 1), first(i + 1) to i's
        here = regex + after
        first = here if required else f"({here}|{first})"
        led = f"{WS},{WS}{regex}"
        after = (led if required else f"({led})?") + after
    return first


def _alternatives(regexes):
    regexes = [r for r in regexes if r is not None]
    if not regexes:
        return None
    return regexes[0] if len(regexes) == 1 else "(" + "|".join(regexes) + ")"


def _bounds(schema, low_name, high_name, where):
    lo, hi = schema.get(low_name, 0), schema.get(high_name)
    for name, value in ((low_name, lo), (high_name, hi)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0):
            raise ValueError(f"schema at {where}: {name} must be an int >= 0, got {value!r}")
    if hi is not None and hi < lo:
        raise ValueError(f"schema at {where}: {low_name} ({lo}) exceeds {high_name} ({hi})")
    return lo, hi


def string_regex(schema, where) -> str:
    lo, hi = _bounds(schema, "minLength", "maxLength", where)
    pattern = schema.get("pattern")
    if pattern is None:
        if lo == 0 and hi is None:
            return STRING
        return f'"{STRING_CHAR}{{{lo},{"" if hi is None else hi}}}"'
    if lo or hi is not None:
        raise ValueError(f"schema at {where}: pattern together with minLength/maxLength "
                         f"is not supported")
    if not isinstance(pattern, str):
        raise ValueError(f"schema at {where}: pattern must be a string")
    try:
        tree = parse(pattern)
    except ValueError as exc:
        raise ValueError(f"schema at {where}: {exc}") from None
    body = to_regex(json_safe(tree))
    start = "" if pattern.startswith("^") else f"{STRING_CHAR}*"
    end = "" if pattern.endswith("$") and not pattern.endswith("\\$") else f"{STRING_CHAR}*"
    return f'"{start}({body}){end}"'


# What a pattern's character may be, written raw inside a JSON string: not ", \ or a control.
JSON_RAW = complement(((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)))


def json_safe(node):
    """The tree with every character set cut to JSON_RAW."""
    kind = node[0]
    if kind == "chars":
        return ("chars", _intersect(node[1], JSON_RAW))
    if kind == "repeat":
        return ("repeat", json_safe(node[1]), node[2], node[3])
    return (kind, tuple(json_safe(item) for item in node[1]))


def _intersect(a, b):
    out = []
    for lo, hi in a:
        for lo2, hi2 in b:
            if max(lo, lo2) <= min(hi, hi2):
                out.append((max(lo, lo2), min(hi, hi2)))
    return merge_ranges(out)


def to_regex(node) -> str:
    """A syntax tree written back as a pattern (classes as \\U escapes)."""
    kind = node[0]
    if kind == "chars":
        if not node[1]:
            return "[^\\x00-\\U0010ffff]"  # no character at all: never matches
        body = "".join(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}"
                       for lo, hi in node[1])
        return f"[{body}]"
    if kind == "concat":
        return "".join(f"({to_regex(i)})" if i[0] == "alt" else to_regex(i) for i in node[1])
    if kind == "alt":
        return "(" + "|".join(to_regex(i) for i in node[1]) + ")"
    _, item, lo, hi = node
    return f"({to_regex(item)}){{{lo},{'' if hi is None else hi}}}"
