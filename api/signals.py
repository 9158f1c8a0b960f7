"""Row changes that must reach every web process's key cache (api/keycache.py) at once: each bumps
the key generation (api/keygen.py)."""
from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from api.keygen import keys_changed
from api.models import ApiKey, UserApiLimit


def _changed(sender: object, **kwargs: object) -> None:
    transaction.on_commit(keys_changed)  # after commit: a reader must see the new row


def connect() -> None:
    for model in (ApiKey, UserApiLimit, settings.AUTH_USER_MODEL):
        post_save.connect(_changed, sender=model, dispatch_uid=f"api-keys-{model}-save")
        post_delete.connect(_changed, sender=model, dispatch_uid=f"api-keys-{model}-delete")
