"""Conversations and their messages.

Messages are ordered by primary key: a conversation is a linear list. Regenerate deletes the
last assistant message and appends a new one; edit-and-resend rewrites one user message and
deletes everything after it. No tree of alternatives is kept (simplest correct semantics).

Tool calls (issue 25 item 7): an assistant message may carry the calls it made (`tool_calls`) and a
`tool` message holds one call's result (`tool_call_id` names the call). The chat page does not
make calls itself; they come from an imported API conversation (chat/imports.py).
"""
from typing import Any

from django.conf import settings
from django.db import models

from chat.server_frames import ConversationData, MessageData

MODEL_ID_CHARS = 64  # engine_bridge.served.slugify's bound
SYSTEM_PROMPT_CHARS = 20_000


class Conversation(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, blank=True, default="")
    # The engine KV slot this conversation last used (informational; the bridge owns slot
    # affinity through conversation_key "conv:<id>").
    kv_slot = models.IntegerField(null=True, blank=True)
    # The served model this conversation's turns go to (its ServedModel id; "" = the default
    # model), chosen with the chat page's model picker (issue 26 item 3).
    model = models.CharField(max_length=MODEL_ID_CHARS, blank=True, default="")
    # Rendered as the first (system) message of every turn's prompt; "" = none.
    system_prompt = models.TextField(blank=True, default="", max_length=SYSTEM_PROMPT_CHARS)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated"]
        indexes = [models.Index(fields=["owner", "-updated"], name="conv_owner_updated")]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"

    @property
    def group_name(self) -> str:
        return f"conv-{self.pk}"

    def as_data(self) -> ConversationData:
        """The conversation as the socket's frames carry it (chat.server_frames)."""
        return {
            "id": self.pk,
            "title": self.title,
            "model": self.model,
            "created": self.created.isoformat(),
            "updated": self.updated.isoformat(),
        }

    def as_dict(self, *, detail: bool = False) -> dict[str, Any]:
        """The conversation for the page; `detail` adds the system prompt (up to 20,000 characters,
        kept out of the list and the socket's frames, read when a conversation opens)."""
        out: dict[str, Any] = {**self.as_data()}
        if detail:
            out["system_prompt"] = self.system_prompt
        return out


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"
        SYSTEM = "system"
        TOOL = "tool"  # one tool call's result; tool_call_id names the call

    class Status(models.TextChoices):
        STREAMING = "streaming"
        COMPLETE = "complete"
        INTERRUPTED = "interrupted"
        ERROR = "error"

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16, choices=Role.choices)
    # Assistant text is stored exactly as the engine emitted it: the next turn renders it back
    # byte-identically so the engine can reuse the KV prefix.
    text = models.TextField(blank=True, default="")
    # Assistant only: a reasoning model's thinking before its answer (the bridge's `reasoning`
    # events: `<think>`, harmony's analysis channel), kept apart from `text`. Shown and exported,
    # never rendered into the next turn's prompt (chat.services.prompt_messages sends `text` only).
    thinking = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    # Assistant only: the calls this turn made, in order, as the OpenAI wire has them but flat:
    # [{"id", "name", "arguments"}], arguments the JSON text the model wrote (not re-encoded, so
    # what the page shows and the prompt renders is what was written).
    tool_calls = models.JSONField(default=list, blank=True)
    # Tool only: the id of the call (in an earlier assistant message) this is the result of.
    tool_call_id = models.CharField(max_length=128, blank=True, default="")
    # prompt_tokens, completion_tokens, ttft_s, tok_s, hit_pct, finish_reason, error, bridge (the engine host)
    stats = models.JSONField(default=dict, blank=True)
    # Which experts answered this message (the engine's ROUTES for its request, asked with
    # routes=True), packed by chat.services.routing_pack: {"rows", "cols", "experts",
    # "selections", "dtype", "counts_b64"} (every cell's count, rows in EMAP order); null when the
    # engine does not report it. Kept off the chat socket: staff read it at
    # /atlas/api/messages/<id>/routing.
    routing = models.JSONField(null=True, blank=True)
    # The web process whose relay generates this message while it is streaming (chat.relay.PROCESS;
    # "" for rows from before issue 24): the orphan sweep (chat.sweeper) interrupts a streaming
    # message whose process no longer renews its lease.
    relay_owner = models.CharField(max_length=32, blank=True, default="")
    created = models.DateTimeField(auto_now_add=True)
    # Touched by every periodic save of a streaming message: a "streaming" row whose
    # updated is old belongs to a relay that died with its process.
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["conversation", "id"], name="msg_conv_id")]

    def __str__(self) -> str:
        return f"{self.role} #{self.pk}"

    def as_dict(self) -> MessageData:
        return {
            "id": self.pk,
            "conversation": self.conversation_id,
            "role": self.role,
            "text": self.text,
            "thinking": self.thinking,
            "status": self.status,
            "stats": self.stats,
            "tool_calls": self.tool_calls,
            "tool_call_id": self.tool_call_id,
            "created": self.created.isoformat(),
        }
