"""The chat websocket: validates frames, calls services, relays group events. No chat logic here."""
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from chat import frames, relay, services
from engine_bridge.prompting import TemplateError

log = logging.getLogger(__name__)
CLOSE_UNAUTHENTICATED = 4401


class ChatConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.user = self.scope.get("user")
        if self.user is None or not self.user.is_authenticated:
            # Accept, then close: a close before accept becomes a bare HTTP 403 handshake
            # refusal, and the client could not tell "log in again" (4401) from other failures.
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.watching = set()
        await self.accept()

    async def disconnect(self, code):
        for conv_id in getattr(self, "watching", ()):
            await self.channel_layer.group_discard(relay.group_for(conv_id), self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        if not text_data:  # binary or empty frame: answer instead of raising (socket survives)
            return await self._error(None, "bad_frame", "frames must be JSON text", "type")
        await super().receive(text_data=text_data, **kwargs)

    @classmethod
    async def decode_json(cls, text_data):
        try:
            return await super().decode_json(text_data)
        except ValueError:
            return _BAD_JSON

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
        await self._begin(await database_sync_to_async(services.turn_send)(self.user, conversation, text), params)

    async def on_regenerate(self, conversation, params):
        await self._begin(await database_sync_to_async(services.turn_regenerate)(self.user, conversation), params)

    async def on_edit(self, conversation, message, text, params):
        await self._begin(await database_sync_to_async(services.turn_edit)(self.user, conversation, message, text), params)

    async def on_stop(self, conversation):
        await database_sync_to_async(services.conversation_for)(self.user, conversation)
        await relay.request_stop(conversation)

    async def on_open(self, conversation):
        # Join the group before reading the snapshot: a delta published in between is then
        # seen twice rather than lost; the client ignores deltas whose offset it already has.
        await self._watch(conversation)
        try:
            messages = await _messages(self.user, conversation)
        except services.ChatError:
            await self.channel_layer.group_discard(relay.group_for(conversation), self.channel_name)
            self.watching.discard(conversation)
            raise
        await self.send_json({"type": "snapshot", "conversation": conversation, "messages": messages})

    async def chat_frame(self, event):
        await self.send_json(event["frame"])


_BAD_JSON = object()


@database_sync_to_async
def _messages(user, conversation_id):
    return services.conversation_snapshot(user, conversation_id)[1]
