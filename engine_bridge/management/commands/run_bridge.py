"""manage.py run_bridge — the long-running bridge worker; the only owner of the engine process."""
import asyncio
import signal
from typing import Any

from django.core.management.base import BaseCommand

from engine_bridge.worker import Bridge


class Command(BaseCommand):
    help = "Run the engine bridge worker (spawns and supervises the engine)."

    def handle(self, *args: Any, **options: Any) -> None:
        asyncio.run(serve())


async def serve() -> None:
    task = asyncio.create_task(Bridge().run())
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # Once only: a second cancel would abort the graceful drain (in-flight requests finish).
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
            loop.add_signal_handler(sig, lambda: None)
        task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await task
    except asyncio.CancelledError:
        pass
