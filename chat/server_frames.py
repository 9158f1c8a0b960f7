"""Every frame the server sends on /ws/chat/ (docs/contracts.md, "Chat websocket"), declared once.

The consumer, the relay, the orphan sweeper and the title task build frames only through the
functions here, so a field cannot be added on one path and forgotten on another; the TypedDicts
are what mypy checks those functions against. The front end's `ServerEvent` union
(frontend/src/server_events.ts) is generated from these declarations (`typescript()`, by
colibri_base.frames, written by `manage.py frames_ts`), and tests/web/test_chat_frames.py fails when
the file is stale, when a hand-written TS interface named in TS_NAMES lacks a key the server sends,
or when a frame a test receives does not conform (`problems`). client frames are chat/frames.py's.
"""
import typing
from typing import Any, Literal, NotRequired, TypedDict, Union

from colibri_base import frames


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


# --- the declarations as data (colibri_base.frames): TypeScript, and a runtime check for tests ---

FRAME_SET = frames.FrameSet(
    source="chat/server_frames.py", target="frontend/src/server_events.ts", test="tests/web/test_chat_frames.py",
    union="ServerEvent", frames=FRAMES, ts_names=TS_NAMES,
    ts_files={"Message": "frontend/src/api.ts", "Conversation": "frontend/src/api.ts"})
frame_type = frames.frame_type


def typescript() -> str:
    """frontend/src/server_events.ts: the ServerEvent union, one member per frame."""
    return FRAME_SET.typescript()


def problems(frame: object) -> list[str]:
    """What makes `frame` differ from its declaration (empty: it conforms); for tests."""
    return FRAME_SET.problems(frame)
