"""Projectors: the generation core's one event stream -> one wire surface.

Projector (surface-neutral) accumulates text, usage and the finish; each subclass turns those
into its surface's SSE frames (streaming) and final object (buffered): OpenAI Chat, legacy
Completions, Anthropic Messages, OpenAI Responses. The engine's outcome maps to each surface's
finish value here and only here (api-surfaces §1.7).

Queue position: a stream may start while its job waits for a slot (api/engine.py). Every
`queued` event then becomes an SSE comment `: queued position=N` (both SDKs skip comment lines),
plus the surface's own way where it has one: Anthropic a `ping` event carrying
`colibri.queue_position` (the SDK skips pings unparsed), Responses the official `response.created`
and `response.queued` with status "queued" (then `response.in_progress` once a slot takes it).
An error before the job was accepted carries the ApiError it would have been as an HTTP status
(`api_error`), so the in-band event says the same (context exceeded, queue timeout, engine down).

Tool calls: with tools offered (api.tools.ToolPlan), the model's text goes through the plan's
incremental parser (engine_bridge.toolsyntax) and each surface turns its events into its own
call frames as they come: Chat `delta.tool_calls` (index from 0, id / type / name once, then
argument fragments; a request with the legacy `functions` gets one `delta.function_call` and
finish `function_call`), Anthropic `tool_use` blocks with `input_json_delta`, Responses
`function_call` items with `function_call_arguments.delta/done`. Finish: a call under auto or
required -> Chat `tool_calls` (a named tool -> `stop`, as OpenAI does), Anthropic `tool_use`;
a budget stop stays `length` and a call it cut comes back as text (DS4 defect 5). A call that
broke after its start was announced is closed and its text follows as content; the buffered
answer lists only complete calls.

Invariants: text events are already valid UTF-8 with stop strings trimmed (the bridge reassembles
DATA frames), so a delta never splits a character; an explicit zero budget submitted 1 token,
which is dropped and reported as a length stop with 0 completion tokens; after an error no
further frames but the in-band error (and, for Responses, its terminal response.failed).
"""
import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from api.errors import ANTHROPIC, OPENAI, ApiError, api_engine_message
from engine_bridge import toolsyntax

if TYPE_CHECKING:
    from api.tools import ToolPlan

Json = dict[str, Any]  # an object of the surface's wire format
Frames = list[str]     # SSE records, in order

KEEPALIVE = ": keepalive\n\n"  # an SSE comment: SDKs ignore it (never an empty data: line)


def queued_comment(position: int | None) -> str:
    return f": queued position={int(position or 0)}\n\n"


def sse(payload: object, event: str | None = None) -> str:
    data = "data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n\n"
    return f"event: {event}\n{data}" if event else data


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def thinking_signature(thinking: str) -> str:
    """A thinking block's `signature`: an HMAC of its text under the site's key (Anthropic's is
    opaque too; clients only send it back). A block sent back is rendered whatever it carries."""
    from django.conf import settings

    digest = hmac.new(str(settings.SECRET_KEY).encode(), thinking.encode("utf-8"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


class Projector:
    """Accumulates what every surface needs; subclasses turn it into frames/objects."""

    keepalive = KEEPALIVE

    def __init__(self, *, model: str, discard_text: bool = False, stop: Iterable[str] = (), routing: bool = False,
                 logprobs: int | None = None, index: int = 0, tools: "ToolPlan | None" = None,
                 calls: toolsyntax.ToolCallParser | None = None, reasoning: str | None = None) -> None:
        self.model = model
        self.reasoning_mode = reasoning  # the served model's reasoning format (None: it does not reason)
        self.thoughts: list[str] = []    # the reasoning text so far
        self.reasoning_tokens = 0
        self.index = index  # the choice this projector writes (n > 1: one projector per choice)
        self.want_logprobs = logprobs  # None: off; k: each token's logprob and its k best candidates
        self.logprob_entries: list[dict] = []  # the bridge's entries: {token, logprob, bytes, top: [...]}
        self.new_logprobs: list[dict] = []  # the entries of the event being fed (on_text / on_done read them)
        self.tools = tools          # api.tools.ToolPlan, or None
        self.calls = None if discard_text else calls  # engine_bridge.toolsyntax.ToolCallParser, or None
        self.want_routing = routing  # the client asked for colibri.routing
        self.created = int(time.time())
        self.discard_text = discard_text  # explicit zero budget: we submitted 1 token, drop it
        self.stop = list(stop)
        self.parts: list[str] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.finish_reason: str | None = None  # engine level: stop | length
        self.stop_sequence: str | None = None  # the client's stop string that ended the text, when known
        self.error: dict | None = None
        self.api_error: ApiError | None = None  # an error before ACCEPT: the HTTP error it would have been
        self.done: dict | None = None
        self.accepted = False
        self.position: int | None = None  # the last queue position the bridge reported
        self.topk: list = []

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def reasoning(self) -> str:
        return "".join(self.thoughts)

    @property
    def finished(self) -> bool:
        return self.done is not None or self.error is not None

    @property
    def error_message(self) -> str:
        if self.api_error is not None:
            return self.api_error.message
        return api_engine_message(self.error or {})

    def colibri(self) -> Json:
        d: dict = self.done or {}
        return {"stats": d.get("stats"), "perf": d.get("perf"), "topk": self.topk,
                "entropy": d.get("entropy"), "gpus": d.get("gpus"), "repin": d.get("repin"),
                "routing": self.routing()}

    def routing(self) -> dict | None:
        """This request's expert selections (the bridge's done.routing: {rows, cols, counts:
        [[row, expert, count], ...]}), or None when not asked for."""
        done: dict = self.done or {}
        return done.get("routing") if self.want_routing else None

    def feed(self, event: dict) -> Frames:
        """Updates state; returns the wire frames this event produces (streaming)."""
        if self.finished:
            return []
        kind = event.get("kind")
        if kind == "queued":
            if self.accepted:
                return []
            self.position = event.get("position")
            return self.on_queued(self.position)
        if kind == "accepted":
            self.accepted = True
            self.prompt_tokens = event.get("prompt_tokens") or 0
            return self.on_accepted()
        if kind == "text":
            if self.discard_text or not event.get("text"):
                return []
            self._take_logprobs(event)
            if self.calls is not None:
                return self._tool_frames(self.calls.feed(event["text"]))
            self.parts.append(event["text"])
            return self.on_text(event["text"])
        if kind == "reasoning":
            if self.discard_text or not event.get("text"):
                return []
            self.thoughts.append(event["text"])
            return self.on_reasoning(event["text"])
        if kind == "topk":
            self.topk.append(event.get("candidates"))
            return []
        if kind == "done":
            self.done = event
            if not self.discard_text:
                self._take_logprobs(event)
            else:
                self.new_logprobs = []
            usage = event.get("usage") or {}
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.completion_tokens = 0 if self.discard_text else usage.get("completion_tokens", 0)
            self.reasoning_tokens = 0 if self.discard_text else int(event.get("reasoning_tokens") or 0)
            self.finish_reason = "length" if self.discard_text else (event.get("finish_reason") or "stop")
            if self.finish_reason == "stop" and event.get("stop_sequence") in self.stop:
                self.stop_sequence = event["stop_sequence"]
            tail = self._tool_frames(self.calls.finish()) if self.calls is not None else []
            return tail + self.on_done()
        if kind == "error":
            self.error = event
            if not self.accepted:
                self.api_error = event.get("api_error")
            return self.on_error()
        return []  # unknown kinds

    def _tool_frames(self, events: Iterable[toolsyntax.ParserEvent]) -> Frames:
        frames: Frames = []
        for e in events:
            if isinstance(e, toolsyntax.Text):
                self.parts.append(e.text)
                frames += self.on_text(e.text)
                self.new_logprobs = []  # the feed's entries went with its first text delta
            elif isinstance(e, toolsyntax.CallStart):
                frames += self.on_call_start(e)
            elif isinstance(e, toolsyntax.CallArgs):
                frames += self.on_call_args(e)
            else:
                frames += self.on_call_end(e)
        return frames

    @property
    def tool_calls(self) -> list[toolsyntax.Call]:
        """The complete calls (toolsyntax.Call), in order."""
        return self.calls.ok_calls if self.calls is not None else []

    @property
    def called(self) -> bool:
        """A complete call ended the turn (a budget stop never counts: it stays `length`)."""
        return bool(self.tool_calls) and self.finish_reason == "stop" and not self.stop_sequence

    def _take_logprobs(self, event: dict) -> None:
        self.new_logprobs = list(event.get("logprobs") or ()) if self.want_logprobs is not None else []
        self.logprob_entries.extend(self.new_logprobs)

    def on_queued(self, position: int | None) -> Frames:
        return [queued_comment(position)]

    def on_call_start(self, event: toolsyntax.CallStart) -> Frames:
        return []

    def on_call_args(self, event: toolsyntax.CallArgs) -> Frames:
        return []

    def on_call_end(self, event: toolsyntax.CallEnd) -> Frames:
        return []

    def on_accepted(self) -> Frames:
        return []

    def on_text(self, text: str) -> Frames:
        return []

    def on_reasoning(self, text: str) -> Frames:
        return []

    def on_done(self) -> Frames:
        return []

    def on_error(self) -> Frames:
        return []

    def end(self) -> Frames:
        return []

    def response(self) -> Json:
        """The buffered answer object (every surface's projector has its own)."""
        raise NotImplementedError


def chat_logprobs(entries: Iterable[dict], k: int) -> Json:
    """Bridge entries -> Chat's choices[].logprobs ({content: [{token, logprob, bytes, top_logprobs}]})."""
    return {"content": [{"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"],
                         "top_logprobs": [dict(t) for t in e["top"][:k]]} for e in entries], "refusal": None}


def completion_logprobs(entries: Iterable[dict], k: int, offset: int = 0) -> Json:
    """Bridge entries -> legacy Completions' choices[].logprobs, text offsets from `offset`."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        out["tokens"].append(e["token"])
        out["token_logprobs"].append(e["logprob"])
        out["top_logprobs"].append({t["token"]: t["logprob"] for t in e["top"][:k]})
        out["text_offset"].append(offset)
        offset += 0 if e["token"].startswith("bytes:") else len(e["token"])
    return out


class OpenAIChatProjector(Projector):
    def __init__(self, *, include_usage: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.id = _id("chatcmpl-")
        self.include_usage = include_usage
        self.solo = True  # False under a Choices (n > 1): the usage and colibri chunks are the group's

    def logprobs_wire(self, entries: Iterable[dict]) -> Json | None:
        return None if self.want_logprobs is None else chat_logprobs(entries, self.want_logprobs)

    def usage(self) -> Json:
        usage: Json = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                       "total_tokens": self.prompt_tokens + self.completion_tokens}
        if self.reasoning_mode:
            usage["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return usage

    def chunk(self, choices: list[Json], **extra: Any) -> Json:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **extra}

    def _delta(self, delta: Json, finish_reason: str | None = None, entries: Sequence[dict] = ()) -> str:
        logprobs = self.logprobs_wire(entries) if entries else None
        return sse(self.chunk([{"index": self.index, "delta": delta, "logprobs": logprobs,
                                "finish_reason": finish_reason}]))

    def on_accepted(self) -> Frames:
        return [self._delta({"role": "assistant", "content": ""})]

    def on_text(self, text: str) -> Frames:
        return [self._delta({"content": text}, entries=self.new_logprobs)]

    def on_reasoning(self, text: str) -> Frames:
        # llama-server's and DeepSeek's field (the SDK keeps it in the delta's model_extra)
        return [self._delta({"reasoning_content": text})]

    def wire_finish(self) -> str | None:
        if self.called and self.tools is not None and not self.tools.named:  # OpenAI: a named tool finishes with "stop"
            return "function_call" if self.tools.legacy else "tool_calls"
        return self.finish_reason

    def on_call_start(self, event: toolsyntax.CallStart) -> Frames:
        assert self.tools is not None  # calls come only with a tool plan
        if self.tools.legacy:  # the request sent `functions`: the legacy one-call shape
            return [self._delta({"function_call": {"name": event.name, "arguments": ""}})]
        call = {"index": event.index, "id": event.id, "type": "function",
                "function": {"name": event.name, "arguments": ""}}
        return [self._delta({"tool_calls": [call]})]

    def on_call_args(self, event: toolsyntax.CallArgs) -> Frames:
        assert self.tools is not None  # calls come only with a tool plan
        if self.tools.legacy:
            return [self._delta({"function_call": {"arguments": event.delta}})]
        return [self._delta({"tool_calls": [{"index": event.index, "function": {"arguments": event.delta}}]})]

    def message(self) -> Json:
        message: Json = {"role": "assistant", "content": self.text, "refusal": None}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls and self.tools is not None and self.tools.legacy:
            call = self.tool_calls[0]
            message["function_call"] = {"name": call.name, "arguments": call.arguments}
            if not self.text.strip():
                message["content"] = None
        elif self.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in self.tool_calls]
            if not self.text.strip():
                message["content"] = None
        return message

    def on_done(self) -> Frames:
        frames = [self._delta({}, self.wire_finish(), entries=self.new_logprobs)]
        return frames + (self.closing_frames() if self.solo else [])

    def closing_frames(self) -> Frames:
        frames = []
        if self.include_usage:
            frames.append(sse(self.chunk([], usage=self.usage())))
        # The colibri frame is a chunk too (object marker, empty choices), so SDK loops that read
        # chunk.choices keep working and every data record passes the chunk-stream oracle.
        frames.append(sse(self.chunk([], colibri=self.colibri())))
        return frames

    def on_error(self) -> Frames:
        # After the 200: an in-band error record, then close without [DONE] (the SDK raises).
        return [sse(OPENAI.stream_error(self.error_message, self.api_error))]

    def end(self) -> Frames:
        return [] if self.error else ["data: [DONE]\n\n"]

    def choice(self) -> Json:
        return {"index": self.index, "message": self.message(),
                "logprobs": self.logprobs_wire(self.logprob_entries), "finish_reason": self.wire_finish()}

    def response(self) -> Json:
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "system_fingerprint": None,
            "choices": [self.choice()],
            "usage": self.usage(),
            "colibri": self.colibri(),
        }


class CompletionProjector(OpenAIChatProjector):
    """Legacy Completions: every chunk a full text_completion object (never a delta)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.id = _id("cmpl-")
        self.lp_offset = 0  # text_offset of the next streamed token

    def logprobs_wire(self, entries: Iterable[dict], offset: int = 0) -> Json | None:
        return None if self.want_logprobs is None else completion_logprobs(entries, self.want_logprobs, offset)

    def _stream_logprobs(self, entries: Sequence[dict]) -> Json | None:
        if not entries:
            return None
        wire = self.logprobs_wire(entries, self.lp_offset)
        self.lp_offset += sum(0 if e["token"].startswith("bytes:") else len(e["token"]) for e in entries)
        return wire

    def chunk(self, choices: list[Json], **extra: Any) -> Json:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **extra}

    def _choice(self, text: str, finish_reason: str | None = None, entries: Sequence[dict] = ()) -> str:
        return sse(self.chunk([{"text": text, "index": self.index, "logprobs": self._stream_logprobs(entries),
                                "finish_reason": finish_reason}]))

    def on_accepted(self) -> Frames:
        return []

    def on_text(self, text: str) -> Frames:
        return [self._choice(text, entries=self.new_logprobs)]

    def on_done(self) -> Frames:
        frames = [self._choice("", self.finish_reason, entries=self.new_logprobs)]
        return frames + (self.closing_frames() if self.solo else [])

    def closing_frames(self) -> Frames:
        frames = []
        if self.include_usage:
            frames.append(sse(self.chunk([], usage=self.usage())))
        if self.want_routing:  # as Chat's colibri chunk: a full object with empty choices
            frames.append(sse(self.chunk([], colibri=self.colibri())))
        return frames

    def response(self) -> Json:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "system_fingerprint": None,
                "choices": [self.choice()], "usage": self.usage(), "colibri": self.colibri()}

    def choice(self) -> Json:
        return {"text": self.text, "index": self.index, "logprobs": self.logprobs_wire(self.logprob_entries),
                "finish_reason": self.finish_reason}


class AnthropicProjector(Projector):
    """Messages: `event:` lines on every event, type inside equal to the event name. Content
    blocks are indexed 0, 1, 2, ... in start order (the SDK appends at each start): text blocks
    and, with tools, a `tool_use` block per call whose input streams as `input_json_delta`."""

    keepalive = sse({"type": "ping"}, "ping")

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.id = _id("msg_")
        self.blocks: list[Json] = []  # the content, in start order ({"type": "text"|"tool_use", ...})
        self.open: int | None = None  # index of the open block

    def _event(self, name: str, **payload: Any) -> str:
        return sse({"type": name, **payload}, name)

    def stop_reason(self) -> str:
        if self.finish_reason == "length":
            return "max_tokens"
        if self.called:
            return "tool_use"
        return "stop_sequence" if self.stop_sequence else "end_turn"

    def usage(self) -> Json:
        return {"input_tokens": self.prompt_tokens, "output_tokens": self.completion_tokens,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}

    def on_queued(self, position: int | None) -> Frames:
        # The SDK skips ping events without parsing them; a raw SSE reader sees the position.
        return [queued_comment(position), self._event("ping", colibri={"queue_position": position})]

    def on_accepted(self) -> Frames:
        message: Json = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {**self.usage(), "output_tokens": 0}}
        frames = [self._event("message_start", message=message)]
        if not self.discard_text and self.calls is None and not self.reasoning_mode:
            # without tools (or thinking, whose block comes first) the text block opens at once
            frames += [*self._start_block({"type": "text", "text": ""}), self._event("ping")]
        return frames

    def _start_block(self, block: Json) -> Frames:
        frames = self._close_block()
        self.open = len(self.blocks)
        self.blocks.append(dict(block))
        return frames + [self._event("content_block_start", index=self.open, content_block=block)]

    def _close_block(self) -> Frames:
        if self.open is None:
            return []
        index, self.open = self.open, None
        frames = []
        block = self.blocks[index]
        if block["type"] == "thinking":  # the SDK's block gets its signature from this delta
            block["signature"] = thinking_signature(block["thinking"])
            frames.append(self._event("content_block_delta", index=index,
                                      delta={"type": "signature_delta", "signature": block["signature"]}))
        return frames + [self._event("content_block_stop", index=index)]

    def on_reasoning(self, text: str) -> Frames:
        frames: Frames = []
        if self.open is None or self.blocks[self.open]["type"] != "thinking":
            frames = self._start_block({"type": "thinking", "thinking": "", "signature": ""})
        assert self.open is not None  # _start_block opened one
        self.blocks[self.open]["thinking"] += text
        return frames + [self._event("content_block_delta", index=self.open,
                                     delta={"type": "thinking_delta", "thinking": text})]

    def on_text(self, text: str) -> Frames:
        frames: Frames = []
        if self.open is None or self.blocks[self.open]["type"] != "text":
            frames = self._start_block({"type": "text", "text": ""})
        assert self.open is not None  # _start_block opened one
        self.blocks[self.open]["text"] += text
        return frames + [self._event("content_block_delta", index=self.open, delta={"type": "text_delta", "text": text})]

    def on_call_start(self, event: toolsyntax.CallStart) -> Frames:
        return self._start_block({"type": "tool_use", "id": event.id, "name": event.name, "input": {}})

    def on_call_args(self, event: toolsyntax.CallArgs) -> Frames:
        return [self._event("content_block_delta", index=self.open,
                            delta={"type": "input_json_delta", "partial_json": event.delta})]

    def on_call_end(self, event: toolsyntax.CallEnd) -> Frames:
        assert self.open is not None  # the call's block (on_call_start)
        block = self.blocks[self.open]
        if event.ok:
            block["input"] = json.loads(event.arguments)
        else:
            block["broken"] = True  # its text follows as a text block; the buffered answer drops it
        return self._close_block()

    def on_done(self) -> Frames:
        frames = []
        if not self._answered() and not self.discard_text:  # say something: an empty text block
            frames = self._start_block({"type": "text", "text": ""})
        return [*frames, *self._close_block(),
                self._event("message_delta", delta={"stop_reason": self.stop_reason(), "stop_sequence": self.stop_sequence},
                            usage={"output_tokens": self.completion_tokens}),
                self._event("message_stop", **self._colibri_field())]

    def _colibri_field(self) -> Json:
        return {"colibri": {"routing": self.routing()}} if self.want_routing else {}

    def on_error(self) -> Frames:
        if self.api_error is not None:
            kind = ANTHROPIC.body(self.api_error)["error"]["type"]
        else:
            kind = "overloaded_error" if (self.error or {}).get("code") in ("ENGINE_UNAVAILABLE", "QUEUE_FULL") else "api_error"
        return [sse(ANTHROPIC.stream_error(self.error_message, kind), "error")]

    def _answered(self) -> bool:
        return any(b["type"] != "thinking" for b in self.blocks)

    def content(self) -> list[Json]:
        if self.discard_text:
            return []
        blocks = [b for b in self.blocks if not b.get("broken") and not (b["type"] == "text" and not b["text"])]
        if not any(b["type"] != "thinking" for b in blocks):
            blocks.append({"type": "text", "text": self.text})
        return blocks

    def response(self) -> Json:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": self.content(),
                "stop_reason": self.stop_reason(), "stop_sequence": self.stop_sequence, "usage": self.usage(),
                **self._colibri_field()}


class ResponsesProjector(Projector):
    """Responses: response.* events with a contiguous sequence_number from 0, `event:` lines,
    exactly one terminal event (completed | incomplete | failed), no [DONE]. Output items in
    order: messages (`msg_` ids) and, with tools, `function_call` items (item id `fc_`, the
    call_id `call_` the client echoes back in function_call_output)."""

    def __init__(self, *, echo: Json | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.id = _id("resp_")
        self.item_id = _id("msg_")  # the first message item's id
        self.echo = echo or {}  # request parameters the response object repeats
        self.seq = 0
        self.created_sent = False  # response.created went out (at the first queued event or at accept)
        self.items: list[Json] = []  # output items in order: {"type": "message", id, text} | a function_call item
        self.open: int | None = None  # index of the open item

    @property
    def item_added(self) -> bool:
        return bool(self.items)

    def _event(self, name: str, /, **payload: Any) -> str:  # positional: a function_call's payload has a `name`
        frame = sse({"type": name, "sequence_number": self.seq, **payload}, name)
        self.seq += 1
        return frame

    def status(self) -> str:
        if self.error:
            return "failed"
        if not self.accepted:
            return "queued"
        if self.done is None:
            return "in_progress"
        return "incomplete" if self.finish_reason == "length" else "completed"

    def usage(self) -> Json:
        return {"input_tokens": self.prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": self.completion_tokens, "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    @staticmethod
    def _part(text: str) -> Json:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _final_status(self) -> str:
        return "completed" if self.done else "incomplete"

    def _wire_item(self, item: Json, status: str | None = None) -> Json:
        status = status or item.get("status") or self._final_status()
        if item["type"] == "message":
            return {"id": item["id"], "type": "message", "role": "assistant", "status": status,
                    "content": [self._part(item["text"])]}
        if item["type"] == "reasoning":
            return {"id": item["id"], "type": "reasoning", "summary": [], "status": status,
                    "content": [{"type": "reasoning_text", "text": item["text"]}]}
        return {"id": item["id"], "type": "function_call", "call_id": item["call_id"], "name": item["name"],
                "arguments": item["arguments"], "status": status}

    def item(self, status: str | None = None) -> Json:
        """The first message item (what a response without tools holds)."""
        first = next((i for i in self.items if i["type"] == "message"), {"type": "message", "id": self.item_id, "text": ""})
        return self._wire_item(first, status)

    def _error_code(self) -> str:
        err = self.api_error
        if err is not None and err.status == 429:
            return "rate_limit_exceeded"
        if err is not None and err.code == "context_length_exceeded":
            return "invalid_prompt"
        return "server_error"

    def output(self) -> list[Json]:
        out = [self._wire_item(i) for i in self.items if not i.get("broken")]
        if not self._answered() and self.done and self.calls is None:
            out.append(self.item())
        return out

    def _answered(self) -> bool:
        return any(i["type"] != "reasoning" for i in self.items)

    def response(self, *, output: list[Json] | None = None) -> Json:
        status = self.status()
        if output is None:
            output = self.output()
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": output,
            "error": {"code": self._error_code(), "message": self.error_message} if self.error else None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "usage": self.usage() if self.done else None,
            "tools": [], "tool_choice": "auto", "parallel_tool_calls": True, "text": {"format": {"type": "text"}},
            "metadata": {}, **self.echo,
            **({"colibri": {"routing": self.routing()}} if self.want_routing and self.done else {}),
        }

    def _created(self) -> Frames:
        if self.created_sent:
            return []
        self.created_sent = True
        return [self._event("response.created", response=self.response(output=[]))]

    def on_queued(self, position: int | None) -> Frames:
        frames = [queued_comment(position)]
        if not self.created_sent:  # official events for a waiting response; no position field
            frames += [*self._created(), self._event("response.queued", response=self.response(output=[]))]
        return frames

    def on_accepted(self) -> Frames:
        frames = [*self._created(), self._event("response.in_progress", response=self.response(output=[]))]
        if self.calls is None and not self.reasoning_mode:  # without tools (or reasoning, first) the message opens at once
            frames += self._open_message()
        return frames

    def _open_message(self) -> Frames:
        frames = self._close_item()
        first = not any(i["type"] == "message" for i in self.items)
        item = {"type": "message", "id": self.item_id if first else _id("msg_"), "text": ""}
        self.open = len(self.items)
        self.items.append(item)
        loc = {"item_id": item["id"], "output_index": self.open, "content_index": 0}
        return [
            *frames,
            self._event("response.output_item.added", output_index=self.open,
                        item={**self._wire_item(item, "in_progress"), "content": []}),
            self._event("response.content_part.added", **loc, part={"type": "output_text", "text": "", "annotations": []}),
        ]

    def on_text(self, text: str) -> Frames:
        frames: Frames = []
        if self.open is None or self.items[self.open]["type"] != "message":
            frames = self._open_message()
        assert self.open is not None  # _open_message opened one
        item = self.items[self.open]
        item["text"] += text
        return frames + [self._event("response.output_text.delta", item_id=item["id"], output_index=self.open,
                                     content_index=0, delta=text, logprobs=[])]

    def on_reasoning(self, text: str) -> Frames:
        frames: Frames = []
        if self.open is None or self.items[self.open]["type"] != "reasoning":
            frames = self._close_item()
            item = {"type": "reasoning", "id": _id("rs_"), "text": ""}
            self.open = len(self.items)
            self.items.append(item)
            loc = {"item_id": item["id"], "output_index": self.open, "content_index": 0}
            frames += [self._event("response.output_item.added", output_index=self.open,
                                   item={**self._wire_item(item, "in_progress"), "content": []}),
                       self._event("response.content_part.added", **loc, part={"type": "reasoning_text", "text": ""})]
        assert self.open is not None
        item = self.items[self.open]
        item["text"] += text
        return frames + [self._event("response.reasoning_text.delta", item_id=item["id"], output_index=self.open,
                                     content_index=0, delta=text)]

    def on_call_start(self, event: toolsyntax.CallStart) -> Frames:
        frames = self._close_item()
        item = {"type": "function_call", "id": _id("fc_"), "call_id": event.id, "name": event.name, "arguments": ""}
        self.open = len(self.items)
        self.items.append(item)
        return frames + [self._event("response.output_item.added", output_index=self.open,
                                     item=self._wire_item(item, "in_progress"))]

    def on_call_args(self, event: toolsyntax.CallArgs) -> Frames:
        assert self.open is not None  # the call's item (on_call_start)
        item = self.items[self.open]
        item["arguments"] += event.delta
        return [self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=self.open,
                            delta=event.delta)]

    def on_call_end(self, event: toolsyntax.CallEnd) -> Frames:
        assert self.open is not None  # the call's item (on_call_start)
        item = self.items[self.open]
        item["status"] = "completed" if event.ok else "incomplete"
        item["broken"] = not event.ok
        return self._close_item()

    def _close_item(self) -> Frames:
        if self.open is None:
            return []
        index, self.open = self.open, None
        item = self.items[index]
        if item["type"] == "function_call":
            return [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                name=item["name"], arguments=item["arguments"]),
                    self._event("response.output_item.done", output_index=index, item=self._wire_item(item))]
        item["status"] = "incomplete" if self.error else "completed"
        loc = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": item["text"]}
            return [self._event("response.reasoning_text.done", **loc, text=item["text"]),
                    self._event("response.content_part.done", **loc, part=part),
                    self._event("response.output_item.done", output_index=index, item=self._wire_item(item))]
        return [
            self._event("response.output_text.done", **loc, text=item["text"], logprobs=[]),
            self._event("response.content_part.done", **loc, part=self._part(item["text"])),
            self._event("response.output_item.done", output_index=index, item=self._wire_item(item)),
        ]

    def on_done(self) -> Frames:
        frames = []
        if not self._answered() and not self.discard_text:  # no answer (tools, or only reasoning): an empty message
            frames = self._open_message()
        frames += self._close_item()
        terminal = "response.incomplete" if self.status() == "incomplete" else "response.completed"
        return [*frames, self._event(terminal, response=self.response())]

    def on_error(self) -> Frames:
        frames = self._close_item() if self.items else self._created()
        return [*frames, self._event("response.failed", response=self.response())]


class Choices:
    """n > 1 (Chat and Completions): n projectors, one per choice, fed the merged events of n
    independent generations (each event carries its `choice`). Every chunk names its choice's
    index; each choice has its own finish; the group ends the stream once: the usage chunk (prompt
    tokens once, as OpenAI counts them; completion tokens summed) and [DONE] after the last choice.
    Buffered: one object, every choice in index order. It has the Projector interface the views use."""

    def __init__(self, projectors: list[OpenAIChatProjector]) -> None:
        self.choices = projectors
        first = projectors[0]
        for i, p in enumerate(projectors):
            p.index, p.solo, p.id, p.created = i, False, first.id, first.created
        self.keepalive = first.keepalive

    def __getattr__(self, name: str) -> Any:  # model, want_routing, include_usage, chunk(): the first choice's
        return getattr(self.choices[0], name)

    @property
    def accepted(self) -> bool:
        return self.choices[0].accepted

    @property
    def done(self) -> dict | None:
        return self.choices[-1].done if all(p.done is not None for p in self.choices) else None

    @property
    def error(self) -> dict | None:
        return next((p.error for p in self.choices if p.error is not None), None)

    @property
    def finished(self) -> bool:
        return self.done is not None or self.error is not None

    @property
    def error_message(self) -> str:
        return next(p.error_message for p in self.choices if p.error is not None)

    @property
    def prompt_tokens(self) -> int:
        return self.choices[0].prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(p.completion_tokens for p in self.choices)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.choices)

    @property
    def finish_reason(self) -> str | None:
        return "length" if any(p.finish_reason == "length" for p in self.choices) else self.choices[0].finish_reason

    def usage(self) -> Json:
        usage: Json = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                       "total_tokens": self.prompt_tokens + self.completion_tokens}
        if self.choices[0].reasoning_mode:
            usage["completion_tokens_details"] = {"reasoning_tokens": sum(p.reasoning_tokens for p in self.choices)}
        return usage

    def feed(self, event: dict) -> Frames:
        if self.finished:
            return []
        p = self.choices[event.get("choice", 0)]
        frames = p.feed(event)
        if event.get("kind") == "done" and self.done is not None:
            first = self.choices[0]
            setattr(first, "usage", self.usage)  # the group's usage in the closing chunk (an instance attribute)
            try:
                frames = [*frames, *first.closing_frames()]
            finally:
                delattr(first, "usage")
        return frames

    def end(self) -> Frames:
        return self.choices[0].end() if self.error is None else []

    def response(self) -> Json:
        body = self.choices[0].response()
        body["choices"] = [p.choice() for p in self.choices]
        body["usage"] = self.usage()
        return body
