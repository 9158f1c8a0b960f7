"""What a message or a title may hold: the text rules that the turn services, the titles job and
the importer share.

Why its own module: chat/titles.py (run by chat/tasks.py, which chat/services.py enqueues after a
first exchange) needs them, and with them in services the titles imported the services that queue
the titles. Here they sit below both and import nothing of the app.
"""
TITLE_WORDS = 8


def fallback_title(text: str) -> str:
    """The first TITLE_WORDS words of the user's first message: the title until (or instead of)
    a generated one."""
    words = text.split()
    title = " ".join(words[:TITLE_WORDS])
    return (title + ("…" if len(words) > TITLE_WORDS else ""))[:200] or "New chat"


def storable(text: str) -> str:
    """A model may emit NUL (valid UTF-8): PostgreSQL text refuses it — the final save failed and
    the reply hung on "Generating…" — and the engine refuses a prompt that contains it, so the
    next turn would fail too. It is stored as U+FFFD, as the engine's decoder shows bad bytes."""
    return text.replace("\x00", "\ufffd")
