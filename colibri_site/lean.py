"""The API's own short middleware chain, for the routes where every millisecond is a client's.

Why: the page middleware (sessions, CSRF, auth, messages, CSP, axes, ...) is all MiddlewareMixin,
which under ASGI runs each hook in a worker thread: two thread hops per middleware, ~20 per
request, 2-4 ms of one core before a generation request reaches its view, serialised when many
arrive at once (issue 14's profile). /v1 generation and model routes authenticate with API keys
in DRF and render no page, so they need none of it: they get settings.API_MIDDLEWARE, whose
members run inline on the event loop. Every other path keeps settings.MIDDLEWARE.
Invariant: a path served here needs no session, cookie or CSRF state (API_LEAN_PATHS lists them).
"""
import re

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.middleware.security import SecurityMiddleware


class InlineSecurityMiddleware(SecurityMiddleware):
    """SecurityMiddleware's headers and SSL redirect, computed on the event loop: its hooks only
    read settings and set headers, so the thread hops MiddlewareMixin would add buy nothing."""

    sync_capable = False
    async_capable = True

    async def __acall__(self, request):
        response = self.process_request(request)
        if response is None:
            response = await self.get_response(request)
        return self.process_response(request, response)


class LeanASGIHandler(ASGIHandler):
    """Django's ASGI handler with settings.API_MIDDLEWARE as its chain."""

    def load_middleware(self, is_async=False):
        # Django builds the chain from settings.MIDDLEWARE; lend it the API's list for the build.
        pages = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.API_MIDDLEWARE
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = pages


def by_path(lean_app, page_app):
    """An ASGI app that sends API_LEAN_PATHS to lean_app and everything else to page_app."""
    lean = re.compile(settings.API_LEAN_PATHS)

    async def route(scope, receive, send):
        app = lean_app if lean.fullmatch(scope.get("path", "")) else page_app
        return await app(scope, receive, send)

    return route
