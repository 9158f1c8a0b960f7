"""The chat websocket: validates frames, calls services, relays group events. No chat logic here.

Invariants: a socket joins a conversation's group only after the database says the user owns it
(a group is a broadcast: joining first would leak another user's live turn); a malformed frame is
answered with an `error` frame and the socket stays open; a socket acts only while its user is
active and its session exists unexpired (services.access_valid): checked on every frame, and every
ACCESS_CHECK_S while it is open, so a deactivation by queryset update(), an expired or a deleted
session closes it (4401) within that, signal or not (issue 24).
"""
import asyncio
import contextlib
import json
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from chat import frames, relay, services
from engine_bridge.prompting import TemplateError

log = logging.getLogger(__name__)
CLOSE_UNAUTHENTICATED = 4401
MAX_FRAME_CHARS = 1 << 20  # a send frame carries at most frames.MAX_TEXT_CHARS of text; JSON escapes fit
ACCESS_CHECK_S = 1.0  # an open socket re-reads its user and session this often


def user_group(user_id):
    """Every socket of one user: closed together when the account is deactivated."""
    return f"user-{user_id}"


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.user = self.scope.get("user")
        if self.user is None or not self.user.is_authenticated or not self.user.is_active:
            # Accept, then close: a close before accept becomes a bare HTTP 403 handshake
            # refusal, and the client could not tell "log in again" (4401) from other failures.
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.watching = set()
        self.session_key = getattr(self.scope.get("session"), "session_key", None)
        await self.channel_layer.group_add(user_group(self.user.pk), self.channel_name)
        await self.accept()
        self.access_watch = asyncio.create_task(self._watch_access())

    async def _watch_access(self):
        """Closes the socket once its user or session is no longer valid (see the module doc)."""
        while True:
            await asyncio.sleep(ACCESS_CHECK_S)
            try:
                valid = await _access_valid(self.user.pk, self.session_key)
            except Exception:  # a database hiccup is not a revocation: ask again next round
                log.warning("checking a chat socket's session failed", exc_info=True)
                continue
            if not valid:
                await self.close(code=CLOSE_UNAUTHENTICATED)
                return

    async def disconnect(self, code):
        if not hasattr(self, "watching"):
            return
        watch = getattr(self, "access_watch", None)
        if watch is not None and watch is not asyncio.current_task():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        await self.channel_layer.group_discard(user_group(self.user.pk), self.channel_name)
        for conv_id in self.watching:
            relay.unwatch_locally(conv_id, self)
            await self.channel_layer.group_discard(relay.group_for(conv_id), self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        if not text_data:  # binary or empty frame: answer instead of raising (socket survives)
            return await self._error(None, "bad_frame", "frames must be JSON text", "type")
        if len(text_data) > MAX_FRAME_CHARS:
            return await self._error(None, "bad_frame", f"frame larger than {MAX_FRAME_CHARS} characters", "type")
        if not await _access_valid(self.user.pk, self.session_key):
            return await self.close(code=CLOSE_UNAUTHENTICATED)
        try:
            await super().receive(text_data=text_data, **kwargs)
        except Exception:  # a bug must cost one frame an error answer, not the socket (1011)
            log.exception("chat frame failed")
            await self._error(None, "server_error", "the server could not handle this frame", None)

    @classmethod
    async def decode_json(cls, text_data):
        try:
            return json.loads(text_data, parse_constant=_refuse_constant)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
            return _BAD_JSON

    async def user_revoked(self, event):
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def receive_json(self, content, **kwargs):
        if content is _BAD_JSON:
            return await self._error(None, "bad_frame", "frame is not valid JSON", "type")
        try:
            kind, fields = frames.parse(content)
        except frames.FrameError as exc:
            return await self._error(None, "bad_frame", exc.detail, exc.field)
        try:
            await getattr(self, f"on_{kind}")(**fields)
        except services.ChatError as exc:
            await self._error(None, exc.code, exc.detail, exc.field)
        except TemplateError as exc:
            await self._error(None, "template_error", str(exc), None)

    async def _error(self, message_id, code, detail, field):
        frame = {"type": "error", "message": message_id, "code": code, "detail": detail}
        if field:
            frame["field"] = field
        await self.send_json(frame)

    async def _watch(self, conv_id):
        if conv_id not in self.watching:
            await self.channel_layer.group_add(relay.group_for(conv_id), self.channel_name)
            relay.watch_locally(conv_id, self)
            self.watching.add(conv_id)

    async def _begin(self, turn, params):
        conv = turn.conversation
        await self._watch(conv.pk)
        if turn.created_conversation:
            await self.send_json({"type": "conversation", "conversation": conv.as_dict()})
        if turn.deleted:  # regenerate/edit: other tabs re-read the conversation
            await relay.publish(conv.pk, {"type": "snapshot", "conversation": conv.pk, "messages": await _messages(self.user, conv.pk)})
        else:
            for msg in turn.new_messages:
                await relay.publish(conv.pk, {"type": "message", "message": msg.as_dict()})
        relay.start(turn, params)

    async def on_send(self, conversation, text, params):
        await self._begin(await database_sync_to_async(services.turn_send)(self.user, conversation, text, relay.PROCESS), params)

    async def on_regenerate(self, conversation, params):
        await self._begin(await database_sync_to_async(services.turn_regenerate)(self.user, conversation, relay.PROCESS), params)

    async def on_edit(self, conversation, message, text, params):
        await self._begin(await database_sync_to_async(services.turn_edit)(self.user, conversation, message, text, relay.PROCESS),
                          params)

    async def on_stop(self, conversation):
        await database_sync_to_async(services.conversation_for)(self.user, conversation)
        await relay.request_stop(conversation)

    async def on_open(self, conversation):
        # Ownership first (ChatError not_found for another user's id), then join the group, then
        # read the snapshot: a delta published between join and read is seen twice rather than
        # lost; the client ignores deltas whose offset it already has.
        await database_sync_to_async(services.conversation_for)(self.user, conversation)
        await self._watch(conversation)
        messages = await _messages(self.user, conversation)
        await self.send_json({"type": "snapshot", "conversation": conversation, "messages": messages})

    async def chat_frame(self, event):
        if event.get("origin") == relay.PROCESS:
            return  # this process delivered it to us directly
        await self.send_json(event["frame"])


_BAD_JSON = object()


def _refuse_constant(name):
    raise ValueError(f"{name} is not valid JSON")


_access_valid = database_sync_to_async(services.access_valid)


@database_sync_to_async
def _messages(user, conversation_id):
    return services.conversation_snapshot(user, conversation_id)[1]
