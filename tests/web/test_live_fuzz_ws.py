"""A fuzz pass over the chat websocket's frames against the real stack (issue 10): whatever a
client sends, the socket answers (an error frame, or a turn that it can stop) and stays open, and
the engine is never restarted."""
import asyncio
import json

import pytest
import websockets
from django.test import Client
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.django_db(transaction=True)

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.text(st.characters(categories=["Cs", "L", "N", "P", "Zs", "Cc"]), max_size=12),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                      max_leaves=6)
params = st.dictionaries(st.sampled_from(["temperature", "top_p", "max_tokens", "bogus"]), scalars, max_size=4)
frames = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(["send", "stop", "regenerate", "edit", "open"]), values)},
    optional={"conversation": st.one_of(scalars, st.integers(min_value=1, max_value=50)),
              "message": scalars, "text": st.one_of(st.text(max_size=30), values), "params": st.one_of(params, values)},
)


@pytest.fixture
def cookie(alice):
    c = Client()
    c.force_login(alice)
    return f"sessionid={c.cookies['sessionid'].value}"


async def _exchange(ws, raw):
    """Sends one frame; returns once the server has answered it (error, or a turn that ended)."""
    await ws.send(raw)
    conversation = None
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if frame["type"] == "conversation":
            conversation = frame["conversation"]["id"]
        elif frame["type"] in ("started", "delta") and conversation:
            await ws.send(json.dumps({"type": "stop", "conversation": conversation}))
            conversation = None
        if frame["type"] in ("error", "done", "snapshot"):
            return frame


def test_fuzzed_frames_never_close_the_socket_or_restart_the_engine(live_stack, cookie):
    restarts_before = live_stack.bridge_state()["restarts"]
    seen = {"error": 0, "other": 0}

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(frames)
    # Inputs the generator draws only on some runs, pinned (issue 24: a NUL in a chat message was a
    # server error, found by this test once in two fresh-clone runs): PostgreSQL cannot store NUL.
    @example({"type": "send", "text": "\u0000"})
    @example({"type": "send", "conversation": None, "text": "a\u0000b"})
    @example({"type": "edit", "conversation": 1, "message": 1, "text": "\u0000"})
    @example({"type": "send", "text": "\ud800"})
    @example({"type": "send", "text": "hi", "params": {"\u0000": 1}})
    @example({"type": "send", "text": " \t"})
    @example({"type": "open", "conversation": 2 ** 70})
    @example({"type": "send", "text": "hi", "params": {"temperature": float("nan")}})
    def one(frame):
        raw = json.dumps(frame, allow_nan=True)

        async def run():
            async with websockets.connect(live_stack.ws_url + "/ws/chat/", origin=live_stack.url,
                                          additional_headers={"Cookie": cookie}, open_timeout=10) as ws:
                answer = await _exchange(ws, raw)
                seen["error" if answer["type"] == "error" else "other"] += 1
                if answer["type"] == "error":
                    assert answer["detail"] and answer["code"] != "server_error", answer
                # still open and serving: a frame of a known shape gets its answer
                probe = await _exchange(ws, json.dumps({"type": "open", "conversation": 2 ** 62}))
                assert probe["type"] == "error" and probe["code"] == "not_found", probe

        asyncio.run(run())

    one()
    assert seen["error"] > 50  # the generator does reach the refusals
    assert live_stack.bridge_state()["restarts"] == restarts_before, "a frame restarted the engine"
