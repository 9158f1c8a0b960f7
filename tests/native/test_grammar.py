"""Constrained decoding on the real engine (native/README.md "Grammar", native/src/grammar.h):
SUBMIT's gbytes with grammar=1 are a CGD1 byte DFA, and the engine samples only tokens that keep
the output inside it. Checked here: forced shapes come out (greedy and temperature 1), the masks
the engine reports (logprobs=k candidates) equal a Python reference mask computed over the
fixture's vocabulary, malformed grammars are refused with the stream in sync, and the 6- and
7-field SUBMIT of before behave as they did."""
from __future__ import annotations

import json
import re
import struct

import pytest

from engine_bridge.grammar import compile_node, grammar_for_schema, lit, seq
from tests.support.dfa import RefDfa
from tests.native.engine import SCALE, chatml, parse_model_line

pytestmark = pytest.mark.timeout(int(120 * SCALE))

PROMPT = chatml("Give me a JSON object.")
A_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"],
            "additionalProperties": False}
A_SHAPE = re.compile(rb'\{ ?"a" ?: ?(0|[1-9][0-9]*) ?\}')


def submit_grammar(eng, grammar: bytes, max_tokens=64, temperature=0, extra="", slot=0):
    rid, frame = eng.submit(PROMPT, slot=slot, max_tokens=max_tokens, temperature=temperature,
                            extra=f" {len(grammar)}{extra} grammar=1", write=False)
    eng.write(frame[:-1] + grammar + b"\n")
    return eng.result(rid)


def test_model_line_announces_the_grammar_format(eng):
    eng.sync()  # the handshake's lines are all read
    assert parse_model_line(eng.latest["MODEL"]).get("grammar") == "CGD1"


@pytest.mark.parametrize("temperature", [0, 1])
def test_a_schema_forces_its_shape(eng, temperature):
    g = grammar_for_schema(A_SCHEMA)
    for i in range(3 if temperature else 1):
        r = submit_grammar(eng, g, max_tokens=48, temperature=temperature, extra=f" seed={i + 1}")
        assert r.done is not None, r.errors
        assert A_SHAPE.fullmatch(r.text), r.text
        assert r.stat()["length_limited"] == 0, "a complete object must end the turn as a stop"
        assert json.loads(r.text)["a"] >= 0


def test_budget_rule_closes_the_output_in_time(eng):
    """A free string with a budget that only just fits: the engine still ends inside the grammar."""
    g = grammar_for_schema({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]})
    for seed in range(1, 6):
        r = submit_grammar(eng, g, max_tokens=12, temperature=1, extra=f" seed={seed}")
        assert r.done is not None, r.errors
        value = json.loads(r.text)
        assert isinstance(value["s"], str)
        assert r.stat()["emitted"] <= 12 and r.stat()["length_limited"] == 0


def fixture_vocab(path):
    """Token id -> raw bytes (None for control tokens), and the ids of end tokens."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    tf = reader.fields["tokenizer.ggml.token_type"]
    types = [int(tf.parts[i][0]) for i in tf.data]
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    inv = {chr(c): b for b, c in zip(bs, cs)}
    pieces = [None if types[i] == 3 else bytes(inv[ch] for ch in t) for i, t in enumerate(tokens)]
    eog = {i for i, t in enumerate(tokens) if t in ("<|im_end|>", "<|endoftext|>")}
    return pieces, eog


class RefDFA(RefDfa):
    def mask(self, q, left, pieces, eog):
        """native/src/grammar.h's rule: live targets within max(left - 1, the closest one), once
        q's own distance is within the budget; every live target before."""
        dists = {}
        for t, p in enumerate(pieces):
            if p and t not in eog:
                q2 = self.run(q, p)
                if q2 is not None and self.dist[q2] != float("inf"):
                    dists[t] = self.dist[q2]
        limit = float("inf") if self.dist[q] > left else max([left - 1, min(dists.values(), default=0)])
        return {t for t, d in dists.items() if d <= limit} | (eog if self.accept[q] else set())


def test_engine_masks_equal_a_reference_mask(eng, models):
    """logprobs=32: at every step the candidates the engine lists are allowed tokens, and when
    fewer than 32 tokens are allowed they are exactly the reference mask."""
    pieces, eog = fixture_vocab(models["moe"])
    schema = {"type": "object", "properties": {
        "kind": {"enum": ["alpha", "beta", "gamma"]}, "n": {"type": "integer", "maximum": 99},
        "ok": {"type": "boolean"}, "note": {"type": "string", "pattern": "^[a-z ]{0,6}$"}}, "required": ["kind", "n"]}
    # ASCII only: each DATA frame is then its token's piece (the engine holds back partial UTF-8)
    wire = grammar_for_schema(schema)
    ref = RefDFA(wire)
    exact = 0
    for seed in range(1, 5):
        max_tokens = 40
        r = submit_grammar(eng, wire, max_tokens=max_tokens, temperature=1, extra=f" seed={seed} logprobs=32")
        assert r.done is not None, r.errors
        data = [parts for kind, parts, _ in eng.events if kind == "DATA" and int(parts[1]) == r.id]
        q, emitted = ref.start, 0
        for parts, piece in zip(data, r.data):
            k = int(parts[4])
            cands = {int(parts[5 + 2 * i]) for i in range(k)}
            allowed = ref.mask(q, max_tokens - emitted, pieces, eog)
            assert cands <= allowed, f"step {emitted}: engine candidates outside the mask: {cands - allowed}"
            if len(allowed) < 32:
                assert cands == allowed, f"step {emitted}: {sorted(cands)} != {sorted(allowed)}"
                exact += 1
            q = ref.run(q, piece)
            assert q is not None, f"the output left the DFA at {piece!r}"
            emitted += 1
        assert ref.accept[q], r.text
    assert exact > 10, "too few steps with small masks to compare exactly"


def test_malformed_grammars_are_refused_in_sync(eng):
    good = grammar_for_schema(A_SCHEMA)
    bad = [b"XXXX" + good[4:], good[:-1], good + b"\x00", good[:4] + struct.pack("<II", 0, 0),
           good[:4] + struct.pack("<II", 1, 5) + b"\x01\x00\x00",
           compile_node(seq(lit("x")))[:12] + b"\x00\x00\x00"]  # a start that accepts nothing
    for g in bad:
        mark = eng.mark()
        r = submit_grammar(eng, g)
        assert r.done is None and r.errors and r.errors[0][0] == "BAD_REQUEST", (g[:20], r.errors, r.data)
        assert eng.sync(since=mark) == [], "a refused grammar left bytes in the command stream"
    assert A_SHAPE.fullmatch(submit_grammar(eng, good).text)


def test_header_level_refusals_keep_the_stream_in_sync(eng):
    for extra in (" grammar=1", " 0 grammar=1", " 5 grammar=2", " 5 grammar=1 grammar=1"):
        rid, frame = eng.submit(PROMPT, max_tokens=4, extra=extra, write=False)
        glen = int(extra.split()[0]) if extra.split()[0].isdigit() else 0
        mark = eng.mark()
        eng.write(frame[:-1] + b"g" * glen + b"\n")
        assert eng.sync(since=mark) == [["BAD_REQUEST"]], extra


def test_old_submit_forms_behave_as_before(eng):
    six = eng.generate(PROMPT, max_tokens=6)
    rid, frame = eng.submit(PROMPT, max_tokens=6, extra=" 9", write=False)
    eng.write(frame[:-1] + b"root ::= x" [:9] + b"\n")  # colibri's draft grammar: ignored
    seven = eng.result(rid)
    assert seven.done is not None and seven.text == six.text
    assert six.stat()["emitted"] == 6 and six.stat()["length_limited"] == 1
