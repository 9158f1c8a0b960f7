"""Titles a conversation after its first exchange: a short background-priority generation."""
import logging
import re

from asgiref.sync import async_to_sync

from chat import server_frames
from chat.groups import group_for
from chat.models import Conversation, Message
from chat.text import fallback_title, storable
from colibri_base.layers import channel_layer
from engine_bridge import toolsyntax
from engine_bridge.reasoning import mode_for
from engine_bridge.served import served_model_get

log = logging.getLogger(__name__)
TITLE_MAX_TOKENS = 16
# A title needs the gist: each message's start. A long first message then costs the engine a short
# prefill, not a second turn's (under a memory cap that prefill also churns the expert cache that the
# user's next turn needs).
TITLE_SOURCE_CHARS = 600
INSTRUCTION = "Write a short title (at most 6 words) for this conversation. Answer with the title only."


def clean_title(text: str) -> str:
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = re.sub(r"^(title\s*:\s*)", "", line.strip(), flags=re.I).strip(" \"'*#`.")
    return line[:80]


async def _generate_text(prompt: str, model: str | None = None, reasoning: str | None = None) -> str:
    from engine_bridge.client import generate
    from engine_bridge.request import GenerationRequest

    req = GenerationRequest(prompt=prompt, max_tokens=TITLE_MAX_TOKENS, temperature=0.0, priority="background",
                            model=model, reasoning=reasoning)
    parts: list[str] = []
    async for event in generate(req):
        if event is None:  # only a stream with a tick yields None
            continue
        if event.get("kind") == "text":
            parts.append(event["text"])
        elif event.get("kind") == "error":
            raise RuntimeError(f"{event.get('code')}: {event.get('message')}")
        elif event.get("kind") == "done":
            break
    return "".join(parts)


def title_conversation(conversation_id: int) -> str | None:
    conv = Conversation.objects.filter(pk=conversation_id).first()
    if conv is None:
        return None
    msgs = list(conv.messages.filter(status=Message.Status.COMPLETE)[:2])
    if not msgs:
        return None
    first_user = next((m.text for m in msgs if m.role == Message.Role.USER), "")
    history = [{"role": m.role, "content": m.text[:TITLE_SOURCE_CHARS]} for m in msgs]
    title = ""
    try:
        # the conversation's own model and template; a reasoning model is asked not to think (the
        # answer is the title) and its thinking, if any, is kept out of the title
        served = served_model_get(conv.model or None)
        if served is None:
            raise LookupError(f"the model {conv.model!r} of this conversation is not served now")
        prompt = toolsyntax.render(history + [{"role": "user", "content": INSTRUCTION}], (), served, thinking=False)
        title = clean_title(async_to_sync(_generate_text)(prompt, served.id, mode_for(served.template)))
    except Exception as exc:  # titles are cosmetic: fall back, never fail the task
        log.warning("title generation failed for conversation %s: %s", conversation_id, exc)
    title = storable(title) or fallback_title(first_user)  # model output may hold NUL: stored as U+FFFD
    Conversation.objects.filter(pk=conversation_id).update(title=title)
    async_to_sync(channel_layer().group_send)(
        group_for(conversation_id),
        {"type": "chat.frame", "frame": server_frames.title(conversation_id, title)},
    )
    return title
