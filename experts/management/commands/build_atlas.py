"""manage.py build_atlas: run the atlas builder here (no Celery) against the running bridge."""
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from experts import services
from experts.builder import Probe
from experts.models import AtlasBuild


class Command(BaseCommand):
    help = "Measure experts.json for the engine's current model with the shipped probe prompts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--experts", type=int, default=None,
                            help="routed experts per token for the probes (default: probes.json's choice)")

    def handle(self, *args: Any, **options: Any) -> None:
        build = services.build_start()  # run here, not queued
        if build.status != AtlasBuild.QUEUED:
            raise CommandError(f"build {build.pk} is already {build.status}; cancel it on the atlas page first")

        def on_probe(done: int, total: int, probe: Probe) -> None:
            self.stdout.write(f"{done}/{total} {probe.category}#{probe.index}")

        build = services.build_run(build_id=build.pk, on_probe=on_probe, experts=options["experts"])
        if build.status != AtlasBuild.DONE:
            raise CommandError(f"build {build.pk} {build.status}: {build.error}")
        atlas = build.atlas
        assert atlas is not None  # a done build has its atlas
        v = atlas.validation or {}
        self.stdout.write(f"atlas {atlas.pk} for {atlas.model_name}: {atlas.entries} experts, "
                          f"{atlas.specialists} specialists, leave-one-prompt-out {v['correct']}/{v['total']}, "
                          f"method {v.get('method')}, experts {v.get('experts') or v.get('top_k')}, "
                          f"{build.wall_s:.1f} s, sha256 {atlas.sha256[:12]}")
