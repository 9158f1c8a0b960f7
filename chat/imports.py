"""Import of an API conversation into the chat page (issue 25 item 7): the `messages` of an OpenAI
Chat Completions request, optionally followed by the reply's message, become one conversation.

Accepted, as the OpenAI wire has them: system / developer (stored as system), user and assistant
turns whose content is a string, null or a list of text parts; an assistant turn's `tool_calls`
({id, type "function", function {name, arguments: JSON text}}); `tool` turns with the
`tool_call_id` of an earlier call and the result as content; an assistant turn's
`reasoning_content` (the thinking of a reasoning model, as this site's Chat answers carry it, and
llama-server's and DeepSeek's), kept as the message's thinking. Everything else — another part type,
an unknown role, a result for no earlier call, NUL characters — is refused with ImportRefused
naming the field (`messages[3].tool_calls[0].function.name`), before anything is written: an import
is all or nothing.
"""
from django.contrib.auth.models import User
from django.db import transaction

from chat.models import Conversation, Message
from chat.text import fallback_title
from engine_bridge.request import NUL_REFUSAL, has_nul

MAX_MESSAGES = 2000
MAX_CALLS = 128  # per assistant turn
MAX_ID = 128  # Message.tool_call_id's width
ROLES = {"system": Message.Role.SYSTEM, "developer": Message.Role.SYSTEM, "user": Message.Role.USER,
         "assistant": Message.Role.ASSISTANT, "tool": Message.Role.TOOL}


class ImportRefused(ValueError):
    """Bad input: `field` is the JSON path of the offending value, `detail` says what is wrong."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field, self.detail = field, detail


def _text(value: str, field: str) -> str:
    if has_nul(value):
        raise ImportRefused(field, NUL_REFUSAL)
    return value


def _content(value: object, field: str, *, nullable: bool) -> str:
    """A message's content as one string: a string, a list of text parts (joined), or null where
    the wire allows it (an assistant turn that only calls tools)."""
    if value is None and nullable:
        return ""
    if isinstance(value, str):
        return _text(value, field)
    if isinstance(value, list):
        parts: list[str] = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ImportRefused(f"{field}[{i}]", 'only text parts ({"type": "text", "text": ...}) can be imported')
            parts.append(_text(part["text"], f"{field}[{i}].text"))
        return "".join(parts)
    raise ImportRefused(field, "must be a string or a list of text parts" + (" or null" if nullable else ""))


def _calls(value: object, field: str, seen: set[str]) -> list[dict]:
    if not isinstance(value, list) or not value or len(value) > MAX_CALLS:
        raise ImportRefused(field, f"must be a list of 1 to {MAX_CALLS} tool calls")
    calls: list[dict] = []
    for j, call in enumerate(value):
        at = f"{field}[{j}]"
        if not isinstance(call, dict):
            raise ImportRefused(at, "must be an object")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id or len(call_id) > MAX_ID:
            raise ImportRefused(f"{at}.id", f"must be a non-empty string of at most {MAX_ID} characters")
        if call_id in seen:
            raise ImportRefused(f"{at}.id", f"{call_id!r} is used by an earlier call")
        if call.get("type", "function") != "function":
            raise ImportRefused(f"{at}.type", 'must be "function"')
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise ImportRefused(f"{at}.function", "must be an object with name and arguments")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ImportRefused(f"{at}.function.name", "must be a non-empty string")
        if not isinstance(fn.get("arguments"), str):
            raise ImportRefused(f"{at}.function.arguments", "must be a string (the JSON text of the arguments)")
        seen.add(call_id)
        calls.append({"id": _text(call_id, f"{at}.id"), "name": _text(fn["name"], f"{at}.function.name"),
                      "arguments": _text(fn["arguments"], f"{at}.function.arguments")})
    return calls


def parse_messages(messages: object) -> list[Message]:
    """OpenAI Chat messages -> unsaved Message rows (no conversation yet), or ImportRefused."""
    if not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES:
        raise ImportRefused("messages", f"must be a list of 1 to {MAX_MESSAGES} messages")
    rows: list[Message] = []
    seen: set[str] = set()
    answered: set[str] = set()
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ImportRefused(at, "must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise ImportRefused(f"{at}.role", f"must be one of {', '.join(sorted(ROLES))}")
        calls: list[dict] = []
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise ImportRefused(f"{at}.tool_calls", "only an assistant message makes tool calls")
            calls = _calls(m["tool_calls"], f"{at}.tool_calls", seen)
        text = _content(m.get("content"), f"{at}.content", nullable=role == "assistant" and bool(calls))
        thinking = ""
        if m.get("reasoning_content") is not None:
            if role != "assistant":
                raise ImportRefused(f"{at}.reasoning_content", "only an assistant message has reasoning_content")
            if not isinstance(m["reasoning_content"], str):
                raise ImportRefused(f"{at}.reasoning_content", "must be a string or null")
            thinking = _text(m["reasoning_content"], f"{at}.reasoning_content")
        call_id = ""
        if role == "tool":
            named = m.get("tool_call_id")
            if not isinstance(named, str) or named not in seen:
                raise ImportRefused(f"{at}.tool_call_id", "must be the id of a tool call in an earlier assistant message")
            call_id = named
            if call_id in answered:
                raise ImportRefused(f"{at}.tool_call_id", f"{call_id!r} already has a result")
            answered.add(call_id)
        rows.append(Message(role=ROLES[role], text=text, thinking=thinking, tool_calls=calls, tool_call_id=call_id))
    return rows


def import_conversation(user: User, data: object) -> Conversation:
    """{"messages": [...], "title"?: str} (an OpenAI Chat request body, or any object with those
    keys) -> the user's new conversation, committed with all its messages; ImportRefused else."""
    if not isinstance(data, dict):
        raise ImportRefused("body", 'must be an object with "messages"')
    rows = parse_messages(data.get("messages"))
    title = data.get("title")
    if title is not None and not isinstance(title, str):
        raise ImportRefused("title", "must be a string")
    title = _text(title, "title").strip()[:200] if title else ""
    if not title:
        first = next((r.text for r in rows if r.role == Message.Role.USER and r.text.strip()), "")
        title = fallback_title(first) if first else "Imported conversation"
    with transaction.atomic():
        conv = Conversation.objects.create(owner=user, title=title)
        for r in rows:
            r.conversation = conv
        Message.objects.bulk_create(rows)  # ids ascend in list order: the conversation's order
    return conv
