"""engine_bridge/grammar.py on its own: every string its DFAs accept is UTF-8 JSON that validates
(random walks of each corpus schema's DFA, checked with jsonschema), values a schema allows are
accepted in their usual spellings (so the constraint does not shut out what a model would
write), and what cannot be compiled is refused naming the keyword and its path."""
import json
import random

import jsonschema
import pytest
from hypothesis import given, settings, strategies as st

from engine_bridge.grammar import GrammarError, grammar_for_json_object, grammar_for_schema
from tests.support.dfa import RefDfa
from tests.native.engine import ROOT

CORPUS = json.loads((ROOT / "tests" / "data" / "structured_schemas.json").read_text())


class Dfa(RefDfa):
    def walk(self, rng, budget=300) -> bytes:
        """A random accepted string (stops at acceptance with probability 0.2 per step)."""
        q, out = self.start, bytearray()
        while not (self.accept[q] and (not self.trans[q] or rng.random() < 0.2)):
            opts = [e for e in self.trans[q] if self.dist[e[2]] <= budget - len(out) - 1]
            lo, hi, q = rng.choice(opts)
            out.append(rng.randint(lo, hi))
        return bytes(out)


@pytest.mark.parametrize("case", CORPUS, ids=[c["name"] for c in CORPUS])
def test_every_accepted_string_validates(case):
    dfa, rng = Dfa(grammar_for_schema(case["schema"])), random.Random(case["name"])
    assert all(dfa.dist[q] < float("inf") for q in range(len(dfa.accept))), "dead states left in the DFA"
    for _ in range(150):
        text = dfa.walk(rng).decode("utf-8")  # raises on invalid UTF-8
        jsonschema.validate(json.loads(text), case["schema"])


def test_usual_spellings_are_accepted():
    s = Dfa(grammar_for_schema({"type": "string"}))
    for value in ("", "héllo \"x\" \\ \n\t ☃ 🙂 \u00e9", "/"):
        assert s.accepts(json.dumps(value).encode()) and s.accepts(json.dumps(value, ensure_ascii=False).encode())
    assert s.accepts(b'"\\ud83d\\ude42"') and not s.accepts(b'"\\ud83d"')
    assert not s.accepts(b'"\\ud800"') and not s.accepts(b'"\x01"') and not s.accepts(b'"\xed\xa0\x80"')
    n = Dfa(grammar_for_schema({"type": "number"}))
    assert all(n.accepts(x) for x in (b"0", b"-1.5", b"12e3", b"3.25E-7")) and not n.accepts(b"01")
    r = Dfa(grammar_for_schema({"type": "integer", "minimum": -40, "maximum": 1234}))
    assert [v for v in range(-60, 1300) if r.accepts(str(v).encode())] == list(range(-40, 1235))
    obj = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["b"]}
    o = Dfa(grammar_for_schema(obj))
    for value in ({"b": "x"}, {"a": 1, "b": "x"}):
        assert o.accepts(json.dumps(value).encode()) and o.accepts(json.dumps(value, separators=(",", ":")).encode())
    assert not o.accepts(b'{"a": 1}') and not o.accepts(b'{"b": "x",}') and not o.accepts(b'{"b":  "x"}')
    j = Dfa(grammar_for_json_object())
    assert j.accepts(b'{"a": [1, {"b": null}], "c": true}') and not j.accepts(b"[1]")
    assert not j.accepts(b'{"a": [[[[1]]]]}')  # deeper than ANY_DEPTH


def test_enum_values_keep_only_those_the_other_keywords_admit():
    dfa = Dfa(grammar_for_schema({"enum": [1, 2, 5, "x", "long"], "minimum": 2, "maxLength": 2}))
    assert [v for v in (1, 2, 5, "x", "long") if dfa.accepts(json.dumps(v).encode())] == [2, 5, "x"]
    items = Dfa(grammar_for_schema({"enum": [[1], [None], []], "items": {"type": "null"}}))
    assert items.accepts(b"[null]") and items.accepts(b"[]") and not items.accepts(b"[1]")


@pytest.mark.parametrize("schema,field,word", [
    ({"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}, "properties.xs.uniqueItems", "uniqueItems"),
    ({"type": "number", "maximum": 3}, "maximum", "maximum"),
    ({"type": "string", "format": "hostname"}, "format", "hostname"),
    ({"type": "string", "pattern": "a(?=b)"}, "pattern", "pattern"),
    ({"type": "string", "maxLength": 5000}, "maxLength", "maxLength"),
    ({"$ref": "https://example.com/s.json"}, "$ref", "local"),
    ({"$defs": {"A": {"type": "integer", "multipleOf": 2}}, "$ref": "#/$defs/A"}, "$defs.A.multipleOf", "multipleOf"),
    ({"anyOf": []}, "anyOf", "non-empty"),
    # const was taken alone beside its enum: the grammar accepted a value the schema refuses
    ({"enum": [], "const": None}, "enum", "non-empty"),
    ({"enum": [1, 2], "const": 3}, "const", "not one of the enum"),
    # const/enum ignored their other keywords: {"const": [false], "items": {"const": null}} accepted [false]
    ({"const": [False], "items": {"const": None}}, "const", "other keywords"),
    ({"type": "object", "properties": {"k": {"enum": ["a", "bb"], "minLength": 3}}}, "properties.k.enum", "other keywords"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "properties", "allows no value"),
    # null counts were a TypeError deep in the compiler, reported as "the schema must be JSON"
    ({"type": "string", "minLength": None, "maxLength": 3}, "minLength", "non-negative integer"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": None}, "minItems", "non-negative integer"),
])
def test_refusals_name_the_keyword_and_path(schema, field, word):
    with pytest.raises(GrammarError) as info:
        grammar_for_schema(schema)
    assert info.value.field == field and word in info.value.message, (info.value.field, info.value.message)


def test_a_deeply_nested_schema_is_refused_not_a_crash():
    schema = {"type": "integer"}
    for _ in range(3000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(GrammarError, match="nested too deeply|too large"):
        grammar_for_schema(schema)


_json = st.recursive(st.none() | st.booleans() | st.integers(-5, 300) | st.floats(allow_nan=False, allow_infinity=False)
                     | st.sampled_from(["string", "integer", "number", "object", "array", "boolean", "null", "#", "#/$defs/a"]),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(
                         ["type", "properties", "items", "required", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
                          "$defs", "a", "minLength", "maxLength", "minItems", "maxItems", "minimum", "maximum",
                          "pattern", "format", "additionalProperties", "prefixItems"]), c, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None, derandomize=True)  # the same examples every run (CI)
@given(_json)
def test_any_json_schema_compiles_or_is_refused_with_a_grammar_error(schema):
    try:
        wire = grammar_for_schema(schema)
    except GrammarError as exc:
        assert exc.message
        return
    dfa = Dfa(wire)
    text = dfa.walk(random.Random(0)).decode("utf-8")
    try:  # a schema the meta-schema rejects has no instances to check against
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError:
        return
    jsonschema.validate(json.loads(text), schema)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(-10**12, 10**12), st.integers(0, 10**12), st.lists(st.integers(-10**13, 10**13), max_size=20))
def test_integer_bounds_accept_exactly_their_range(lo, width, probes):
    """An integer range's digit automaton accepts exactly lo..hi, in the plain decimal spelling
    (a probe, both ends and their neighbours); compiling it is fast whatever the digits (the
    per-digit split once doubled with every digit: minutes at 19 digits)."""
    hi = lo + width
    dfa = Dfa(grammar_for_schema({"type": "integer", "minimum": lo, "maximum": hi}))
    for x in probes + [lo, hi, lo - 1, hi + 1, 0, 10**len(str(abs(hi))) - 1]:
        assert dfa.accepts(str(x).encode()) == (lo <= x <= hi), (lo, hi, x)


@pytest.mark.timeout(30)  # the old per-digit split took over a minute here
def test_int64_bounds_compile_and_larger_ones_are_refused():
    dfa = Dfa(grammar_for_schema({"type": "integer", "minimum": -2**63, "maximum": 2**63 - 1}))
    assert dfa.accepts(str(-2**63).encode()) and not dfa.accepts(str(2**63).encode())
    with pytest.raises(GrammarError, match="within"):
        grammar_for_schema({"minimum": 5.6e141})
