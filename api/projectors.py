"""Projectors: one engine event stream -> one wire surface. OpenAI Chat now; Anthropic
Messages, legacy Completions and Responses subclass Projector the same way."""
import json
import time
import uuid

from api.errors import stream_error_body

KEEPALIVE = ": keepalive\n\n"  # an SSE comment: SDKs ignore it (never an empty data: line)


def sse(payload):
    return "data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n\n"


class Projector:
    """Accumulates what every surface needs; subclasses turn it into frames/objects."""

    def __init__(self, *, model, discard_text=False):
        self.model = model
        self.created = int(time.time())
        self.discard_text = discard_text  # explicit zero budget: we submitted 1 token, drop it
        self.parts = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.finish_reason = None
        self.error = None
        self.done = None
        self.topk = []

    @property
    def text(self):
        return "".join(self.parts)

    @property
    def finished(self):
        return self.done is not None or self.error is not None

    def colibri(self):
        d = self.done or {}
        return {"stats": d.get("stats"), "perf": d.get("perf"), "topk": self.topk,
                "entropy": d.get("entropy"), "gpus": d.get("gpus"), "repin": d.get("repin")}

    def feed(self, event):
        """Updates state; returns the wire frames this event produces (streaming)."""
        kind = event.get("kind")
        if kind == "accepted":
            self.prompt_tokens = event.get("prompt_tokens") or 0
            return self.on_accepted()
        if kind == "text":
            if self.discard_text:
                return []
            self.parts.append(event["text"])
            return self.on_text(event["text"])
        if kind == "topk":
            self.topk.append(event.get("candidates"))
            return []
        if kind == "done":
            self.done = event
            usage = event.get("usage") or {}
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.completion_tokens = 0 if self.discard_text else usage.get("completion_tokens", 0)
            self.finish_reason = "length" if self.discard_text else (event.get("finish_reason") or "stop")
            return self.on_done()
        if kind == "error":
            self.error = event
            return self.on_error()
        return []  # queued (after accept it cannot happen) and unknown kinds

    def on_accepted(self):
        return []

    def on_text(self, text):
        return []

    def on_done(self):
        return []

    def on_error(self):
        return []

    def end(self):
        return []


class OpenAIChatProjector(Projector):
    object_name = "chat.completion"

    def __init__(self, *, model, include_usage=False, discard_text=False):
        super().__init__(model=model, discard_text=discard_text)
        self.id = "chatcmpl-" + uuid.uuid4().hex
        self.include_usage = include_usage

    def usage(self):
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def chunk(self, choices, **extra):
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **extra}

    def _delta(self, delta, finish_reason=None):
        return sse(self.chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]))

    def on_accepted(self):
        return [self._delta({"role": "assistant", "content": ""})]

    def on_text(self, text):
        return [self._delta({"content": text})]

    def on_done(self):
        frames = [self._delta({}, self.finish_reason)]
        if self.include_usage:
            frames.append(sse(self.chunk([], usage=self.usage())))
        # The colibri frame is a chunk too (object marker, empty choices), so SDK loops that read
        # chunk.choices keep working and every data record passes the chunk-stream oracle.
        frames.append(sse(self.chunk([], colibri=self.colibri())))
        return frames

    def on_error(self):
        # After the 200: an in-band error record, then close without [DONE] (the SDK raises).
        e = self.error
        return [sse(stream_error_body(f"engine error ({e.get('code')}): {e.get('message', '')}"))]

    def end(self):
        return [] if self.error else ["data: [DONE]\n\n"]

    def response(self):
        return {
            "id": self.id, "object": self.object_name, "created": self.created, "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.text, "refusal": None},
                         "logprobs": None, "finish_reason": self.finish_reason}],
            "usage": self.usage(),
            "colibri": self.colibri(),
        }
