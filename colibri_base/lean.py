"""The API's own short middleware chain, for the routes where every millisecond is a client's.

Why: the page middleware (sessions, CSRF, auth, messages, CSP, axes, ...) is all MiddlewareMixin,
which under ASGI runs each hook in a worker thread: two thread hops per middleware, ~20 per
request, 2-4 ms of one core before a generation request reaches its view, serialised when many
arrive at once (issue 14's profile). /v1 generation and model routes authenticate with API keys
in DRF and render no page, so they need none of it: they get settings.API_MIDDLEWARE, whose
members run inline on the event loop. Every other path keeps settings.MIDDLEWARE.
The handler itself makes no thread hop either (LeanASGIHandler.handle): Django's sends the request
signals and closes the response through sync_to_async, under a ThreadSensitiveContext that starts
a new thread for each request that does so. Their receivers (reset_queries,
close_old_connections, close_caches, reset_urlconf) only touch the calling thread's state, and
the event loop's thread holds no database connection (Django refuses sync queries there), so
here they run inline. What must reach the database on these routes does it through
`database_call`: in a thread, after closing that thread's connection if it is obsolete or broken
(what close_old_connections would have done at the request's start).
Invariant: a path served here needs no session, cookie or CSRF state (API_LEAN_PATHS lists them),
and its code does not block the loop (the one exception: a rate-limited request's token
settlement at its end, one Redis script, kept synchronous so that no settlement is lost with a
cancelled task).
"""
import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import connections
from django.urls import set_script_prefix
from django.http import HttpRequest, HttpResponseBase
from django.middleware.security import SecurityMiddleware

T = TypeVar("T")
ASGIApp = Callable[[dict[str, Any], Callable[..., Awaitable[Any]], Callable[..., Awaitable[None]]], Awaitable[None]]


def database_call(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """fn as a coroutine function that runs in a worker thread with a usable connection. A
    connection inside a transaction (a test's) is its owner's to close, not ours."""

    def call(*args: Any, **kwargs: Any) -> T:
        for conn in connections.all(initialized_only=True):
            if not conn.in_atomic_block:
                conn.close_if_unusable_or_obsolete()
        return fn(*args, **kwargs)

    return sync_to_async(call)


class InlineSecurityMiddleware(SecurityMiddleware):
    """SecurityMiddleware's headers and SSL redirect, computed on the event loop: its hooks only
    read settings and set headers, so the thread hops MiddlewareMixin would add buy nothing."""

    sync_capable = False
    async_capable = True

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase | None = self.process_request(request)
        if response is None:
            # async_capable and not sync_capable: Django hands this middleware an async get_response.
            response = await cast(Awaitable[HttpResponseBase], self.get_response(request))
        # django-stubs asks an HttpResponse; it only sets headers, which every response has.
        return self.process_response(request, response)  # type: ignore[arg-type]


class LeanASGIHandler(ASGIHandler):
    """Django's ASGI handler with settings.API_MIDDLEWARE as its chain."""

    def load_middleware(self, is_async: bool = False) -> None:
        # Django builds the chain from settings.MIDDLEWARE; lend it the API's list for the build.
        pages = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.API_MIDDLEWARE
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = pages

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        await self.handle(scope, receive, send)  # no ThreadSensitiveContext: nothing here needs one

    async def handle(self, scope: dict, receive: Callable, send: Callable) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            set_script_prefix(get_script_prefix(scope))
            signals.request_started.send(sender=self.__class__, scope=scope)
            request, error_response = self.create_request(scope, body_file)
            if request is None:
                assert error_response is not None  # create_request returns one of the two
                await self.send_response(error_response, send)
                error_response.close()
                return
            response = await self.serve(request, receive, send)
            if response is None:  # the client left before its response began
                signals.request_finished.send(sender=self.__class__)
            else:
                response.close()  # sends request_finished
        finally:
            body_file.close()

    async def serve(self, request: HttpRequest, receive: Callable, send: Callable) -> HttpResponseBase | None:
        """The response sent, or None when the client disconnected first: a disconnect cancels
        the view (a stream's generator closes, and the bridge cancels its job)."""

        async def respond() -> HttpResponseBase:
            response = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):  # disconnected while sending
                await self.send_response(response, send)
            return response

        watch = asyncio.create_task(self.listen_for_disconnect(receive))
        work = asyncio.create_task(respond())
        await asyncio.wait([watch, work], return_when=asyncio.FIRST_COMPLETED)
        for task in (watch, work):
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                await task
        return None if work.cancelled() else work.result()


def by_path(lean_app: ASGIApp, page_app: ASGIApp) -> ASGIApp:
    """An ASGI app that sends API_LEAN_PATHS to lean_app and everything else to page_app."""
    lean = re.compile(settings.API_LEAN_PATHS)

    async def route(scope: dict, receive: Callable, send: Callable) -> None:
        app = lean_app if lean.fullmatch(scope.get("path", "")) else page_app
        return await app(scope, receive, send)

    return route
