"""Writes every socket app's generated TypeScript frame union (colibri_base.frames).

Why here: each app declares its server frames in its own server_frames.py and the apps never
import one another, so the one command that writes all of their files belongs to the project,
which imports every app. FRAME_SETS lists one FrameSet per app with a socket.
"""
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from chat import server_frames as chat_frames
from colibri_base.frames import COMMAND, FrameSet
from experts import server_frames as atlas_frames

FRAME_SETS: tuple[FrameSet, ...] = (chat_frames.FRAME_SET, atlas_frames.FRAME_SET)


class Command(BaseCommand):
    help = "Regenerate the front end's server frame types from the server's frame declarations."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale; write nothing")

    def handle(self, *args: Any, check: bool, **options: Any) -> None:
        stale = []
        for frame_set in FRAME_SETS:
            path = Path(settings.BASE_DIR) / frame_set.target
            text = frame_set.typescript()
            current = path.read_text() if path.exists() else None
            if current == text:
                continue
            stale.append(frame_set.target)
            if not check:
                path.write_text(text)
        if check:
            if stale:
                self.stderr.write(f"stale: {', '.join(stale)}: run `{COMMAND}`")
                raise SystemExit(1)
            return
        for frame_set in FRAME_SETS:
            written = " (written)" if frame_set.target in stale else ""
            self.stdout.write(f"{frame_set.target}: {len(frame_set.frames)} frame types{written}")
