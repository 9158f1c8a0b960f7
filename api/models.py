"""Per-user API keys for the /v1 surfaces.

The full key is shown once at creation; only its sha256 is stored. The prefix (first
characters after "col-") is stored in clear to find the row and to let users tell keys apart.
"""
import hashlib
import hmac
import secrets

from django.conf import settings
from django.contrib.auth.models import User
from django.db import models, transaction
from django.utils import timezone

from api.keygen import keys_changed

KEY_TAG = "col-"
PREFIX_LEN = 8


def hash_key(full_key: str) -> str:
    return hashlib.sha256(full_key.encode()).hexdigest()


class ApiKeyQuerySet(models.QuerySet["ApiKey"]):
    def active(self) -> "ApiKeyQuerySet":
        return self.filter(revoked=False)

    def revoke(self) -> int:
        """Revokes these keys in every web process from the next request (a bulk update sends no
        row signals, so the key cache is told here)."""
        count = self.update(revoked=True)
        transaction.on_commit(keys_changed)
        return count


class ApiKey(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=PREFIX_LEN, unique=True)
    hashed_secret = models.CharField(max_length=64)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)
    # Limits set by staff in the admin; empty = the user's limits / the site default.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name or 'key'} ({KEY_TAG}{self.prefix}…)"

    @classmethod
    def issue(cls, *, user: User, name: str = "") -> tuple["ApiKey", str]:
        """Creates a key; returns (row, full_key). The full key is never stored."""
        while True:
            prefix = secrets.token_hex(PREFIX_LEN // 2)
            if not cls.objects.filter(prefix=prefix).exists():
                break
        full_key = f"{KEY_TAG}{prefix}-{secrets.token_urlsafe(32)}"
        row = cls.objects.create(user=user, name=name, prefix=prefix, hashed_secret=hash_key(full_key))
        return row, full_key

    @classmethod
    def lookup(cls, full_key: str) -> "ApiKey | None":
        """The active key row for full_key, or None. Constant-time compare of the hashes."""
        if not full_key.startswith(KEY_TAG) or "\x00" in full_key:  # PostgreSQL cannot compare NUL
            return None
        prefix = full_key[len(KEY_TAG):len(KEY_TAG) + PREFIX_LEN]
        # The user's limits come along (None when unset), so limits cost no query of their own.
        row = cls.objects.active().select_related("user", "user__api_limit").filter(prefix=prefix).first()
        if row is None or not hmac.compare_digest(row.hashed_secret, hash_key(full_key)):
            return None
        if not row.user.is_active:
            return None
        return row

    def touch_due(self) -> bool:
        # At most one write a minute per key: last_used is for humans, not accounting.
        return self.last_used is None or (timezone.now() - self.last_used).total_seconds() > 60

    def touch(self) -> None:
        if self.touch_due():
            now = timezone.now()
            ApiKey.objects.filter(pk=self.pk).update(last_used=now)
            self.last_used = now


class UserApiLimit(models.Model):
    """A user's limits over all their keys (staff set them in the admin); empty = site default
    (settings.API_DEFAULT_REQUESTS_PER_MINUTE / API_DEFAULT_TOKENS_PER_MINUTE, unlimited if unset)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_limit")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"API limits of {self.user}"
