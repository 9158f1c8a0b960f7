"""WhiteNoise's static-file middleware, made async-capable.

WhiteNoiseMiddleware is sync-only. In an ASGI server Django then runs the rest of the chain for
*every* request through the one shared sync thread, and holds it while the inner (async) handler
runs: an API request waiting for the engine's ACCEPT blocked every other request of the site
behind it (issue 14). Here a static path is served from WhiteNoise's table as before (the file is
opened in a worker thread); any other request goes on asynchronously without touching a thread.
"""
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponseBase
from whitenoise.middleware import WhiteNoiseMiddleware


class AsyncWhiteNoiseMiddleware(WhiteNoiseMiddleware):
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[..., Any] | None = None, **kwargs: Any) -> None:
        super().__init__(get_response, **kwargs)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _static_file(self, request: HttpRequest) -> Any:
        return self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        if self.is_async:
            return self._acall(request)
        return super().__call__(request)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        static_file = self._static_file(request)
        if static_file is not None:
            return await sync_to_async(self.serve, thread_sensitive=False)(static_file, request)
        return await self.get_response(request)
