"""Writes frontend/src/server_events.ts from chat/server_frames.py (the chat socket's frames)."""
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from chat import server_frames

TARGET = Path("frontend") / "src" / "server_events.ts"


class Command(BaseCommand):
    help = "Regenerate the front end's ServerEvent type from the server's frame declarations."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale; write nothing")

    def handle(self, *args: Any, check: bool, **options: Any) -> None:
        path = Path(settings.BASE_DIR) / TARGET
        text = server_frames.typescript()
        current = path.read_text() if path.exists() else None
        if check:
            if current != text:
                self.stderr.write(f"{TARGET} is stale: run `python manage.py chat_frames_ts`")
                raise SystemExit(1)
            return
        if current != text:
            path.write_text(text)
        self.stdout.write(f"{TARGET}: {len(server_frames.FRAMES)} frame types")
