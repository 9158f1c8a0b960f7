"""Runs one assistant turn as an asyncio task in the Daphne process.

The task belongs to the conversation, not to a socket: closing the tab does not stop it. It
publishes to the group `conv-<id>`; any socket that sends `open` joins that group and gets a
snapshot from the database (saved every RELAY_SAVE_EVERY_S; the text since, in a tail log in
Redis that the orphan sweep reads if the process dies), then the live deltas. Stop sets
an event when the turn runs in this process and a short-lived cache flag for any other process;
the relay polls the flag rather than blocking in a channel-layer receive, because cancelling such
a receive can lose another channel's message in channels-redis.

Delivery: a frame goes straight to the sockets of this process that watch the conversation (one
Redis write between the engine's token and the screen: the tail log's), and through the group to sockets of
other processes; a socket drops a group copy that came from its own process (it has it already).
"""
import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Protocol, cast

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.cache import cache
from django.core.cache.backends.redis import RedisCache
from django.utils import timezone

from chat import server_frames, services
from chat.groups import group_for
from chat.models import Message
from colibri_base.cache import async_client
from colibri_base.layers import channel_layer

if TYPE_CHECKING:
    from engine_bridge.request import GenerationRequest

log = logging.getLogger(__name__)

RELAY_SAVE_EVERY_S = 0.5
STOP_POLL_S = 0.2
_running: dict[int, asyncio.Task] = {}  # conversation id -> relay task; also keeps tasks referenced
_stop_events: dict[int, asyncio.Event] = {}


def deployment_tag() -> str:
    """8 hex digits naming this deployment: its cache (Redis and key prefix), which holds the relay
    leases and tail logs. Web processes of one deployment share it; a process of another
    deployment on the same database (the live test stacks, each on its own Redis) has another."""
    cache_conf = settings.CACHES["default"]
    where = f"{cache_conf.get('LOCATION', '')}|{cache_conf.get('KEY_PREFIX', '')}"
    return hashlib.sha256(where.encode()).hexdigest()[:8]


# This process's relay owner id (Message.relay_owner, 32 characters): its deployment's tag, then
# a random part. It also tags group copies of frames this process delivered itself.
PROCESS = deployment_tag() + uuid.uuid4().hex[:24]


class LocalSocket(Protocol):
    """A chat socket of this process (chat.consumers.ChatConsumer)."""

    async def send_json(self, content: Any, close: bool = False) -> None: ...


EventQueue = asyncio.Queue[dict | None]  # a turn's engine events, then None
_local: dict[int, set[LocalSocket]] = {}  # conversation id -> sockets of this process watching it


def watch_locally(conversation_id: int, socket: LocalSocket) -> None:
    _local.setdefault(conversation_id, set()).add(socket)


def unwatch_locally(conversation_id: int, socket: LocalSocket) -> None:
    sockets = _local.get(conversation_id)
    if sockets is not None:
        sockets.discard(socket)
        if not sockets:
            del _local[conversation_id]


def _stop_key(conversation_id: int) -> str:
    return f"chat:stop:{conversation_id}"


GROUP_SEND_TIMEOUT_S = 0.5  # one group send's bound: a frozen Redis must not stall the turn
GROUP_DOWN_S = 1.0          # after a failed send, deltas skip the group this long
GROUP_RETRY_S = 30.0        # how long a frame other than a delta is retried for other processes
_group_down_until = 0.0
_retries: set = set()       # background re-sends of frames other processes must not miss


async def publish(conversation_id: int, frame: server_frames.ServerFrame) -> None:
    """Sends one client frame to every socket watching the conversation: this process's directly,
    the others' through the group. A Redis outage costs only the group copies (issue 24): a delta
    is dropped (the final `done` carries the whole text), any other frame is re-sent in the
    background with a backoff for GROUP_RETRY_S; the turn itself never waits for Redis here. A
    thinking delta is a delta."""
    global _group_down_until
    for socket in list(_local.get(conversation_id, ())):
        try:
            await socket.send_json(frame)
        except Exception:  # a socket closing under us: its disconnect unregisters it
            log.debug("local delivery to a closing socket failed", exc_info=True)
    message = {"type": "chat.frame", "frame": frame, "origin": PROCESS}
    is_delta = frame["type"] in ("delta", "thinking")
    if is_delta and time.monotonic() < _group_down_until:
        return
    try:
        await _group_send(conversation_id, message)
        return
    except Exception as exc:
        if time.monotonic() >= _group_down_until:
            log.warning("sending to group %s failed (%s); deltas skip the group for %gs", group_for(conversation_id),
                        exc, GROUP_DOWN_S)
        _group_down_until = time.monotonic() + GROUP_DOWN_S
    if not is_delta:
        task = asyncio.get_running_loop().create_task(_resend(conversation_id, message))
        _retries.add(task)
        task.add_done_callback(_retries.discard)


async def _group_send(conversation_id: int, message: dict[str, Any]) -> None:
    async with asyncio.timeout(GROUP_SEND_TIMEOUT_S):
        await channel_layer().group_send(group_for(conversation_id), message)


async def _resend(conversation_id: int, message: dict[str, Any]) -> None:
    delay, give_up = 0.2, time.monotonic() + GROUP_RETRY_S
    while time.monotonic() < give_up:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
        try:
            return await _group_send(conversation_id, message)
        except Exception:
            continue
    log.error("a %s frame for group %s was not delivered to other processes within %gs",
              message["frame"].get("type"), group_for(conversation_id), GROUP_RETRY_S)


def start(turn: services.Turn, params: dict) -> asyncio.Task:
    """Runs the turn's relay task. Its caller starts the orphan sweeper first (chat.sweeper:
    the lease that tells other processes this turn's relay lives), which imports this module."""
    conv_id = turn.conversation.pk
    request = _generation_request(conv_id, turn.prompt, params, routes=turn.routes, model=turn.model,
                                  reasoning=turn.reasoning)
    task = asyncio.create_task(_relay(conv_id, turn.assistant.pk, request), name=f"relay-conv-{conv_id}")
    _running[conv_id] = task
    task.add_done_callback(lambda t: _running.pop(conv_id, None) if _running.get(conv_id) is t else None)
    return task


async def request_stop(conversation_id: int) -> None:
    event = _stop_events.get(conversation_id)
    if event is not None:
        event.set()
        return
    try:  # the turn runs in another web process: it polls this flag
        await cache.aset(_stop_key(conversation_id), 1, timeout=60)
    except Exception as exc:
        ref = uuid.uuid4().hex[:8]
        log.warning("could not deliver the stop of conversation %s (ref %s): %s", conversation_id, ref, exc)
        raise services.ChatError("unavailable", f"the stop could not be delivered; try again in a moment (ref {ref})",
                                 "conversation") from None


def engine_reports_routes(model: object) -> bool:
    """Whether the engine in use takes routes=1 (our engine: it announces itself with a MODEL
    line). The real colibri binary sends none (telemetry then says extensions: false) and would
    refuse the key, so a chat turn there asks for no routing and its stats line stays plain.
    The rule is engine_bridge.served's `extensions`."""
    from engine_bridge.served import served_model_from

    return served_model_from({"model": model if isinstance(model, dict) else None}).extensions


def routing_summary(routing: object) -> dict | None:
    """The done event's routing ({"rows", "cols", "counts": [[row, expert, n], ...]}, see
    docs/contracts.md) when it names any expert, else None (services.message_finish packs it)."""
    if not isinstance(routing, dict) or not routing.get("counts") or not routing.get("cols"):
        return None
    return routing


def _generation_request(conv_id: int, prompt: str, params: dict[str, Any], routes: bool = False,
                        model: str | None = None, reasoning: str | None = None) -> "GenerationRequest":
    """The turn's job: `model` the conversation's served model (the bridge serving it takes the
    turn), `routes` whether its engine reports which experts answered (services.Turn.routes),
    `reasoning` its reasoning format (services.Turn.reasoning: thinking comes as `reasoning` events)."""
    from engine_bridge.request import GenerationRequest

    return GenerationRequest(
        model=model,
        prompt=prompt,
        max_tokens=params.get("max_tokens") or settings.DEFAULT_MAX_TOKENS,
        temperature=params.get("temperature"),  # absent: the served model's default (the bridge decides)
        top_p=params.get("top_p"),
        experts=params.get("experts"),
        conversation_key=f"conv:{conv_id}",
        priority="interactive",
        routes=routes,  # which experts answered: kept with the message, linked to the atlas
        reasoning=reasoning,
    )


async def _pump(request: "GenerationRequest", queue: EventQueue) -> None:
    """Feeds engine events into queue, then None. Cancelling this task leaves generate()
    early, whose cleanup sends gen.cancel to the bridge. A submit that found Redis out (an
    error with `broker`, before anything reached the bridge) is retried with a backoff for
    client.BROKER_OUTAGE_S, so a short outage delays the turn instead of failing it, as a stream
    already running rides it out (issue 24)."""
    from engine_bridge import client

    give_up, delay = time.monotonic() + client.BROKER_OUTAGE_S, 0.2
    try:
        while True:
            retry = False
            async with contextlib.aclosing(client.generate(request)) as events:
                async for event in events:
                    if event is None:  # only a stream with a tick yields None
                        continue
                    if event.get("broker") and time.monotonic() + delay < give_up:
                        retry = True
                        break
                    await queue.put(event)
            if not retry:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # bridge gap, layer failure: the user must see it (without its text)
        log.exception("generation stream failed")
        await queue.put({"kind": "error", "code": "ENGINE_ERROR", "message": f"{type(exc).__name__}: {exc}"})
    await queue.put(None)


async def _wait_stop(conversation_id: int, event: asyncio.Event) -> None:
    """Returns on this process's Stop, or another process's flag. A flag that cannot be read
    (Redis out or frozen) is no Stop: the turn goes on."""
    while True:
        try:
            await asyncio.wait_for(event.wait(), STOP_POLL_S)
            return
        except asyncio.TimeoutError:
            try:
                async with asyncio.timeout(1.0):
                    if await cache.aget(_stop_key(conversation_id)):
                        return
            except Exception:
                log.debug("reading the stop flag of conversation %s failed", conversation_id, exc_info=True)


async def _reap(*tasks: asyncio.Task) -> None:
    """Cancels the tasks until they have ended. One cancel is not enough on Python 3.11: its
    asyncio.wait_for swallows a cancellation that arrives as the inner future completes
    (CPython gh-86296), and the bridge client's wait_for(inbox.get()) completes constantly while
    a fast engine streams, so a Stop could wait for the whole turn to finish."""
    while pending := [t for t in tasks if not t.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=0.1)
    await asyncio.gather(*tasks, return_exceptions=True)


class _State:
    def __init__(self) -> None:
        self.text = ""
        self.thinking = ""  # the bridge's `reasoning` events: kept apart from the answer
        self.thinking_from: float | None = None  # monotonic time of the first thinking text
        self.thinking_s: float | None = None  # from the first thinking text to the first answer text
        self.stats: dict[str, Any] = {}
        self.error: dict | None = None  # error event
        self.outcome: str | None = None  # complete / interrupted / error
        self.slot: int | None = None
        self.routing: dict | None = None  # the done event's routing summary (routing_summary)
        self.started = time.monotonic()


async def _relay(conv_id: int, msg_id: int, request: "GenerationRequest") -> None:
    try:  # an old flag of this conversation; Redis out: there is none to fear
        async with asyncio.timeout(1.0):
            await cache.adelete(_stop_key(conv_id))
    except Exception:
        log.warning("could not clear the stop flag of conversation %s", conv_id, exc_info=True)
    stop_event = _stop_events[conv_id] = asyncio.Event()
    queue: EventQueue = asyncio.Queue()
    state = _State()
    pump = asyncio.create_task(_pump(request, queue))
    stopper = asyncio.create_task(_wait_stop(conv_id, stop_event))
    try:
        await _consume(conv_id, msg_id, queue, stopper, state)
    except asyncio.CancelledError:
        state.outcome = "interrupted"  # process shutting down: keep what we have
        raise
    except Exception as exc:
        log.exception("relay failed")
        state.outcome, state.error = "error", {"code": "ENGINE_ERROR", "message": f"{type(exc).__name__}: {exc}"}
    finally:
        await _reap(pump, stopper)
        if _stop_events.get(conv_id) is stop_event:
            del _stop_events[conv_id]
        await asyncio.shield(_finish(conv_id, msg_id, state))


async def _consume(conv_id: int, msg_id: int, queue: EventQueue, stopper: asyncio.Task, state: _State) -> None:
    last_save = time.monotonic()
    saved_len = 0
    while state.outcome is None:
        getter = asyncio.ensure_future(queue.get())
        await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        # Stop wins even while events keep arriving (a fast engine keeps the queue non-empty);
        # text that reached us after the Stop is dropped, as the engine's own CANCEL does.
        if stopper.done():
            getter.cancel()
            state.outcome = "interrupted"
            return
        # Drain what is already queued (one bridge batch) and publish it as one delta.
        events = [getter.result()]
        while not queue.empty():
            events.append(queue.get_nowait())
        pending: list[str] = []
        pending_kind = "text"  # text (the answer) or reasoning (thinking): one frame per run of either
        for event in events:
            if event is None:
                state.outcome = "error"
                state.error = state.error or {"code": "ENGINE_ERROR", "message": "generation ended without a result"}
                break
            kind = event.get("kind")
            if kind in ("text", "reasoning"):
                if pending and kind != pending_kind:
                    await _publish_delta(conv_id, msg_id, state, pending_kind, pending)
                    pending = []
                pending_kind = kind
                pending.append(event["text"])
                continue
            if pending:  # keep frames in engine order
                await _publish_delta(conv_id, msg_id, state, pending_kind, pending)
                pending = []
            await _handle(conv_id, msg_id, event, state)
            if state.outcome:
                break
        if pending:
            await _publish_delta(conv_id, msg_id, state, pending_kind, pending)
        now = time.monotonic()
        size = len(state.text) + len(state.thinking)
        if state.outcome is None and size != saved_len and now - last_save >= RELAY_SAVE_EVERY_S:
            await database_sync_to_async(services.message_save_partial)(msg_id, state.text, thinking=state.thinking)
            last_save, saved_len = now, size
            # The log is not emptied here: a DELETE that Redis runs after a later RPUSH (two
            # connections, served out of order on a loaded host once the DELETE's 0.25 s bound
            # passed) wiped text a reader already had. It is dropped once the final row is stored.


async def _publish_delta(conv_id: int, msg_id: int, state: _State, kind: str, pieces: list[str]) -> None:
    """One `delta` (answer) or `thinking` frame; offset counts the Unicode code points of the
    message's text, or thinking, before it."""
    text = "".join(pieces)
    thinking = kind == "reasoning"
    offset = len(state.thinking if thinking else state.text)
    if thinking:
        state.thinking += text
        if state.thinking_from is None:
            state.thinking_from = time.monotonic()
    else:
        state.text += text
        if state.thinking_from is not None and state.thinking_s is None:
            state.thinking_s = round(time.monotonic() - state.thinking_from, 3)
    # before any socket has it, what a reader will see is kept: in the tail log, or, when that
    # write failed (Redis slow on a loaded host: 0.25 s passed; a gap in the log ends the sweep's
    # recovery there), in the row itself
    if not await _log_tail(msg_id, offset, text, THINKING if thinking else ANSWER):
        await database_sync_to_async(services.message_save_partial)(msg_id, state.text, thinking=state.thinking)
    frame = server_frames.thinking if thinking else server_frames.delta
    await publish(conv_id, frame(msg_id, offset, text))


async def _handle(conv_id: int, msg_id: int, event: dict, state: _State) -> None:
    kind = event.get("kind")
    if kind == "routed":  # the engine host that takes the turn, kept with the reply's stats
        state.stats["bridge"] = event.get("bridge")
    elif kind == "queued":
        await publish(conv_id, server_frames.queued(msg_id, event["position"]))
    elif kind == "accepted":
        state.stats["prompt_tokens"] = event.get("prompt_tokens")
        state.slot = event.get("slot")  # stored with the final message: no database write before the first token
        await publish(conv_id, server_frames.started(msg_id, event["prompt_tokens"]))
    elif kind == "done":
        usage, stats = event.get("usage") or {}, event.get("stats") or {}
        state.stats.update(
            prompt_tokens=usage.get("prompt_tokens", state.stats.get("prompt_tokens")),
            completion_tokens=usage.get("completion_tokens"),
            ttft_s=stats.get("ttft_s"),
            first_token_at=stats.get("first_token_at"),
            tok_s=stats.get("tok_s"),
            hit_pct=stats.get("hit_pct"),
            finish_reason=event.get("finish_reason"),
            reasoning_tokens=event.get("reasoning_tokens") or None,  # of completion_tokens; 0: none
            thinking_s=state.thinking_s,
        )
        if event.get("io"):  # the turn's expert I/O (our engine's IOSTAT), shown with its routing
            state.stats["io"] = event["io"]
        state.routing = routing_summary(event.get("routing"))
        if state.routing is not None:
            state.stats["experts_routed"] = len(state.routing["counts"])  # distinct experts
        state.outcome = "complete"
    elif kind == "error":
        state.error = {"code": event.get("code", "ENGINE_ERROR"), "message": event.get("message", "")}
        state.outcome = "interrupted" if event.get("code") == "CANCELLED" else "error"
    # submitted, topk and unknown kinds: not shown in chat


ERROR_DETAIL = {
    "ENGINE_DIED": "The engine stopped while answering. The text so far is kept; try again.",
    "ENGINE_UNAVAILABLE": "The engine is not running right now. Try again in a moment.",
    "QUEUE_FULL": "The server is busy (queue full). Try again in a moment.",
    "CONTEXT_EXCEEDED": "This conversation is longer than the model's context window. Start a new chat or edit an earlier message.",
}


# The tail log: the text since the row's last save survives the web process. Each delta is
# appended to a Redis list (one [offset, text] per delta) before any socket gets it, the list lives
# until the final row is stored (or TAIL_TTL_S), and the sweep of a reply whose process died
# extends the row's text with it (recovered_text), skipping the pieces the row already holds. So
# a swept reply holds all a reader received, and beyond it at most the one delta being delivered
# when the process died (it was logged, not yet on the wire).
# The thinking of a reasoning model is logged beside the answer, tagged, and recovered the same way.
# While Redis fails the log is skipped for GROUP_DOWN_S at a time, the turn never waits on it
# (TAIL_TIMEOUT_S bounds one write), and the loss falls back to RELAY_SAVE_EVERY_S of text: a
# piece after a gap is never applied.
TAIL_TTL_S = 3600       # an unswept log outlives its last delta this long
TAIL_TIMEOUT_S = 0.25   # one write's bound: a frozen Redis must not stall the turn
_tail_down_until = 0.0


def tail_key(message_id: int, owner: str | None = None) -> str:
    """The log of one relay's message: its process (Message.relay_owner; None: this one, PROCESS
    as it is now) is in the key, so a log left by a process that died never meets a later message
    with the same id (a recreated database, as every test session's)."""
    return cache.make_key(f"chat:tail:{message_id}:{owner or PROCESS}")


ANSWER, THINKING = 0, 1  # a logged piece's stream: [offset, text] is the answer's, [offset, text, 1] the thinking's


async def _log_tail(message_id: int, offset: int, text: str, stream: int = ANSWER) -> bool:
    """Appends a delta of the answer or the thinking to the message's tail log; False when it may
    not be there (the write failed or timed out, or the log is skipped after a failure): the
    caller then saves the row itself."""
    global _tail_down_until
    client = async_client(cache)
    if client is None:
        return True  # a cache without Redis (tests' local memory): no log to keep
    if time.monotonic() < _tail_down_until:
        return False
    key = tail_key(message_id)
    try:
        async with asyncio.timeout(TAIL_TIMEOUT_S):
            pipe = client.pipeline(transaction=False)  # one round trip for both
            pipe.rpush(key, json.dumps([offset, text, THINKING] if stream == THINKING else [offset, text]))
            pipe.expire(key, TAIL_TTL_S)
            await pipe.execute()
        return True
    except Exception as exc:
        if time.monotonic() >= _tail_down_until:
            log.warning("the tail log of message %s failed (%s); skipped for %gs", message_id, exc, GROUP_DOWN_S)
        _tail_down_until = time.monotonic() + GROUP_DOWN_S
        return False


async def drop_tail(message_id: int, owner: str | None = None) -> None:
    client = async_client(cache)
    if client is None:
        return
    try:
        async with asyncio.timeout(TAIL_TIMEOUT_S):
            await client.delete(tail_key(message_id, owner))
    except Exception:  # it expires (TAIL_TTL_S); the sweep applies no piece the row already holds
        log.debug("dropping the tail log of message %s failed", message_id, exc_info=True)


def extended(text: str, pieces: list) -> str:
    """`text` (a reply's stored prefix) with the logged pieces ([offset, text], in log order) that
    reach past its end; stops at a gap (a piece not logged)."""
    for piece in pieces:
        offset, more = piece
        if offset > len(text):
            break
        if offset + len(more) > len(text):
            text = text[:offset] + more
    return text


def recovered_text(message_id: int, owner: str, saved: str, saved_thinking: str = "") -> tuple[str, str]:
    """What a reader of the cut-off reply received, (answer, thinking): its row's text and thinking
    extended by the tail log of its relay's process `owner` (the sweep calls this, in a thread);
    the row's own when Redis cannot say."""
    try:
        client = cast(RedisCache, cache)._cache.get_client(None, write=False)
        raw = cast(list[bytes], client.lrange(tail_key(message_id, owner), 0, -1))  # redis-py: `Awaitable | list`
        pieces = [json.loads(item) for item in raw]
    except Exception as exc:
        log.warning("the tail log of message %s could not be read (%s): its saved text stands", message_id, exc)
        return saved, saved_thinking
    answer = [piece[:2] for piece in pieces if len(piece) == 2]
    thinking = [piece[:2] for piece in pieces if len(piece) == 3 and piece[2] == THINKING]
    return extended(saved, answer), extended(saved_thinking, thinking)


SAVE_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 4.0)  # seconds: rides out a database restart or failover
SAVE_FAILED_DETAIL = ("This reply could not be saved (the database did not answer). It stays on this page "
                      "but will be missing after a reload: copy it if you need it.")
_UNSAVED = object()


async def _store_final(conv_id: int, msg_id: int, state: _State, status: str,
                       stats: dict[str, Any]) -> Message | None | object:
    """The stored final message, None if it was deleted meanwhile, or _UNSAVED when the database
    refused every attempt (storing is idempotent, so a retry after a half-done attempt is safe)."""
    for delay in (0.0, *SAVE_RETRY_DELAYS):
        await asyncio.sleep(delay)
        try:
            msg = await database_sync_to_async(services.message_finish)(
                msg_id, text=state.text, thinking=state.thinking, status=status, stats=stats, routing=state.routing)
            if state.slot is not None:
                await database_sync_to_async(services.conversation_set_slot)(conv_id, state.slot)
            return msg
        except Exception:
            log.exception("could not store the final message %s (retrying: %s)", msg_id, delay != SAVE_RETRY_DELAYS[-1])
    return _UNSAVED


async def _finish(conv_id: int, msg_id: int, state: _State) -> None:
    """Stores the final message, then (after commit) publishes `error` and `done`."""
    outcome = state.outcome or "interrupted"
    stats = {k: v for k, v in state.stats.items() if v is not None}
    detail = ref = None
    if outcome == "error":
        err = state.error or {}
        code = err.get("code") or "ENGINE_ERROR"
        # The user reads a fixed text and a reference; the detail (exception text, hosts, ports)
        # goes to the log under that reference (issue 24). BAD_REQUEST texts are the bridge's own.
        ref = uuid.uuid4().hex[:8]
        log.warning("turn of message %s ended with %s (ref %s): %s", msg_id, code, ref, err.get("message"))
        detail = ERROR_DETAIL.get(code) or (
            f"The engine refused this request: {err.get('message')}." if code == "BAD_REQUEST" and err.get("message")
            else "The engine failed while answering.")
        detail = f"{detail} (ref {ref})"
        stats["error"] = f"{code} (ref {ref})"
        # Partial text stays visible as an interrupted reply; the error note is in stats.
        status = Message.Status.INTERRUPTED if state.text or state.thinking else Message.Status.ERROR
    elif outcome == "complete":
        status = Message.Status.COMPLETE
    else:
        status = Message.Status.INTERRUPTED
        stats.setdefault("finish_reason", "stopped")
    msg = await _store_final(conv_id, msg_id, state, status, stats)
    if msg is not _UNSAVED:  # (unsaved: the row stays streaming, and the sweep recovers it from the log)
        await drop_tail(msg_id)
    if msg is _UNSAVED:  # the reader keeps the reply on screen and is told it was not stored
        await publish(conv_id, server_frames.error(msg_id, "SAVE_FAILED", SAVE_FAILED_DETAIL))
        msg = Message(pk=msg_id, conversation_id=conv_id, role=Message.Role.ASSISTANT, text=state.text,
                      thinking=state.thinking, status=status, stats=stats, created=timezone.now())
    if detail:
        code = state.error.get("code", "ENGINE_ERROR") if state.error else "ENGINE_ERROR"
        await publish(conv_id, server_frames.error(msg_id, code, detail, ref=ref))
    if isinstance(msg, Message):  # None: the message was deleted meanwhile
        await publish(conv_id, server_frames.done(msg.as_dict()))
