"""Celery tasks: thin wrappers over services (titles, exports)."""
import logging

from celery import shared_task
from django.contrib.auth import get_user_model
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from chat import titles
from chat.export import export_content

log = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def title_conversation(conversation_id: int) -> None:
    titles.title_conversation(conversation_id)


@shared_task(ignore_result=True)
def export_conversations(user_id: int, fmt: str = "json") -> str:
    """Builds a large export off the request path into default storage; returns its path.
    GET /conversations/export runs export_content inline (fine for the sizes a chat UI makes)."""
    user = get_user_model().objects.get(pk=user_id)
    body, _, name = export_content(user, fmt)
    return default_storage.save(f"exports/{user_id}/{name}", ContentFile(body))
