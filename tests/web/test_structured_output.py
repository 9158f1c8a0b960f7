"""Structured output on the OpenAI surfaces with a scripted bridge (api/structured.py): Chat's
response_format and Responses' text.format become the grammar the job carries; bad schemas are
400s naming the field; an engine without the grammar extension is refused before the bridge.
The bridge side: the grammar's trip over Redis (base64), the SUBMIT it becomes, and the worker's
refusal for an engine that does not announce CGD1. Against the real engine: test_live_structured.py."""
import json

import pytest
from django.test import Client

from engine_bridge import protocol, worker
from engine_bridge.request import GenerationRequest, job_message
from engine_bridge.grammar import grammar_for_json_object, grammar_for_schema
from tests.web.fakes import reply, serve_state

pytestmark = pytest.mark.django_db(transaction=True)
MSG = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
          "required": ["city", "n"], "additionalProperties": False}


@pytest.fixture(autouse=True)
def served_up(monkeypatch):
    state = {"status": "up", "up": True, "updated": 1.0,
             "model": {"name": "tiny", "arch": "llama", "grammar": "CGD1"}}
    serve_state(monkeypatch, state)
    return state


def post(key, route, data):
    return Client().post(route, json.dumps({"model": "tiny", **data}), content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {key}")


def test_chat_json_schema_and_json_object_carry_the_grammar(fake_bridge, alice_key):
    fake_bridge.script(*reply('{"city": "Oslo", "n": 1}'))
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}
    r = post(alice_key, "/v1/chat/completions", {"messages": MSG, "response_format": fmt})
    assert r.status_code == 200, r.content
    assert fake_bridge.requests[0].grammar == grammar_for_schema(SCHEMA)
    fake_bridge.script(*reply("{}"))
    r = post(alice_key, "/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_object"}})
    assert r.status_code == 200 and fake_bridge.requests[1].grammar == grammar_for_json_object()
    fake_bridge.script(*reply("plain"))
    assert post(alice_key, "/v1/chat/completions", {"messages": MSG, "response_format": {"type": "text"}}).status_code == 200
    assert fake_bridge.requests[2].grammar is None


def test_responses_text_format_carries_the_grammar(fake_bridge, alice_key):
    fake_bridge.script(*reply('{"city": "Oslo", "n": 1}'))
    fmt = {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}
    r = post(alice_key, "/v1/responses", {"input": "x", "text": {"format": fmt}})
    assert r.status_code == 200, r.content
    assert fake_bridge.requests[0].grammar == grammar_for_schema(SCHEMA)
    assert r.json()["text"] == {"format": fmt}  # the format used is echoed, as OpenAI does


BAD = [
    ("/v1/chat/completions", {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}},
     "response_format.json_schema.schema.properties.tags.uniqueItems", "uniqueItems"),
    ("/v1/chat/completions", {"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}},
     "response_format.json_schema.schema.type", "type must be one of"),
    ("/v1/chat/completions", {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/Missing"}}},
     "response_format.json_schema.schema.$ref", "points nowhere"),
    ("/v1/chat/completions", {"type": "json_schema", "json_schema": "nope"}, "response_format.json_schema", "must be an object"),
    ("/v1/chat/completions", {"type": "json_schema", "json_schema": {"schema": 3}}, "response_format.json_schema.schema",
     "must be a JSON Schema object"),
    ("/v1/chat/completions", {"type": "xml"}, "response_format", "'xml' is not supported"),
    ("/v1/responses", {"type": "json_schema", "name": "x"}, "text.format.schema", "is required"),
    ("/v1/responses", {"type": "json_schema", "name": "x", "schema": {"type": "string", "pattern": "(?=a)b"}},
     "text.format.schema.pattern", "pattern"),
    ("/v1/responses", {"type": "json_schema", "name": "x", "schema": {"type": "string", "maxLength": 100000}},
     "text.format.schema.maxLength", "maxLength above"),
]


@pytest.mark.parametrize("route,fmt,param,text", BAD)
def test_bad_formats_name_the_field(fake_bridge, alice_key, route, fmt, param, text):
    data = {"messages": MSG, "response_format": fmt} if route.endswith("completions") else {"input": "x", "text": {"format": fmt}}
    r = post(alice_key, route, data)
    assert r.status_code == 400, r.content
    err = r.json()["error"]
    assert err["param"] == param and text in err["message"], err
    assert not fake_bridge.requests


def test_an_engine_without_grammars_is_refused_up_front(fake_bridge, alice_key, served_up):
    served_up["model"] = {"name": "tiny", "arch": "llama"}  # our engine of before: no "grammar"
    for route, data, param in (
            ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_object"}}, "response_format"),
            ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}}},
             "text.format")):
        r = post(alice_key, route, data)
        assert r.status_code == 400, r.content
        err = r.json()["error"]
        assert err["param"] == param and err["code"] == "structured_output_unsupported"
        assert "constrained decoding" in err["message"]
    assert not fake_bridge.requests


def test_the_grammar_travels_and_becomes_the_submit_field():
    g = grammar_for_schema(SCHEMA)
    message = job_message(GenerationRequest(prompt="p", max_tokens=8, grammar=g))
    json.dumps(message)  # JSON-able for Redis
    job = worker.parse_job(json.loads(json.dumps(message)))
    assert job.grammar == g
    frame = protocol.format_submit(3, 0, "p", 8, 0, 1, slots=1, seed=5, grammar=g)
    header, rest = frame.split(b"\n", 1)
    assert header == f"SUBMIT 3 0 1 8 0 1 {len(g)} seed=5 grammar=1".encode()
    assert rest == b"p" + g + b"\n"
    with pytest.raises(protocol.SubmitError):
        worker.parse_job({"prompt": "p", "max_tokens": 8, "grammar": "!!not base64"})


def test_the_worker_refuses_grammars_for_engines_that_do_not_announce_them():
    job = GenerationRequest(prompt="p", max_tokens=8, grammar=b"CGD1....")
    assert "not supported by this engine" in worker.extension_refusal(job, None)  # the real colibri binary
    assert "constrained decoding" in worker.extension_refusal(job, {"arch": "llama"})
    assert worker.extension_refusal(job, {"arch": "llama", "grammar": "CGD1"}) is None
