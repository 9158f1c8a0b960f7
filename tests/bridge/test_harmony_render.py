"""engine_bridge.harmony against gpt-oss's own chat template: the template (llama.cpp's copy of
openai/gpt-oss-120b's, outside this repository) rendered with jinja2 through
engine_bridge.prompting's environment is the oracle; the Python renderer must equal it byte for
byte on conversations with tools, several turns, every reasoning effort, developer
instructions, earlier analysis dropped, and on random tool schemas (hypothesis)."""
import functools

import pytest
from hypothesis import given, settings, strategies as st

from engine_bridge import harmony, prompting
from tests.support.reference import chat_template

DATE = "2026-12-06"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather by city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
        "days": {"type": "integer", "default": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                  "required": ["lat"]},
        "mode": {"oneOf": [{"type": "string", "description": "by name"}, {"type": "integer", "default": 3}]},
        "either": {"type": ["string", "null"]},
        "note": {"type": "string", "nullable": True},
    }, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The time", "parameters": {}}}


@functools.cache
def compiled():
    return prompting._env.from_string(chat_template("openai-gpt-oss-120b.jinja"))


def oracle(messages, tools=None, effort=None, add_generation_prompt=True):
    extra = {"reasoning_effort": effort} if effort else {}
    if tools:
        extra["tools"] = tools
    return compiled().render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token="", eos_token="",
        strftime_now=lambda fmt: DATE, **extra)


def ours(messages, tools=None, effort=None, add_generation_prompt=True):
    return harmony.render(messages, tools, effort=effort or "medium", date=DATE,
                          add_generation_prompt=add_generation_prompt)


CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "Hi"}],
    "system as developer instructions": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
    "developer role": [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}],
    "several turns, earlier analysis dropped": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "thinking": "Simple sum."},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6", "thinking": "Another sum."},
        {"role": "user", "content": "thanks"}],
    "tool call, result, answer": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "thinking": "Need the tool.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "And tomorrow?"}],
    "tool call pending (analysis kept)": [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "", "thinking": "Call it.", "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "{\"sky\": \"rain\"}"}],
    "tool call with content as analysis": [
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "now", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "c3", "content": "12:00"}],
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("effort", [None, "low", "medium", "high"])
def test_render_equals_the_template(name, effort):
    messages = CONVERSATIONS[name]
    for tools in (None, [WEATHER, CLOCK]):
        assert ours(messages, tools, effort) == oracle(messages, tools, effort)


def test_training_form_final_turn_with_analysis():
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "thinking": "greet"}]
    assert ours(messages, add_generation_prompt=False) == oracle(messages, add_generation_prompt=False)


def test_refuses_what_the_template_refuses():
    bad = [{"role": "user", "content": "x"},
           {"role": "assistant", "content": "<|channel|>final<|message|>hi"}, {"role": "user", "content": "y"}]
    with pytest.raises(prompting.TemplateError):
        oracle(bad)
    with pytest.raises(prompting.TemplateError):
        ours(bad)
    orphan = [{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}]
    with pytest.raises(prompting.TemplateError):
        oracle(orphan)
    with pytest.raises(prompting.TemplateError):
        ours(orphan)


def test_several_calls_in_one_turn_keep_every_call():
    """Where the template drops calls after the first, the renderer keeps each as its own message."""
    messages = [{"role": "user", "content": "both"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"id": "b", "function": {"name": "now", "arguments": {}}}]},
                {"role": "tool", "tool_call_id": "a", "content": "sunny"},
                {"role": "tool", "tool_call_id": "b", "content": "noon"}]
    text = ours(messages, [WEATHER, CLOCK])
    assert "to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>" in text
    assert "to=functions.now<|channel|>commentary json<|message|>{}<|call|>" in text
    assert "<|start|>functions.now to=assistant<|channel|>commentary<|message|>\"noon\"<|end|>" in text
    single = [messages[0], {**messages[1], "tool_calls": messages[1]["tool_calls"][:1]}, messages[2]]
    assert ours(single, [WEATHER, CLOCK]) == oracle(single, [WEATHER, CLOCK])


SCALARS = st.sampled_from([{"type": "string"}, {"type": "number"}, {"type": "integer"}, {"type": "boolean"},
                           {"type": "string", "enum": ["a", "b"]}, {"type": "string", "nullable": True},
                           {"type": ["string", "integer"]}, {"type": ["null"]}, {}, {"type": "array"},
                           {"type": "string", "description": "d"}, {"type": "integer", "default": 5},
                           {"type": "string", "enum": ["x"], "default": "x"}])


def schemas(depth=2):
    if depth == 0:
        return SCALARS
    inner = schemas(depth - 1)
    return st.one_of(
        SCALARS,
        st.builds(lambda items, nullable: {"type": "array", "items": items, **({"nullable": True} if nullable else {})},
                  inner, st.booleans()),
        st.builds(lambda props, req: {"type": "object", "properties": props, "required": [k for k in props if k in req]},
                  st.dictionaries(st.sampled_from(["a", "b", "c_d"]), inner, max_size=3),
                  st.sets(st.sampled_from(["a", "b", "c_d"]))),
        st.builds(lambda vs: {"oneOf": vs}, st.lists(inner, min_size=1, max_size=3)),
    )


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["p", "q", "r_s"]), schemas(), max_size=4), st.sets(st.sampled_from(["p", "q"])),
       st.sampled_from(["", "A tool"]))
def test_random_tool_schemas_render_as_the_template(props, required, description):
    tool = {"type": "function", "function": {"name": "f", "description": description, "parameters": {
        "type": "object", "properties": props, "required": sorted(required & set(props))}}}
    messages = [{"role": "user", "content": "go"}]
    try:
        expected = oracle(messages, [tool])
    except (prompting.TemplateError, TypeError):
        with pytest.raises(prompting.TemplateError):
            ours(messages, [tool])
        return
    assert ours(messages, [tool]) == expected
