"""Where a generation request's parse runs (api.views._parsed): a small plain body on the event
loop, since a worker thread's hop waited for the GIL behind the loop's other work (a burst of 8
reached the bridge ~9 ms after its registry read); a body that may compile a grammar (a new
schema can take a second) or a large one in a worker thread, so no stream's loop stalls on it."""
import dataclasses
import json
import threading

import pytest

from api import surfaces, views
from engine_bridge import served as served_mod

PLAIN = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def _served():
    return served_mod.served_model_from({"status": "up", "updated": 1.0,
                                         "model": {"name": "tiny", "arch": "llama", "grammar": "CGD1"}})


@pytest.fixture
def parse_threads():
    """The thread each parse of the chat surface ran on (the real parse, watched)."""
    surface = surfaces.BY_NAME["openai_chat"]
    seen = []

    def watched(*args, **kwargs):
        seen.append(threading.current_thread())
        return surface.parse(*args, **kwargs)

    return dataclasses.replace(surface, parse=watched), seen


@pytest.mark.asyncio
async def test_a_small_plain_body_is_parsed_on_the_loop_and_the_others_in_a_worker_thread(parse_threads):
    surface, seen = parse_threads
    loop_thread = threading.current_thread()
    call = await views._parsed(surface, PLAIN, _served(), size=len(json.dumps(PLAIN)))
    assert call.request.prompt and seen == [loop_thread]
    structured = {**PLAIN, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}
    call = await views._parsed(surface, structured, _served(), size=len(json.dumps(structured)))
    assert call.request.grammar and seen[-1] is not loop_thread
    big = {**PLAIN, "messages": [{"role": "user", "content": "x" * (views.INLINE_PARSE_BYTES + 1)}]}
    await views._parsed(surface, big, _served(), size=len(json.dumps(big)))
    assert seen[-1] is not loop_thread and len(seen) == 3


@pytest.mark.asyncio
async def test_a_refusal_is_the_same_error_wherever_the_parse_ran(parse_threads):
    surface, _ = parse_threads
    bad = {**PLAIN, "messages": "not a list"}
    errors = []
    for body in (bad, {**bad, "tools": []}):  # on the loop, in a thread
        with pytest.raises(Exception) as info:
            await views._parsed(surface, body, _served(), size=len(json.dumps(body)))
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]
