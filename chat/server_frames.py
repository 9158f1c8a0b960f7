"""Every frame the server sends on /ws/chat/ (docs/contracts.md, "Chat websocket"), declared once.

The consumer, the relay, the orphan sweeper and the title task build frames only through the
functions here, so a field cannot be added on one path and forgotten on another; the TypedDicts
are what mypy checks those functions against. The front end's `ServerEvent` union
(frontend/src/server_events.ts) is generated from these declarations (`typescript()`, written by
`manage.py chat_frames_ts`), and tests/web/test_chat_frames.py fails when the file is stale, when a
hand-written TS interface named in TS_NAMES lacks a key the server sends, or when a frame a test
receives does not conform (`problems`). client frames are chat/frames.py's.
"""
import types
import typing
from typing import Any, Literal, NotRequired, TypedDict, Union


class MessageData(TypedDict):
    """chat.models.Message.as_dict: one message as the page shows it."""

    id: int
    conversation: int
    role: str  # Message.Role
    text: str  # the answer only
    thinking: str  # a reasoning model's thinking before the answer; "" when it had none
    status: str  # Message.Status
    stats: dict[str, Any]
    tool_calls: list[dict[str, Any]]
    tool_call_id: str
    created: str


class ConversationData(TypedDict):
    """chat.models.Conversation.as_dict (without its `detail` part, which frames never carry)."""

    id: int
    title: str
    model: str
    created: str
    updated: str


class ConversationFrame(TypedDict):
    type: Literal["conversation"]
    conversation: ConversationData


class SnapshotFrame(TypedDict):
    type: Literal["snapshot"]
    conversation: int
    messages: list[MessageData]


class MessageFrame(TypedDict):
    type: Literal["message"]
    message: MessageData


class QueuedFrame(TypedDict):
    type: Literal["queued"]
    message: int
    position: int


class StartedFrame(TypedDict):
    type: Literal["started"]
    message: int
    prompt_tokens: int


class DeltaFrame(TypedDict):
    """Answer text; offset counts the code points of the message's text before it."""

    type: Literal["delta"]
    message: int
    offset: int
    text: str


class ThinkingFrame(TypedDict):
    """Thinking text; offset counts the code points of the message's thinking before it."""

    type: Literal["thinking"]
    message: int
    offset: int
    text: str


class DoneFrame(TypedDict):
    type: Literal["done"]
    message: MessageData


class ErrorFrame(TypedDict):
    type: Literal["error"]
    message: int | None
    code: str
    detail: str
    field: NotRequired[str]  # the client frame's field that was refused
    ref: NotRequired[str]  # names the log line with the internal detail (also at detail's end)


class TitleFrame(TypedDict):
    type: Literal["title"]
    conversation: int
    title: str


ServerFrame = Union[ConversationFrame, SnapshotFrame, MessageFrame, QueuedFrame, StartedFrame, DeltaFrame,
                    ThinkingFrame, DoneFrame, ErrorFrame, TitleFrame]
FRAMES: tuple[type, ...] = typing.get_args(ServerFrame)
# Nested shapes the front end declares by hand (api.ts, used for HTTP too): referenced by name.
TS_NAMES: dict[type, str] = {MessageData: "Message", ConversationData: "Conversation"}


def conversation(conv: ConversationData) -> ConversationFrame:
    return {"type": "conversation", "conversation": conv}


def snapshot(conversation_id: int, messages: list[MessageData]) -> SnapshotFrame:
    return {"type": "snapshot", "conversation": conversation_id, "messages": messages}


def message(msg: MessageData) -> MessageFrame:
    return {"type": "message", "message": msg}


def queued(message_id: int, position: int) -> QueuedFrame:
    return {"type": "queued", "message": message_id, "position": position}


def started(message_id: int, prompt_tokens: int) -> StartedFrame:
    return {"type": "started", "message": message_id, "prompt_tokens": prompt_tokens}


def delta(message_id: int, offset: int, text: str) -> DeltaFrame:
    return {"type": "delta", "message": message_id, "offset": offset, "text": text}


def thinking(message_id: int, offset: int, text: str) -> ThinkingFrame:
    return {"type": "thinking", "message": message_id, "offset": offset, "text": text}


def done(msg: MessageData) -> DoneFrame:
    return {"type": "done", "message": msg}


def error(message_id: int | None, code: str, detail: str, field: str | None = None,
          ref: str | None = None) -> ErrorFrame:
    frame: ErrorFrame = {"type": "error", "message": message_id, "code": code, "detail": detail}
    if field:
        frame["field"] = field
    if ref:
        frame["ref"] = ref
    return frame


def title(conversation_id: int, text: str) -> TitleFrame:
    return {"type": "title", "conversation": conversation_id, "title": text}


# --- the declarations as data: TypeScript, and a runtime check for tests -------------------------

def frame_type(cls: type) -> str:
    """The `type` literal of a frame TypedDict."""
    return str(typing.get_args(typing.get_type_hints(cls)["type"])[0])


def _fields(cls: type) -> list[tuple[str, Any, bool]]:
    """(name, annotation, required) of a TypedDict, in declaration order."""
    hints = typing.get_type_hints(cls)
    required: frozenset[str] = getattr(cls, "__required_keys__")
    return [(name, hints[name], name in required) for name in cls.__annotations__]


def _ts(annotation: Any) -> str:
    if annotation in TS_NAMES:
        return TS_NAMES[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is int or annotation is float:
        return "number"
    if annotation is str:
        return "string"
    if annotation is bool:
        return "boolean"
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "unknown"
    if origin is Literal:
        return " | ".join(f'"{a}"' for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(_ts(a) for a in args)
    if origin is list:
        inner = _ts(args[0])
        return f"({inner})[]" if "|" in inner else f"{inner}[]"
    if origin is dict:
        return f"Record<{_ts(args[0])}, {_ts(args[1])}>"
    raise TypeError(f"no TypeScript spelling for {annotation!r}")


def typescript() -> str:
    """frontend/src/server_events.ts: the ServerEvent union, one member per frame."""
    names = sorted(set(TS_NAMES.values()))
    lines = [
        "// Generated from chat/server_frames.py by `python manage.py chat_frames_ts`: do not edit by hand",
        "// (tests/web/test_chat_frames.py fails while this file differs from what the server declares).",
        f'import type {{ {", ".join(names)} }} from "./api";',
        "",
        "export type ServerEvent =",
    ]
    for cls in FRAMES:
        members = "; ".join(f"{name}{'' if req else '?'}: {_ts(ann)}" for name, ann, req in _fields(cls))
        lines.append(f"  | {{ {members} }}")
    lines[-1] += ";"
    return "\n".join(lines) + "\n"


def _value_problems(value: object, annotation: Any, where: str) -> list[str]:
    if annotation in TS_NAMES or typing.is_typeddict(annotation):
        return _dict_problems(value, annotation, where)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return []
    if origin in (Union, types.UnionType):
        options = [_value_problems(value, a, where) for a in args]
        return [] if any(not o for o in options) else [f"{where}: {value!r} is none of {_ts(annotation)}"]
    if origin is Literal:
        return [] if value in args else [f"{where}: {value!r} is not {_ts(annotation)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {value!r} is not a list"]
        return [p for i, v in enumerate(value) for p in _value_problems(v, args[0], f"{where}[{i}]")]
    if origin is dict:
        return [] if isinstance(value, dict) else [f"{where}: {value!r} is not an object"]
    if annotation is type(None):
        return [] if value is None else [f"{where}: {value!r} is not null"]
    if annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, annotation)
    return [] if ok else [f"{where}: {value!r} is not {_ts(annotation)}"]


def _dict_problems(value: object, cls: type, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: {value!r} is not an object"]
    fields = _fields(cls)
    out = [f"{where}.{k}: not declared" for k in value if k not in {n for n, _, _ in fields}]
    for name, ann, req in fields:
        if name in value:
            out += _value_problems(value[name], ann, f"{where}.{name}")
        elif req:
            out.append(f"{where}.{name}: missing")
    return out


def problems(frame: object) -> list[str]:
    """What makes `frame` differ from its declaration (empty: it conforms); for tests."""
    kind = frame.get("type") if isinstance(frame, dict) else None
    cls = next((c for c in FRAMES if frame_type(c) == kind), None)
    if cls is None:
        return [f"unknown frame type {kind!r}"]
    return _dict_problems(frame, cls, str(kind))
