"""Whether a websocket authenticated at connect may still act (issue 24): its user is active (and
staff, where the socket needs it) and its session still exists unexpired.

Why here: a socket's user is resolved once, at connect; a queryset update() (an admin action, a
script), a session's expiry or its deletion (log-out elsewhere) sends no signal a consumer could
hear, so each consumer re-reads this from the database — on every frame and every second while it
is open. Both socket apps (chat, experts) use it from here: they never import each other.
"""
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.utils import timezone

CHECK_S = 1.0  # how often an open socket asks


def socket_access_valid(user_id: int, session_key: str | None, *, staff: bool = False) -> bool:
    """session_key None (a socket authenticated without a session, as in-process tests connect)
    checks the user only."""
    users = get_user_model().objects.filter(pk=user_id, is_active=True)
    if staff:
        users = users.filter(is_staff=True)
    if not users.exists():
        return False
    return session_key is None or Session.objects.filter(session_key=session_key, expire_date__gt=timezone.now()).exists()
