"""Reasoning in the prompt: Qwen3's template with thinking on and off and with reasoning sent back
(engine_bridge.toolsyntax.render against the template rendered directly with jinja2), and what
the API renders for output a grammar holds (api.served.prompt_for)."""
from dataclasses import replace

import pytest

from api.intake import Thinking
from api.served import prompt_for
from api.tools import ToolPlan
from engine_bridge import harmony, prompting, toolsyntax
from engine_bridge.reasoning import ThinkSplitter, mode_for
from engine_bridge.served import served_model_from
from tests.support.reference import chat_template

QWEN3 = "Qwen-Qwen3-0.6B.jinja"
HISTORY = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
           {"role": "assistant", "content": "4", "reasoning": "Add them."},
           {"role": "user", "content": "3+3? /no_think"}]
TOOL = toolsyntax.Tool(name="get_weather", description="Weather",
                       parameters={"type": "object", "properties": {"city": {"type": "string"}}})


def served(template):
    return replace(served_model_from({}), template=template)


def direct(template, messages, **extra):
    """The template itself, rendered with jinja2 through our environment: the oracle."""
    return prompting._env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                                         bos_token="", eos_token="", **extra)


@pytest.mark.parametrize("thinking", [None, True, False])
def test_qwen3_thinking_on_and_off_is_the_templates_own(thinking):
    template = chat_template(QWEN3)
    assert mode_for(template) == "think"
    ours = toolsyntax.render(HISTORY, (), served(template), thinking=thinking)
    # the template reads reasoning_content; enable_thinking only when the client turned it off
    expected_msgs = [{k: v for k, v in m.items() if k != "reasoning"}
                     | ({"reasoning_content": m["reasoning"]} if "reasoning" in m else {}) for m in HISTORY]
    expected = direct(template, expected_msgs, **({"enable_thinking": False} if thinking is False else {}))
    assert ours == expected
    assert ours.endswith("<think>\n\n</think>\n\n") == (thinking is False)
    # the bridge reads that tail: thinking off starts in the answer
    assert ThinkSplitter.for_prompt(ours).state == "start"


def test_qwen3_reasoning_sent_back_after_the_last_query_is_rendered():
    template = chat_template(QWEN3)
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "reasoning": "Need the tool.",
                 "tool_calls": [{"id": "c1", "name": "get_weather", "arguments": {"city": "Paris"}}]},
                {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"}]
    text = toolsyntax.render(messages, [TOOL], served(template))
    assert "<think>\nNeed the tool.\n</think>\n\n<tool_call>" in text  # in the current turn it stays


def test_grammar_held_output_starts_where_the_grammar_begins():
    harmony_served = served("<|start|><|channel|>")
    think_served = served("{% for m in messages %}{{ m.content }}{% endfor %}"
                          "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")
    msgs = [{"role": "user", "content": "hi"}]
    named = ToolPlan(tools=[TOOL], choice="named", name="get_weather")
    required = ToolPlan(tools=[TOOL], choice="required")
    none = ToolPlan()
    h = Thinking(mode="harmony")
    assert prompt_for(harmony_served, msgs, named, h).endswith(
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>")
    assert prompt_for(harmony_served, msgs, required, h).endswith("<|start|>assistant<|channel|>commentary<|message|>")
    assert prompt_for(harmony_served, msgs, none, h, structured=True).endswith(
        "<|start|>assistant" + harmony.constrained_header())
    assert prompt_for(harmony_served, msgs, none, h).endswith("<|start|>assistant")
    t = Thinking(mode="think")
    assert prompt_for(think_served, msgs, none, t, structured=True) == "hi<think></think>"
    assert prompt_for(think_served, msgs, named, t).endswith("hi<think></think>")
    assert prompt_for(think_served, msgs, none, t) == "hi"


def test_harmony_effort_and_no_thinking():
    s = served("<|start|><|channel|>")
    msgs = [{"role": "user", "content": "hi"}]
    assert "Reasoning: high\n" in toolsyntax.render(msgs, (), s, effort="high")
    assert "Reasoning: low\n" in toolsyntax.render(msgs, (), s, thinking=False)
    assert "Reasoning: medium\n" in toolsyntax.render(msgs, (), s)
    back = [*msgs, {"role": "assistant", "content": "Hello", "reasoning": "greet"}, {"role": "user", "content": "again"}]
    text = toolsyntax.render(back, (), s)
    assert "greet" not in text and "<|channel|>final<|message|>Hello<|end|>" in text  # earlier analysis dropped
