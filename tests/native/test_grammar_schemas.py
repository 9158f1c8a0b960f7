"""The structured-output corpus (tests/data/structured_schemas.json, 37 JSON Schemas: nested
objects, arrays with bounds, enums, consts, integer ranges, numbers, required and optional
fields, anyOf / oneOf, $defs and recursive $ref, patterns, formats) through the real engine on
the random-weight fixture model, greedy and at temperature 1 (the hardest case: the model
writes anything the mask allows): 100 % of the outputs must parse, end as a stop (complete,
not cut) and validate with the jsonschema package."""
from __future__ import annotations

import json

import jsonschema
import pytest

from engine_bridge.grammar import grammar_for_schema
from tests.native.engine import ROOT, SCALE, chatml

pytestmark = pytest.mark.timeout(int(300 * SCALE))

CORPUS = json.loads((ROOT / "tests" / "data" / "structured_schemas.json").read_text())
MAX_TOKENS = 300


def test_the_corpus_is_big_enough():
    assert len(CORPUS) >= 30 and len({c["name"] for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("temperature,seeds", [(0, (1,)), (1, (1, 2))], ids=["greedy", "temperature-1"])
def test_every_schema_yields_valid_output(eng, temperature, seeds):
    jobs = [(case, seed) for case in CORPUS for seed in seeds]
    failures = []
    for start in range(0, len(jobs), eng.slots):  # one request per slot at a time
        batch = []
        for slot, (case, seed) in enumerate(jobs[start:start + eng.slots]):
            g = grammar_for_schema(case["schema"])
            prompt = chatml(f"Reply with JSON for {case['name']}.")
            rid, frame = eng.submit(prompt, slot=slot, max_tokens=MAX_TOKENS, temperature=temperature,
                                    extra=f" {len(g)} seed={seed} grammar=1", write=False)
            eng.write(frame[:-1] + g + b"\n")
            batch.append((case, seed, rid))
        for case, seed, rid in batch:
            r = eng.result(rid, timeout=120 * SCALE)
            where = f"{case['name']} (temperature {temperature}, seed {seed})"
            if r.done is None:
                failures.append(f"{where}: {r.errors}")
                continue
            try:
                jsonschema.validate(json.loads(r.text.decode("utf-8")), case["schema"])
            except (ValueError, jsonschema.ValidationError) as exc:
                failures.append(f"{where}: {r.text[:200]!r}: {str(exc)[:200]}")
                continue
            if r.stat()["length_limited"]:
                failures.append(f"{where}: valid but reported as cut by the budget")
    assert not failures, f"{len(failures)} of {len(jobs)} outputs invalid:\n" + "\n".join(failures)
