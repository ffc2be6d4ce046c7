"""schema_to_regex: every text the regex matches is JSON that jsonschema (the oracle, test
only) validates; valid documents in the tight form are matched, invalid ones are not;
pydantic's schemas work; unsupported keywords and bad schemas are errors naming them."""
import json
import re

import pytest
from hypothesis import given, settings, strategies as st

from transformer_lab.structured import compile_regex, schema_to_regex
from transformer_lab.structured.json_schema import json_object_regex

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the test-only oracle "
                                 "(pip install jsonschema)")

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": "integer"},
    "city": {"enum": ["Paris", "北京", "New \"York\""]},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"},
             "minItems": 1, "maxItems": 3},
    "score": {"type": ["number", "null"]},
    "ok": {"type": "boolean"}}, "required": ["name", "age"], "additionalProperties": False,
    "title": "Person", "description": "ignored", "$schema": "https://json-schema.org/draft/2020-12/schema"}
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"const": 1}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "required": ["v"]}}, "$ref": "#/$defs/node"}
SCHEMAS = {
    "person": PERSON,
    "tree": TREE,
    "choice": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "ab|c\"d"},
                         {"definitions": {}, "type": "integer"}]},
    "all-optional": {"type": "object", "properties": {"a": {"type": "null"},
                                                       "b": {"type": "boolean"}}},
    "map": {"type": "object", "additionalProperties": {"type": "integer"}},
    "json_object": None,
}


def regex_of(name):
    return json_object_regex(2) if SCHEMAS[name] is None else schema_to_regex(SCHEMAS[name])


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=25)
@given(data=st.data())
def test_every_matched_text_is_valid(name, data):
    regex = regex_of(name)
    text = data.draw(st.from_regex(re.compile(regex), fullmatch=True))
    value = json.loads(text)
    if SCHEMAS[name] is None:
        assert isinstance(value, dict)
    else:
        jsonschema.validate(value, SCHEMAS[name])
    assert compile_regex(regex).accepts(text)


def tight(value):
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("value, valid", [
    ({"name": "Ada", "age": 36}, True),
    ({"name": "Ada", "age": 36, "city": "北京", "tags": ["x", "yz"], "score": None, "ok": True}, True),
    ({"name": "Ada", "age": -3, "score": 2.5e-3}, True),
    ({"name": "Ada", "age": 36, "city": "New \"York\""}, True),
    ({"age": 36, "name": "Ada"}, False),  # valid JSON, but not in declared order
    ({"name": "Ada"}, False),  # age is required
    ({"name": "", "age": 1}, False),  # minLength
    ({"name": "Ada", "age": 1.5}, False),
    ({"name": "Ada", "age": 1, "tags": []}, False),  # minItems
    ({"name": "Ada", "age": 1, "tags": ["A"]}, False),  # pattern
    ({"name": "Ada", "age": 1, "extra": 1}, False),
])
def test_the_person_schema(value, valid):
    dfa = compile_regex(schema_to_regex(PERSON))
    assert dfa.accepts(tight(value)) == valid
    if valid:
        jsonschema.validate(value, PERSON)
        assert dfa.accepts(json.dumps(value, ensure_ascii=False))  # one space after : and ,


def test_recursion_is_cut_at_the_depth_bound():
    dfa = compile_regex(schema_to_regex(TREE, max_ref_depth=2))
    assert dfa.accepts('{"v":1,"kids":[{"v":1,"kids":[]}]}')
    assert not dfa.accepts('{"v":1,"kids":[{"v":1,"kids":[{"v":1}]}]}')
    with pytest.raises(ValueError, match="recursion does not end within 2"):
        schema_to_regex({"$defs": {"a": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}},
                                         "required": ["a"]}}, "$ref": "#/$defs/a"}, max_ref_depth=2)


def test_an_unanchored_pattern_may_have_text_around_it():
    dfa = compile_regex(schema_to_regex({"type": "string", "pattern": "b+"}))
    assert dfa.accepts('"abbc"') and not dfa.accepts('"ac"')
    dfa = compile_regex(schema_to_regex({"type": "string", "pattern": "^b+$"}))
    assert dfa.accepts('"bb"') and not dfa.accepts('"abb"')


def test_a_pydantic_schema():
    pydantic = pytest.importorskip("pydantic", reason="pydantic makes the schema (test only)")

    class City(pydantic.BaseModel):
        name: str
        country: str = "France"

    class Person(pydantic.BaseModel):
        """A person."""
        name: str = pydantic.Field(description="full name", examples=["Ada"])
        age: int
        city: City | None = None
        languages: list[str] = []

    schema = Person.model_json_schema()
    dfa = compile_regex(schema_to_regex(schema))
    text = '{"name":"Ada","age":36,"city":{"name":"Paris"},"languages":["fr"]}'
    assert dfa.accepts(text)
    Person.model_validate_json(text)
    assert dfa.accepts('{"name":"Ada","age":36,"city":null}')


@pytest.mark.parametrize("schema, message", [
    ({"type": "integer", "minimum": 0}, "unsupported keyword 'minimum'"),
    ({"type": "string", "format": "email"}, "unsupported keyword 'format'"),
    ({"oneOf": [{"type": "null"}]}, "unsupported keyword 'oneOf'"),
    ({"type": "tuple"}, "unsupported type 'tuple'"),
    ({"$ref": "https://example.com/s.json"}, "only local $refs"),
    ({"$ref": "#/$defs/missing"}, "points at nothing"),
    ({"type": "object", "properties": {}, "required": ["a"]}, "required property 'a'"),
    ({"type": "array", "minItems": 3, "maxItems": 2}, "minItems (3) exceeds maxItems (2)"),
    ({"type": "string", "pattern": "(a"}, "unterminated subpattern"),
    ({"enum": []}, "enum must be a non-empty list"),
    ({"description": "no type"}, "has no type"),
    ("{not json", "schema is not JSON"),
    ([1], "schema must be a JSON object"),
])
def test_bad_schemas_name_the_problem(schema, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        schema_to_regex(schema)


def test_schema_as_json_text():
    assert schema_to_regex(json.dumps(PERSON)) == schema_to_regex(PERSON)
