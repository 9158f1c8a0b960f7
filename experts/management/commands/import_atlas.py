"""manage.py import_atlas FILE [--model NAME]: store a colibri experts.json as a model's newest atlas."""
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from experts import services
from experts.atlas_format import AtlasFormatError


class Command(BaseCommand):
    help = "Import a colibri-format experts.json (kept byte for byte; older atlases stay)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file")
        parser.add_argument("--model", help="model name (default: the engine's current model)")

    def handle(self, *args: Any, file: str, model: str | None = None, **options: Any) -> None:
        path = Path(file)
        try:
            content = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc}") from None
        model_name = model or services.model_name_current()
        try:
            atlas = services.atlas_import(content=content, model_name=model_name, filename=path.name)
        except AtlasFormatError as exc:
            raise CommandError(f"{file}: {exc}") from None
        self.stdout.write(f"atlas {atlas.pk} for {model_name}: {atlas.entries} experts, "
                          f"{atlas.specialists} specialists, sha256 {atlas.sha256[:12]}")
