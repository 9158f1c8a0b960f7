"""ASGI entry point: HTTP goes to Django (the API's generation and model routes through their own
short middleware chain, colibri_base.lean); websockets pass the origin check and session auth."""
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from daphne.http_protocol import HTTPFactory as DaphneHTTPFactory, WebRequest
from django.core.asgi import get_asgi_application
from twisted.web import http as twisted_http

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "colibri_site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import OriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from colibri_base.lean import ASGIApp, LeanASGIHandler, by_path  # noqa: E402

from chat import sweeper  # noqa: E402
from chat.routing import websocket_urlpatterns  # noqa: E402
from experts.routing import websocket_urlpatterns as experts_websockets  # noqa: E402

# Twisted parses each POST's Content-Type with the email package (about 0.15 ms, 8 % of Daphne's
# CPU per API request in issue 14's profile) only to spot form bodies. The parse is a pure
# function of the header's bytes and clients send a handful of values: remember the answers.
if hasattr(twisted_http, "_parseContentType") and not hasattr(twisted_http._parseContentType, "cache_info"):
    twisted_http._parseContentType = functools.lru_cache(maxsize=256)(twisted_http._parseContentType)


def _without_nagle(process: Callable[[WebRequest], Any]) -> Callable[[WebRequest], Any]:
    """Daphne leaves Nagle's algorithm on for the connections Twisted accepts (asyncio's own
    sockets turn it off): a stream's small writes (SSE events, websocket frames) then wait for the
    client's ACK of the previous one, which a delayed ACK holds up to 40 ms (issue 14). Set on
    each request's connection (a websocket's too: its upgrade is a request), before any reply."""

    @functools.wraps(process)
    def process_without_nagle(self: WebRequest) -> Any:
        transport: Any = getattr(self.channel, "transport", None)
        if hasattr(transport, "setTcpNoDelay"):
            transport.setTcpNoDelay(True)
        return process(self)

    setattr(process_without_nagle, "nagle_off", True)
    return process_without_nagle


if not getattr(WebRequest.process, "nagle_off", False):
    WebRequest.process = _without_nagle(WebRequest.process)


def _no_twisted_access_line(self: DaphneHTTPFactory, request: WebRequest) -> None:
    """Twisted formats a Combined Log Format line for every request and hands it to its own log,
    which Daphne discards at its default verbosity (at -v 2 it repeats Daphne's own access-log
    line): about 0.1 ms of CPU per request for nothing (issue 14's profile of GET /v1/models).
    Daphne's access log (--access-log, stdout at verbosity 1) is the one kept."""


DaphneHTTPFactory.log = _no_twisted_access_line

# Oversized request heads answer 414 / 431, not a dropped connection (colibri_site.http_limits).
from colibri_site import http_limits  # noqa: E402

http_limits.install()

def _with_sweeper(app: ASGIApp) -> ASGIApp:
    """Makes sure this process's orphan sweeper (chat.sweeper: its relay lease and the sweep of
    replies left streaming by dead processes) runs on the loop that serves: a dict lookup a call."""

    async def call(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        sweeper.ensure_started()
        return await app(scope, receive, send)

    return call


def _sweep_at_start_up() -> None:
    """Daphne sends no lifespan events: the sweeper starts on its loop when the server starts,
    not at the first request (under another server, the first call starts it)."""
    server = sys.modules.get("daphne.server")
    loop = getattr(server, "twisted_loop", None)
    if loop is not None:
        loop.call_soon(sweeper.ensure_started)


_sweep_at_start_up()

application = _with_sweeper(ProtocolTypeRouter(
    {
        "http": by_path(LeanASGIHandler(), django_asgi_app),
        "websocket": OriginValidator(
            # types-channels asks a list[URLPattern | URLRouter]; a list of path()s is one.
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns + experts_websockets)),  # type: ignore[arg-type]
            settings.WEBSOCKET_ALLOWED_ORIGINS,
        ),
    }
))
