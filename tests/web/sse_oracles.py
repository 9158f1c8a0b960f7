"""Wire-level stream oracles per surface (api-surfaces §12), for raw SSE text, and strict validation
of every event with the official SDKs' own pydantic types."""
import json

from pydantic import TypeAdapter


def sse_records(raw):
    """-> [(event name or None, data text)] for every record that has data (comments skipped)."""
    out = []
    for record in raw.replace("\r\n", "\n").split("\n\n"):
        event, data = None, []
        for line in record.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            out.append((event, "\n".join(data)))
    return out


def check_openai_stream(raw, marker):
    """Chat / Completions: every data record but [DONE] has the object marker; [DONE] last;
    a Completions stream has no chat chunk and no delta. -> the parsed records."""
    records = sse_records(raw)
    assert records and records[-1][1] == "[DONE]", records[-2:]
    assert all(event is None for event, _ in records)
    parsed = [json.loads(d) for _, d in records[:-1]]
    assert all(p["object"] == marker for p in parsed), {p.get("object") for p in parsed}
    if marker == "text_completion":
        assert "chat.completion.chunk" not in raw and '"delta"' not in raw
    return parsed


def check_anthropic_stream(raw):
    """message_start first, block starts/stops balanced, message_delta before message_stop (last),
    every `event:` name equal to the data's type. -> the parsed events."""
    records = sse_records(raw)
    events = []
    for name, data in records:
        payload = json.loads(data)
        assert name is not None and payload["type"] == name, (name, payload)
        events.append(payload)
    names = [e["type"] for e in events if e["type"] != "ping"]
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    assert names.count("content_block_start") == names.count("content_block_stop")
    assert names.count("message_delta") == 1 and names.index("message_delta") == len(names) - 2
    return events


def check_responses_stream(raw):
    """response.created first, one terminal event last, output_item added/done balanced,
    sequence_number exactly 0, 1, 2, …; `event:` equal to the type. -> the parsed events."""
    records = sse_records(raw)
    assert "[DONE]" not in [d for _, d in records]
    events = []
    for name, data in records:
        payload = json.loads(data)
        assert payload["type"] == name, (name, payload)
        events.append(payload)
    names = [e["type"] for e in events]
    # A response that waited for a slot says so first (status "queued") — at most once.
    started = names[2:] if names[1:2] == ["response.queued"] else names[1:]
    assert names[0] == "response.created" and started[0] in ("response.in_progress", "response.failed"), names[:3]
    assert names.count("response.queued") <= 1
    terminal = [n for n in names if n in ("response.completed", "response.incomplete", "response.failed")]
    assert terminal == [names[-1]], names
    assert names.count("response.output_item.added") == names.count("response.output_item.done")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert len({e["response"]["id"] for e in events if "response" in e}) == 1
    return events


def strict_openai_chunks(parsed, marker):
    from openai.types import Completion
    from openai.types.chat import ChatCompletionChunk

    model = ChatCompletionChunk if marker == "chat.completion.chunk" else Completion
    for p in parsed:
        if model is Completion:
            # The SDK reuses Completion for chunks, whose type has no null finish_reason although
            # every official stream chunk but the last carries one: check the rest of the chunk.
            p = {**p, "choices": [{**c, "finish_reason": c["finish_reason"] or "stop"} for c in p["choices"]]}
        model.model_validate(p)


def strict_anthropic_events(events):
    from anthropic.types import RawMessageStreamEvent

    adapter = TypeAdapter(RawMessageStreamEvent)
    for e in events:
        if e["type"] != "ping":
            adapter.validate_python(e)


def strict_responses_events(events):
    from openai.types.responses import ResponseStreamEvent

    adapter = TypeAdapter(ResponseStreamEvent)
    for e in events:
        adapter.validate_python(e)
