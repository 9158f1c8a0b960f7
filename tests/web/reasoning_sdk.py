"""The official SDKs' view of a turn that thinks before it answers, as the live reasoning tests
check it on every surface (test_live_api_reasoning: a scripted test-double engine, `<think>` and
harmony; test_live_api_harmony_engine: our engine on a scripted gpt-oss file). A test gives the
user message that makes the engine write THOUGHT then ANSWER (or the CALL exchange), and adds what
only its stack shows.
"""
import json
from typing import Any

import httpx

THOUGHT = "The user greets me.\nI greet back."
ANSWER = "Hello there!"
# harmony: the analysis channel, then a commentary call to functions.get_weather ending <|call|>
CALL = ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary '
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def chat_reasoning(oai: Any, content: str) -> tuple[int, int]:
    """Chat Completions, buffered and streamed: `reasoning_content` is THOUGHT and `content` is
    ANSWER; the turn sent back with its reasoning renders and is answered again. Returns the
    reasoning-token counts (buffered, streamed)."""
    messages: list[dict] = [{"role": "user", "content": content}]
    r = oai.chat.completions.create(model="colibri", messages=messages, reasoning_effort="high")
    msg = r.choices[0].message
    assert msg.content == ANSWER and msg.model_extra["reasoning_content"] == THOUGHT
    assert r.choices[0].finish_reason == "stop"
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens
    chunks = list(oai.chat.completions.create(model="colibri", messages=messages, stream=True,
                                              stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == ANSWER
    streamed = [c.usage for c in chunks if c.usage][0].completion_tokens_details.reasoning_tokens
    assert streamed > 0
    messages += [msg.model_dump(exclude_none=True), {"role": "user", "content": content}]
    again = oai.chat.completions.create(model="colibri", messages=messages)
    assert again.choices[0].message.content == ANSWER
    return r.usage.completion_tokens_details.reasoning_tokens, streamed


def messages_thinking(ant: Any, content: str) -> tuple[dict, Any]:
    """Messages with thinking on, streamed and buffered: a thinking block (THOUGHT, one signature)
    then a text block (ANSWER), end_turn. Returns (the request body, the buffered message)."""
    body: dict = {"model": "colibri", "max_tokens": 400, "messages": [{"role": "user", "content": content}],
                  "thinking": {"type": "enabled", "budget_tokens": 1024}}
    thinking, signatures, text = [], [], []
    with ant.messages.stream(**body) as s:
        for event in s:
            if event.type == "thinking":
                thinking.append(event.thinking)
            elif event.type == "signature":
                signatures.append(event.signature)
            elif event.type == "text":
                text.append(event.text)
        final = s.get_final_message()
    assert "".join(thinking) == THOUGHT and "".join(text) == ANSWER and len(signatures) == 1 and signatures[0]
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == THOUGHT and final.content[0].signature == signatures[0]
    assert final.stop_reason == "end_turn"
    msg = ant.messages.create(**body)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == THOUGHT and msg.content[1].text == ANSWER
    return body, msg


def responses_reasoning(oai: Any, content: str) -> Any:
    """Responses: a reasoning item (THOUGHT) before the message (ANSWER), buffered; streamed, the
    reasoning text's deltas and its done event before the answer's first delta. Returns the
    buffered response."""
    r = oai.responses.create(model="colibri", input=content, reasoning={"effort": "low"})
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == THOUGHT and r.output_text == ANSWER
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    kinds, deltas = [], []
    with oai.responses.stream(model="colibri", input=content) as s:
        for event in s:
            kinds.append(event.type)
            if event.type == "response.reasoning_text.delta":
                deltas.append(event.delta)
        final = s.get_final_response()
    assert "".join(deltas) == THOUGHT and final.output_text == ANSWER
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    return r


def tool_call_on_every_surface(oai: Any, ant: Any, content: str) -> None:
    """The CALL exchange, buffered, on Chat (reasoning_content and a get_weather call, finish
    tool_calls), Messages (thinking then tool_use) and Responses (reasoning then function_call)."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": SCHEMA}}]
    r = oai.chat.completions.create(model="colibri", messages=[{"role": "user", "content": content}], tools=tools)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.model_extra["reasoning_content"] == "Need the weather."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [("get_weather", {"city": "Paris"})]
    m = ant.messages.create(model="colibri", max_tokens=300, messages=[{"role": "user", "content": content}],
                            tools=[{"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}])
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["thinking", "tool_use"]
    assert m.content[1].name == "get_weather" and m.content[1].input == {"city": "Paris"}
    resp = oai.responses.create(model="colibri", input=content,
                                tools=[{"type": "function", "name": "get_weather", "parameters": SCHEMA}])
    assert [i.type for i in resp.output] == ["reasoning", "function_call"]
    assert resp.output[1].name == "get_weather" and json.loads(resp.output[1].arguments) == {"city": "Paris"}


def raw_stream(url: str, key: str, route: str, body: dict) -> str:
    """The raw SSE text of a streamed request (for the wire oracles)."""
    with httpx.stream("POST", url + route, json={**body, "stream": True}, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status_code == 200, r.read()
        return r.read().decode()
