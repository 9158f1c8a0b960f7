"""Export of a user's conversations as JSON or Markdown (the content; views/tasks deliver it)."""
import json
from typing import Any

from django.contrib.auth.models import User
from django.template.loader import render_to_string
from django.utils import timezone

from chat.models import Conversation

FORMATS = {"json": "application/json", "md": "text/markdown; charset=utf-8"}


def export_data(user: User) -> list[dict[str, Any]]:
    convs = Conversation.objects.filter(owner=user).prefetch_related("messages").order_by("created")
    return [{**c.as_dict(), "messages": [m.as_dict() for m in c.messages.all()]} for c in convs]


def export_content(user: User, fmt: str) -> tuple[bytes, str, str]:
    """-> (bytes, content type, file name). fmt must be in FORMATS."""
    data = export_data(user)
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    if fmt == "json":
        body = json.dumps({"user": user.get_username(), "exported": timezone.now().isoformat(), "conversations": data},
                          ensure_ascii=False, indent=2)
    else:
        body = render_to_string("chat/export.md", {"user": user, "conversations": data})
    return body.encode(), FORMATS[fmt], f"conversations-{stamp}.{fmt}"
