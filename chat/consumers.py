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
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth.models import User

from chat import frames, relay, server_frames, services, sweeper
from chat.groups import group_for, user_group
from engine_bridge.prompting import TemplateError

log = logging.getLogger(__name__)
CLOSE_UNAUTHENTICATED = 4401
MAX_FRAME_CHARS = 1 << 20  # a send frame carries at most frames.MAX_TEXT_CHARS of text; JSON escapes fit
ACCESS_CHECK_S = 1.0  # an open socket re-reads its user and session this often
GROUP_TIMEOUT_S = 1.0  # one group_add / group_discard's bound while Redis is out or frozen


class ChatConsumer(AsyncJsonWebsocketConsumer):
    # Set by connect: the scope's user (a lazy User once connect let it in), then, for a socket
    # it let in (disconnect tells by `watching`), the rest.
    user: Any
    watching: set[int]
    session_key: str | None
    groups_lost: bool
    access_watch: asyncio.Task[None]
    _layer_receive: Callable[[], Awaitable[Any]]

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        if self.user is None or not self.user.is_authenticated or not self.user.is_active:
            # Accept, then close: a close before accept becomes a bare HTTP 403 handshake
            # refusal, and the client could not tell "log in again" (4401) from other failures.
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.watching = set()
        self.session_key = getattr(self.scope.get("session"), "session_key", None)
        self.groups_lost = False
        await self._join(user_group(self.user.pk))
        await self.accept()
        self.access_watch = asyncio.create_task(self._watch_access())

    async def _join(self, group: str) -> None:
        """group_add that rides out a Redis outage: the socket works meanwhile (its own process's
        frames reach it directly, chat.relay.publish); the group is joined again once Redis is
        back (_rejoin, from the access check and the channel receive)."""
        try:
            async with asyncio.timeout(GROUP_TIMEOUT_S):
                await self.channel_layer.group_add(group, self.channel_name)
        except Exception as exc:
            log.warning("joining group %s failed (%s); joining again once Redis is back", group, exc)
            self.groups_lost = True

    async def _rejoin(self) -> None:
        self.groups_lost = False
        for group in (user_group(self.user.pk), *(group_for(c) for c in self.watching)):
            await self._join(group)

    # channels' AsyncConsumer assigns channel_receive (its channel-layer receive) and runs it
    # beside the socket's own receive: one ConnectionError from it ended the consumer, and the
    # socket closed 1011 at the first moment of a Redis outage (issue 24). Here it retries.
    # Both typed Awaitable[Any]: types-channels calls a layer message an ASGI receive event.
    @property
    def channel_receive(self) -> Callable[[], Awaitable[Any]]:
        return self._receive_riding_out

    @channel_receive.setter
    def channel_receive(self, receive: Callable[[], Awaitable[Any]]) -> None:
        self._layer_receive = receive

    async def _receive_riding_out(self) -> dict:
        delay = 0.1
        while True:
            try:
                return await self._layer_receive()
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:
                log.warning("channel layer receive failed (%s); retrying in %.1fs", exc, delay)
                self.groups_lost = True  # a restarted Redis has forgotten them
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                if hasattr(self, "watching"):
                    await self._rejoin()

    async def _watch_access(self) -> None:
        """Closes the socket once its user or session is no longer valid (see the module doc);
        joins groups again that a Redis outage lost."""
        while True:
            await asyncio.sleep(ACCESS_CHECK_S)
            if self.groups_lost:
                await self._rejoin()
            try:
                valid = await _access_valid(self.user.pk, self.session_key)
            except Exception:  # a database hiccup is not a revocation: ask again next round
                log.warning("checking a chat socket's session failed", exc_info=True)
                continue
            if not valid:
                await self.close(code=CLOSE_UNAUTHENTICATED)
                return

    async def disconnect(self, code: int) -> None:
        if not hasattr(self, "watching"):
            return
        watch = getattr(self, "access_watch", None)
        if watch is not None and watch is not asyncio.current_task():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        for conv_id in self.watching:
            relay.unwatch_locally(conv_id, self)
        try:  # Redis out: the layer's group expiry drops the membership later
            async with asyncio.timeout(GROUP_TIMEOUT_S):
                await self.channel_layer.group_discard(user_group(self.user.pk), self.channel_name)
                for conv_id in self.watching:
                    await self.channel_layer.group_discard(group_for(conv_id), self.channel_name)
        except Exception as exc:
            log.warning("leaving the groups of a closed socket failed (%s)", exc)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if not text_data:  # binary or empty frame: answer instead of raising (socket survives)
            return await self._error(None, "bad_frame", "frames must be JSON text", "type")
        if len(text_data) > MAX_FRAME_CHARS:
            return await self._error(None, "bad_frame", f"frame larger than {MAX_FRAME_CHARS} characters", "type")
        if not await _access_valid(self.user.pk, self.session_key):
            return await self.close(code=CLOSE_UNAUTHENTICATED)
        try:
            await super().receive(text_data=text_data, **kwargs)
        except Exception:  # a bug must cost one frame an error answer, not the socket (1011)
            ref = uuid.uuid4().hex[:8]  # the user's error names it; the log has the detail
            log.exception("chat frame failed (ref %s)", ref)
            await self._error(None, "server_error", f"the server could not handle this frame (ref {ref})", None, ref=ref)

    @classmethod
    async def decode_json(cls, text_data: str) -> Any:
        try:
            return json.loads(text_data, parse_constant=_refuse_constant)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
            return _BAD_JSON

    async def user_revoked(self, event: dict[str, Any]) -> None:
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
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
            ref = uuid.uuid4().hex[:8]
            log.error("the chat template failed (ref %s): %s", ref, exc)
            await self._error(None, "template_error", f"the model's chat template could not render this "
                              f"conversation (ref {ref})", None, ref=ref)

    async def _error(self, message_id: int | None, code: str, detail: str, field: str | None,
                     ref: str | None = None) -> None:
        await self.send_json(server_frames.error(message_id, code, detail, field, ref))

    async def _watch(self, conv_id: int) -> None:
        if conv_id not in self.watching:
            relay.watch_locally(conv_id, self)
            self.watching.add(conv_id)
            await self._join(group_for(conv_id))

    async def _begin(self, turn: services.Turn, params: dict) -> None:
        conv = turn.conversation
        await self._watch(conv.pk)
        if turn.created_conversation:
            await self.send_json(server_frames.conversation(conv.as_data()))
        if turn.deleted:  # regenerate/edit: other tabs re-read the conversation
            await relay.publish(conv.pk, server_frames.snapshot(conv.pk, await _messages(self.user, conv.pk)))
        else:
            for msg in turn.new_messages:
                await relay.publish(conv.pk, server_frames.message(msg.as_dict()))
        sweeper.ensure_started()  # the lease that tells other processes this turn's relay lives
        relay.start(turn, params)

    async def on_send(self, conversation: int | None, text: str, params: dict[str, Any], model: str | None = None,
                      system_prompt: str | None = None) -> None:
        turn = await database_sync_to_async(services.turn_send)(self.user, conversation, text, relay.PROCESS,
                                                                model=model, system_prompt=system_prompt)
        await self._begin(turn, params)

    async def on_regenerate(self, conversation: int, params: dict[str, Any]) -> None:
        await self._begin(await database_sync_to_async(services.turn_regenerate)(self.user, conversation, relay.PROCESS), params)

    async def on_edit(self, conversation: int, message: int, text: str, params: dict[str, Any]) -> None:
        await self._begin(await database_sync_to_async(services.turn_edit)(self.user, conversation, message, text, relay.PROCESS),
                          params)

    async def on_stop(self, conversation: int) -> None:
        await database_sync_to_async(services.conversation_for)(self.user, conversation)
        await relay.request_stop(conversation)

    async def on_open(self, conversation: int) -> None:
        # Ownership first (ChatError not_found for another user's id), then join the group, then
        # read the snapshot: a delta published between join and read is seen twice rather than
        # lost; the client ignores deltas whose offset it already has.
        await database_sync_to_async(services.conversation_for)(self.user, conversation)
        await self._watch(conversation)
        messages = await _messages(self.user, conversation)
        await self.send_json(server_frames.snapshot(conversation, messages))

    async def chat_frame(self, event: dict[str, Any]) -> None:
        if event.get("origin") == relay.PROCESS:
            return  # this process delivered it to us directly
        await self.send_json(event["frame"])


_BAD_JSON = object()


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


_access_valid = database_sync_to_async(services.access_valid)


@database_sync_to_async
def _messages(user: User, conversation_id: int) -> list[server_frames.MessageData]:
    return services.conversation_snapshot(user, conversation_id)[1]
