"""Chat writes and reads (sync, ORM). The async token relay lives in chat/relay.py.

Every function that starts a turn commits the user message and the empty assistant message
(status streaming) before it returns, so the caller publishes only committed state and a
reload at any moment shows what the database has.
"""
import array
import base64
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from chat.models import SYSTEM_PROMPT_CHARS, Conversation, Message
from chat.server_frames import MessageData
from chat.tasks import title_conversation
from chat.text import fallback_title, storable
from colibri_base.socket_access import socket_access_valid
from engine_bridge import toolsyntax
from engine_bridge.reasoning import mode_for
from engine_bridge.request import NUL_REFUSAL, encodable, has_nul
from engine_bridge.served import ServedModel, served_model_get, served_models_get

log = logging.getLogger(__name__)

# A streaming message not saved for this long belongs to a relay that died with its process
# (the live relay saves at least every RELAY_SAVE_EVERY_S while text flows, and on every event).
STALE_STREAMING = timedelta(seconds=90)


class ChatError(Exception):
    """A refused chat action; code and detail go to the client's `error` frame."""

    def __init__(self, code: str, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.code, self.detail, self.field = code, detail, field


@dataclass
class Turn:
    conversation: Conversation
    assistant: Message
    prompt: str
    new_messages: list[Message]  # messages created/changed by this action, for the `message` frames
    created_conversation: bool = False
    deleted: list[int] = field(default_factory=list)  # message ids removed (regenerate/edit)
    model: str | None = None  # the served model id the turn goes to (GenerationRequest.model)
    routes: bool = False  # that model's engine reports routing (engine_bridge.served `extensions`)
    # The model's reasoning format (engine_bridge.reasoning.mode_for of its template: "think",
    # "harmony" or None): set, the bridge sends its thinking as `reasoning` events, apart from the answer.
    reasoning: str | None = None


def access_valid(user_id: int, session_key: str | None) -> bool:
    """Whether a chat socket authenticated at connect may still act: its user is active and its
    session exists unexpired (colibri_base.socket_access, read from the database every time: a
    queryset update() or a session's expiry or deletion sends no signal; issue 24)."""
    return socket_access_valid(user_id, session_key)


def conversation_for(user: User, conversation_id: int, *, lock: bool = False) -> Conversation:
    """The user's conversation or ChatError not_found (also for other users' ids: no oracle)."""
    qs = Conversation.objects.filter(owner=user, pk=conversation_id)
    if lock:
        qs = qs.select_for_update()
    conv = qs.first()
    if conv is None:
        raise ChatError("not_found", f"conversation {conversation_id} not found", "conversation")
    return conv


def conversation_search(user: User, q: str = "") -> QuerySet[Conversation]:
    qs = Conversation.objects.filter(owner=user)
    if q:
        qs = qs.filter(title__icontains=q)
    return qs.order_by("-updated")


def conversation_rename(user: User, conversation_id: int, title: str) -> Conversation:
    conv = conversation_for(user, conversation_id)
    conv.title = title[:200]
    conv.save(update_fields=["title", "updated"])
    return conv


def model_choice(name: str) -> str:
    """A conversation's model as stored: "" (the default) or the id of a model a live bridge
    serves now (any of its names accepted); ChatError unknown_model naming the field otherwise."""
    if name == "":
        return ""
    served = served_model_get(name)
    if served is None or name not in served.aliases:
        ids = ", ".join(m.id for m in served_models_get()) or "none while no engine runs"
        raise ChatError("unknown_model", f"the model {name[:80]!r} is not served here (served: {ids})", "model")
    return served.id


def system_prompt_check(text: str) -> str:
    """A conversation's system prompt as stored, or ChatError bad_system_prompt naming the field."""
    if len(text) > SYSTEM_PROMPT_CHARS:
        raise ChatError("bad_system_prompt", f"system_prompt is longer than {SYSTEM_PROMPT_CHARS} characters",
                        "system_prompt")
    if has_nul(text):
        raise ChatError("bad_system_prompt", f"system_prompt {NUL_REFUSAL}", "system_prompt")
    if not encodable(text):
        raise ChatError("bad_system_prompt", "system_prompt is not valid Unicode (it contains a lone surrogate)",
                        "system_prompt")
    return text


def conversation_configure(conv: Conversation, *, model: str | None = None,
                           system_prompt: str | None = None) -> Conversation:
    """Sets the conversation's model and / or system prompt (None: unchanged), checked first, so a
    refused value changes nothing; the next turn renders with them."""
    fields = []
    if model is not None:
        conv.model = model_choice(model)
        fields.append("model")
    if system_prompt is not None:
        conv.system_prompt = system_prompt_check(system_prompt)
        fields.append("system_prompt")
    if fields:
        conv.save(update_fields=[*fields, "updated"])
    return conv


def conversation_snapshot(user: User, conversation_id: int) -> tuple[Conversation, list[MessageData]]:
    conv = conversation_for(user, conversation_id)
    expire_stale_streaming(conv)
    return conv, [m.as_dict() for m in conv.messages.all()]


LOST_ERROR = "generation lost (server restarted)"
ORPHAN_MIN_AGE = timedelta(seconds=5)  # younger streaming rows are never swept (a turn just begun)


def expire_stale_streaming(conv: Conversation) -> None:
    """A fallback at open for rows the sweep cannot judge (Redis out): streaming rows unsaved for
    STALE_STREAMING. The sweep (messages_interrupt_orphans) is what normally ends them."""
    cutoff = timezone.now() - STALE_STREAMING
    for msg in conv.messages.filter(status=Message.Status.STREAMING, updated__lt=cutoff):
        _interrupt(msg)


def _interrupt(msg: Message, recovered: tuple[str, str] | None = None) -> None:
    """Marks a cut-off reply: `interrupted` with its partial text kept (`error` when it has none);
    `recovered`: its (answer, thinking) as its readers received them (chat.relay.recovered_text),
    when they are longer than the row's."""
    if recovered is not None:
        msg.text, msg.thinking = storable(recovered[0]), storable(recovered[1])
    msg.status = Message.Status.INTERRUPTED if msg.text or msg.thinking else Message.Status.ERROR
    msg.stats = {**msg.stats, "error": LOST_ERROR}
    msg.save(update_fields=["text", "thinking", "status", "stats", "updated"])


def messages_interrupt_orphans(owners_alive: Callable[[set[str]], dict[str, bool]],
                               recover: Callable[[int, str, str, str], tuple[str, str]] | None = None
                               ) -> list[Message]:
    """Interrupts every streaming message whose relay is gone, whatever the crash: its
    web process (relay_owner) no longer renews its lease — `owners_alive(set of owners)` answers
    {owner: bool} and raises when it cannot tell, which sweeps nothing — or, for a row without an
    owner, it was not saved for STALE_STREAMING. Rows younger than ORPHAN_MIN_AGE are left alone
    (their relay may not have begun). `recover(pk, relay_owner, saved text, saved thinking)`: the
    (text, thinking) its readers received, when the row's were saved before the end
    (chat.relay.recovered_text). Returns the messages it ended, as stored."""
    now = timezone.now()
    rows = list(Message.objects.filter(status=Message.Status.STREAMING, updated__lt=now - ORPHAN_MIN_AGE)
                .values_list("pk", "relay_owner", "updated"))
    if not rows:
        return []
    alive = owners_alive({owner for _, owner, _ in rows if owner})
    orphans = [pk for pk, owner, updated in rows
               if (not alive.get(owner, False) if owner else updated < now - STALE_STREAMING)]
    ended: list[Message] = []
    for pk in orphans:
        with transaction.atomic():
            msg = Message.objects.select_for_update().filter(pk=pk, status=Message.Status.STREAMING).first()
            if msg is not None:  # its relay may have finished it meanwhile
                _interrupt(msg, recover(pk, msg.relay_owner, msg.text, msg.thinking) if recover else None)
                ended.append(msg)
    return ended


def _ensure_idle(conv: Conversation) -> None:
    expire_stale_streaming(conv)
    if conv.messages.filter(status=Message.Status.STREAMING).exists():
        raise ChatError("busy", "a reply is still being generated; stop it first", "conversation")


def prompt_messages(conv: Conversation, *, before_id: int | None = None) -> list[dict[str, Any]]:
    """The history as template messages. Assistant text goes back exactly as emitted (partial
    text of interrupted replies included); failed replies with no text are left out. Tool calls
    and results (imported API conversations) take engine_bridge.toolsyntax's neutral form:
    assistant "tool_calls": [{"id", "name", "arguments"}], {"role": "tool", "tool_call_id",
    "name", "content"}; a template that knows no tools shows the results' text only. A reasoning
    model's thinking (Message.thinking) never goes back: the answer text only."""
    qs = conv.messages.all()
    names: dict[str, str] = {}  # call id -> function name, for the results
    if before_id is not None:
        qs = qs.filter(pk__lt=before_id)
    out: list[dict[str, Any]] = []
    for m in qs:
        if m.role == Message.Role.ASSISTANT and m.status in (Message.Status.ERROR, Message.Status.STREAMING) and not m.text:
            continue
        if m.role == Message.Role.TOOL:
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "name": names.get(m.tool_call_id, ""),
                        "content": m.text})
        elif m.tool_calls:
            for c in m.tool_calls:
                names[c["id"]] = c["name"]
            out.append({"role": m.role, "content": m.text, "tool_calls": [
                {"id": c["id"], "name": c["name"], "arguments": _arguments(c["arguments"])} for c in m.tool_calls]})
        else:
            out.append({"role": m.role, "content": m.text})
    return out


def _arguments(text: str) -> dict | str:
    """A stored call's arguments for the template: the object its JSON text holds, or the text
    itself when it is not a JSON object (a model may have written anything)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def conversation_served(conv: Conversation) -> ServedModel:
    """The ServedModel the conversation's turns go to: its chosen model, or the default one.
    ChatError model_unavailable when no live bridge serves the chosen model any more."""
    served = served_model_get(conv.model or None)
    if served is None:
        raise ChatError("model_unavailable", f"the model {conv.model!r} of this conversation is not served now; "
                        "choose another one in the model picker", "model")
    return served


def with_system_prompt(system_prompt: str, messages: list[dict]) -> list[dict]:
    """The history with the conversation's system prompt first: its own system message, or joined
    to a leading one (an imported conversation's), since many templates take only one, first."""
    if not system_prompt:
        return messages
    if messages and messages[0]["role"] == Message.Role.SYSTEM:
        return [{**messages[0], "content": f"{system_prompt}\n\n{messages[0]['content']}"}, *messages[1:]]
    return [{"role": Message.Role.SYSTEM, "content": system_prompt}, *messages]


def _render(messages: list[dict], served: ServedModel) -> str:
    """The history in the served model's own tool syntax (engine_bridge.toolsyntax: native
    tool_calls / tool turns for a template that reads them, the generic JSON form otherwise),
    then its chat template. A history without tool messages renders as plain messages."""
    return toolsyntax.render(messages, (), served)


def _start_assistant(conv: Conversation, new_messages: list[Message], owner: str = "", **turn_kw: Any) -> Turn:
    served = conversation_served(conv)  # before any write: a refusal leaves the turn undone
    conv.save(update_fields=["updated"])
    assistant = Message.objects.create(conversation=conv, role=Message.Role.ASSISTANT, text="",
                                       status=Message.Status.STREAMING, relay_owner=owner)
    history = with_system_prompt(conv.system_prompt, prompt_messages(conv, before_id=assistant.pk))
    prompt = _render(history, served)
    return Turn(conversation=conv, assistant=assistant, prompt=prompt, new_messages=new_messages + [assistant],
                model=served.id, routes=served.extensions, reasoning=mode_for(served.template), **turn_kw)


def turn_send(user: User, conversation_id: int | None, text: str, owner: str = "", *, model: str | None = None,
              system_prompt: str | None = None) -> Turn:
    """A user message and the reply's start. `model` / `system_prompt` (None: unchanged) set the
    conversation's own first: a New chat is created with the picker's choice."""
    with transaction.atomic():
        created = conversation_id is None
        if conversation_id is None:
            conv = Conversation(owner=user, title=fallback_title(text))
            conv.model = model_choice(model) if model is not None else ""
            conv.system_prompt = system_prompt_check(system_prompt) if system_prompt is not None else ""
            conv.save()
        else:
            conv = conversation_for(user, conversation_id, lock=True)
            _ensure_idle(conv)
            conversation_configure(conv, model=model, system_prompt=system_prompt)
        user_msg = Message.objects.create(conversation=conv, role=Message.Role.USER, text=text)
        return _start_assistant(conv, [user_msg], owner, created_conversation=created)


def turn_regenerate(user: User, conversation_id: int, owner: str = "") -> Turn:
    with transaction.atomic():
        conv = conversation_for(user, conversation_id, lock=True)
        _ensure_idle(conv)
        last = conv.messages.order_by("-id").first()
        if last is None:
            raise ChatError("empty", "nothing to regenerate", "conversation")
        deleted: list[int] = []
        if last.role == Message.Role.ASSISTANT:
            deleted.append(last.pk)
            last.delete()
        return _start_assistant(conv, [], owner, deleted=deleted)


def turn_edit(user: User, conversation_id: int, message_id: int, text: str, owner: str = "") -> Turn:
    with transaction.atomic():
        conv = conversation_for(user, conversation_id, lock=True)
        _ensure_idle(conv)
        msg = conv.messages.filter(pk=message_id, role=Message.Role.USER).first()
        if msg is None:
            raise ChatError("not_found", f"user message {message_id} not found in this conversation", "message")
        later = conv.messages.filter(pk__gt=msg.pk)
        deleted = list(later.values_list("pk", flat=True))
        later.delete()
        msg.text = text
        msg.save(update_fields=["text", "updated"])
        return _start_assistant(conv, [msg], owner, deleted=deleted)


def message_save_partial(message_id: int, text: str, *, thinking: str = "") -> None:
    Message.objects.filter(pk=message_id, status=Message.Status.STREAMING).update(
        text=storable(text), thinking=storable(thinking), updated=timezone.now())


def message_finish(message_id: int, *, text: str, status: str, stats: dict[str, Any],
                   routing: dict | None = None, thinking: str = "") -> Message | None:
    """Stores the final state of an assistant message; returns it (None if it was deleted).
    `thinking`: a reasoning model's thinking, kept apart from the answer `text`.
    `routing`: which experts answered it, the bridge's done.routing ({"rows", "cols", "counts":
    [[row, expert, n], ...]}), or None; stored packed (routing_pack)."""
    with transaction.atomic():
        msg = Message.objects.select_for_update().filter(pk=message_id).first()
        if msg is None:
            return None
        msg.text, msg.status, msg.stats, msg.routing = storable(text), status, stats, routing_pack(routing)
        msg.thinking = storable(thinking)
        msg.save(update_fields=["text", "thinking", "status", "stats", "routing", "updated"])
        if status == Message.Status.COMPLETE and _is_first_exchange(msg.conversation_id):
            _enqueue_title(msg.conversation_id)
    return msg


def conversation_set_slot(conversation_id: int, slot: int | None) -> None:
    Conversation.objects.filter(pk=conversation_id).update(kv_slot=slot)


def _is_first_exchange(conversation_id: int) -> bool:
    roles = list(Message.objects.filter(conversation_id=conversation_id).values_list("role", flat=True)[:3])
    return roles == [Message.Role.USER, Message.Role.ASSISTANT]


def _enqueue_title(conversation_id: int) -> None:
    if not getattr(settings, "CHAT_AUTO_TITLE", True):
        return
    # robust: a broker outage must not fail the turn (titles are cosmetic; the fallback stays).
    transaction.on_commit(lambda: title_conversation.delay(conversation_id), robust=True)


ROUTING_PHASES = ("prompt", "thinking", "answer")  # engine_bridge.route_phases, in turn order


def _pack_cells(triples: list, rows: int, cols: int) -> dict[str, Any]:
    """[row, expert, n] triples -> every cell's count, row-major, little-endian u16 (u32 when a
    count needs it) in base64, with the totals."""
    dense = [0] * (rows * cols)
    for row, expert, n in triples:
        if not (0 <= int(row) < rows and 0 <= int(expert) < cols):
            raise ValueError(f"routing cell {row}:{expert} outside {rows} x {cols}")
        dense[int(row) * cols + int(expert)] += int(n)
    dtype = "u16" if max(dense, default=0) < 1 << 16 else "u32"
    cells = array.array("H" if dtype == "u16" else "I", dense)
    if sys.byteorder == "big":
        cells.byteswap()
    return {"experts": sum(1 for n in dense if n), "selections": sum(dense),
            "dtype": dtype, "counts_b64": base64.b64encode(cells.tobytes()).decode("ascii")}


def _unpack_cells(packed: dict[str, Any], cols: int) -> list[list[int]]:
    cells = array.array("H" if packed["dtype"] == "u16" else "I")
    cells.frombytes(base64.b64decode(packed["counts_b64"]))
    if sys.byteorder == "big":
        cells.byteswap()
    return [[i // cols, i % cols, n] for i, n in enumerate(cells) if n]


def routing_pack(routing: object) -> dict[str, Any] | None:
    """A request's routing as a message keeps it: every cell's count (_pack_cells), with rows,
    cols and the totals; with the bridge's split by phase (done.routing.phases, see
    engine_bridge.route_phases) each phase the same way under "phases", with its positions.
    Measured on a synthetic GLM-5-size turn (78 x 256, ~700 positions at top-8): 53 KB of JSON,
    26 KB stored by PostgreSQL, where the [row, expert, n] triples take 281 KB and 103 KB; the
    default model's 30 x 16: 1.4 KB (triples 6.8 KB). Phases add at most one such array each.
    None stays None."""
    if not isinstance(routing, dict) or not routing.get("counts"):
        return None
    rows, cols = int(routing["rows"]), int(routing["cols"])
    packed = {"rows": rows, "cols": cols, **_pack_cells(routing["counts"], rows, cols)}
    phases, positions = routing.get("phases"), routing.get("positions") or {}
    if isinstance(phases, dict):
        try:
            packed["phases"] = {name: {**_pack_cells(phases[name], rows, cols), "positions": int(positions[name])}
                                for name in ROUTING_PHASES if name in phases}
        except (ValueError, TypeError, KeyError) as exc:  # the whole-turn counts are still worth keeping
            log.warning("routing phases not kept: %r", exc)
    return packed


def routing_unpack(packed: dict[str, Any]) -> list[list[int]]:
    """routing_pack's inverse: the nonzero [row, expert, n] triples, by row then expert."""
    return _unpack_cells(packed, packed["cols"])


def routing_phases_unpack(packed: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The packed phases as {phase: {"counts": triples, "experts", "selections", "positions"}},
    in turn order; None when the message's routing has no split (an engine without routes=2)."""
    phases = packed.get("phases")
    if not isinstance(phases, dict):
        return None
    # in turn order: PostgreSQL's jsonb keeps an object's keys in an order of its own
    return {name: {"counts": _unpack_cells(ph, packed["cols"]), "experts": ph["experts"],
                   "selections": ph["selections"], "positions": ph.get("positions", 0)}
            for name in ROUTING_PHASES if isinstance(ph := phases.get(name), dict)}


def message_routing(message_id: int) -> dict[str, Any] | None:
    """Which experts answered an assistant message: {"message", "conversation", "role", "rows",
    "cols", "counts": [[row, expert, selections], ...], "experts", "selections", "io"}; None when
    the message does not exist, counts None when no routing was recorded for it; io = its turn's
    expert I/O (stats.io, the engine's IOSTAT figures) or None; phases = the counts split into
    prompt / thinking / answer (routing_phases_unpack) or None."""
    msg = Message.objects.filter(pk=message_id).only("id", "conversation_id", "role", "routing", "stats").first()
    if msg is None:
        return None
    packed = msg.routing or {}
    counts = routing_unpack(packed) if packed.get("counts_b64") else None
    return {
        "message": msg.pk, "conversation": msg.conversation_id, "role": msg.role,
        "rows": packed.get("rows"), "cols": packed.get("cols"), "counts": counts,
        "experts": packed.get("experts", 0), "selections": packed.get("selections", 0),
        "io": (msg.stats or {}).get("io"),
        "phases": routing_phases_unpack(packed) if packed.get("counts_b64") else None,
    }
