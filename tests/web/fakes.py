"""A scripted stand-in for engine_bridge.client.generate (unit tests only; end-to-end tests use
the real bridge). Scripts are lists of event dicts; the string "hang" waits until cancelled
(yielding None every tick(), as the real one does, when the caller passes `tick`).
Also the chat-socket helpers the consumer tests share (connect, frames_until)."""
import asyncio


def done_event(prompt_tokens=7, completion_tokens=2, finish_reason="stop"):
    return {"kind": "done", "finish_reason": finish_reason,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
            "stats": {"tok_s": 42.0, "hit_pct": 90.0, "rss_gb": 0.1, "ttft_s": 0.05},
            "perf": None, "entropy": [1.5], "gpus": None, "repin": []}


def reply(*texts, **done_kw):
    return ([{"kind": "submitted", "req": "r"}, {"kind": "queued", "position": 1},
             {"kind": "accepted", "prompt_tokens": 7, "slot": 1, "reused": 0}]
            + [{"kind": "text", "text": t} for t in texts] + [done_event(**done_kw)])


class FakeBridge:
    def __init__(self):
        self.scripts = []  # one script per generate() call, in order; the last one repeats
        self.requests = []
        self.cancelled = []
        self.boots = []    # the bridge boot each call was given (None: generate reads it itself)
        self.hanging = asyncio.Event()

    def script(self, *events):
        self.scripts.append(list(events))

    async def generate(self, request, req_id=None, boot=None, tick=None):
        self.requests.append(request)
        self.boots.append(boot)
        events = self.scripts.pop(0) if len(self.scripts) > 1 else self.scripts[0]
        finished = False
        try:
            for event in events:
                if event == "hang":
                    self.hanging.set()
                    while tick:  # the real client's keepalive ticks while nothing comes
                        await asyncio.sleep(tick())
                        yield None
                    await asyncio.Event().wait()
                await asyncio.sleep(0)
                yield event
            finished = True
        finally:
            if not finished:
                self.cancelled.append(request)


async def connect(user, session=None):
    """A chat socket (channels' WebsocketCommunicator) authenticated as user (with `session`, a
    SessionStore, in its scope as AuthMiddlewareStack puts it; none: the user alone)."""
    from channels.testing import WebsocketCommunicator

    from chat.consumers import ChatConsumer

    comm = WebsocketCommunicator(ChatConsumer.as_asgi(), "/ws/chat/")
    comm.scope["user"] = user
    if session is not None:
        comm.scope["session"] = session
    connected, _ = await comm.connect()
    assert connected
    return comm


async def frames_until(comm, kind, timeout=3):
    """The frames received up to and including the first of type `kind`; each one must be as
    chat.server_frames declares it (what the front end's generated ServerEvent type says)."""
    from chat.server_frames import problems

    seen = []
    while True:
        frame = await comm.receive_json_from(timeout=timeout)
        assert problems(frame) == [], frame
        seen.append(frame)
        if frame["type"] == kind:
            return seen


def serve_state(monkeypatch, state, boot="boot-1"):
    """The bridge telemetry the served model's facts are read from (engine_bridge.served), sync
    and async, and the running bridge's boot read with it."""
    async def aread_and_boot():
        return state, boot

    async def aread():
        return state

    monkeypatch.setattr("engine_bridge.served._read_state", lambda: state)
    monkeypatch.setattr("engine_bridge.served._aread_state", aread)
    monkeypatch.setattr("engine_bridge.served._aread_state_and_boot", aread_and_boot)
