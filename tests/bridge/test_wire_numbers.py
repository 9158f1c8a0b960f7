"""The bridge's number encoder against the engine's number parser (issue 10): every sampling value
a client may send, once through engine_bridge.sampling and protocol.format_submit, is a SUBMIT
header the real engine accepts. A refused header is a stream-level ERROR 0, which restarts the
engine for everyone, so this is checked on extreme values and on a fuzzed sweep."""
import itertools
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_bridge import protocol, sampling
from tests.native.engine import Engine, chatml

_ids = itertools.count(1)

EXTREMES = [0.0, 5e-324, 1e-320, 2e-308, sys.float_info.min, 1e-300, 1e-7, 4.9999e-7, 5e-7, 1e-6,
            0.1 + 0.2, 1 / 3, 0.99999999, 1.0 - 1e-16, 1.0]


@pytest.fixture(scope="module")
def engine(engine_binary, tiny_model):
    eng = Engine(engine_binary, tiny_model, slots=1, ctx=256)
    yield eng
    eng.close()


def _roundtrip(engine, temperature, top_p):
    t, p, _ = sampling.sampling_validate(temperature=temperature, top_p=top_p)
    rid = next(_ids) + 10_000
    frame = protocol.format_submit(rid, 0, chatml("hi"), 1, t, p, slots=1)
    engine._req(rid)
    engine.write(frame)
    result = engine.result(rid, timeout=20)
    assert result.done is not None, f"{frame[:60]!r} -> {result.errors}"


@pytest.mark.parametrize("value", EXTREMES)
def test_it_sends_extreme_temperatures_the_engine_accepts(engine, value):
    _roundtrip(engine, value, 1.0)
    _roundtrip(engine, min(value * 2, 2.0), 1.0)


@pytest.mark.parametrize("value", [v for v in EXTREMES if v > 0])
def test_it_sends_extreme_top_p_the_engine_accepts(engine, value):
    _roundtrip(engine, 0.7, value)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.floats(min_value=0, max_value=2, allow_subnormal=True),
       st.floats(min_value=0, max_value=1, exclude_min=True, allow_subnormal=True))
def test_every_valid_value_reaches_the_engine_intact(engine, temperature, top_p):
    _roundtrip(engine, temperature, top_p)


@pytest.mark.parametrize("field,value", [
    ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", -1e-320),
    ("temperature", 2.0000001), ("top_p", 0.0), ("top_p", -0.0), ("top_p", float("nan")),
    ("top_p", 1.0000001), ("temperature", True), ("top_p", "0.5"), ("temperature", 10 ** 400),
])
def test_it_refuses_values_outside_the_engines_range_by_name(field, value):
    with pytest.raises(sampling.SamplingError) as caught:
        sampling.sampling_validate(**{field: value})
    assert caught.value.field == field and field in caught.value.message
