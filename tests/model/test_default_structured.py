"""Structured output on the default model (issue 25 item 6: "On the default model: 100 % of a set
of >= 30 schemas ... yield output that validates, and every required / named tool call parses").

The corpus (tests/data/structured_schemas.json) through the engine serving the default model
(SmolLM2-135M MoE16), greedy and at temperature 1, each output validated with the jsonschema
package and required to end complete (not cut by the budget); then the schemas of forced tool
calls (api.tools -> toolsyntax.forced_schema: a named tool's parameters, and `required`'s array
of {name, arguments}) for a small tool set, each output parsed and validated the same way.
The random-weight fixture's run of the corpus is tests/native/test_grammar_schemas.py."""
from __future__ import annotations

import json

import jsonschema
import pytest

from engine_bridge.grammar import grammar_for_schema
from engine_bridge.toolsyntax import Tool, forced_schema
from tests.native.engine import SCALE, Engine, base_env, chatml
from tests.support.procs import ROOT

pytestmark = pytest.mark.timeout(int(600 * SCALE))

CORPUS = json.loads((ROOT / "tests" / "data" / "structured_schemas.json").read_text())
MAX_TOKENS = 300
SLOTS = 4
TOOLS = [
    Tool("get_weather", "Current weather for a city", {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}),
    Tool("add", "Adds two integers", {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}),
]


@pytest.fixture(scope="module")
def engine(engine_binary, default_model):
    e = Engine(engine_binary, env=base_env(default_model, slots=SLOTS, ctx=1024))
    yield e
    try:
        e.close(10)
    finally:
        e.kill()


def run(engine, jobs):
    """jobs: [(label, schema, prompt, temperature, seed)] -> failure lines (empty: all valid)."""
    failures = []
    for start in range(0, len(jobs), SLOTS):
        batch = []
        for slot, (label, schema, prompt, temperature, seed) in enumerate(jobs[start:start + SLOTS]):
            g = grammar_for_schema(schema)
            rid, frame = engine.submit(chatml(prompt), slot=slot, max_tokens=MAX_TOKENS, temperature=temperature,
                                       extra=f" {len(g)} seed={seed} grammar=1", write=False)
            engine.write(frame[:-1] + g + b"\n")
            batch.append((label, schema, temperature, rid))
        for label, schema, temperature, rid in batch:
            r = engine.result(rid, timeout=180 * SCALE)
            where = f"{label} (temperature {temperature})"
            if r.done is None:
                failures.append(f"{where}: {r.errors}")
                continue
            try:
                jsonschema.validate(json.loads(r.text.decode("utf-8")), schema)
            except (ValueError, jsonschema.ValidationError) as exc:
                failures.append(f"{where}: {r.text[:200]!r}: {str(exc)[:200]}")
                continue
            if r.stat()["length_limited"]:
                failures.append(f"{where}: valid but cut by the budget")
    return failures


@pytest.mark.parametrize("temperature", [0, 1], ids=["greedy", "temperature-1"])
def test_every_schema_validates_on_the_default_model(engine, temperature):
    jobs = [(c["name"], c["schema"], f"Reply with JSON for {c['name']}.", temperature, 1) for c in CORPUS]
    failures = run(engine, jobs)
    assert not failures, f"{len(failures)} of {len(jobs)} outputs invalid:\n" + "\n".join(failures)


def test_every_forced_tool_call_parses_on_the_default_model(engine):
    prompts = ["What is the weather in Paris?", "Add 2 and 40.", "Hello!"]
    jobs = []
    for choice in ("required", "get_weather", "add"):
        for parallel in ((True, False) if choice == "required" else (True,)):
            schema = forced_schema(TOOLS, choice=choice, parallel=parallel)
            for prompt in prompts:
                for temperature in (0, 1):
                    jobs.append((f"{choice} parallel={parallel} {prompt!r}", schema, prompt, temperature, 3))
    failures = run(engine, jobs)
    assert not failures, f"{len(failures)} of {len(jobs)} calls do not parse:\n" + "\n".join(failures)
