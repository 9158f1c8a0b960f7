"""An async DRF view whose admission (authentication, permissions, throttles) runs on the event loop.

Why: adrf's async dispatch runs DRF's `initial` in a thread (sync_to_async), and inside it runs
async throttles through async_to_sync: two thread hops, and under Django's ASGI handler a new
thread per request, about a millisecond of one core before a generation request reaches the
bridge, serialised when many arrive at once (issue 14's profile). Here `initial` is awaited on
the loop: authenticators with an `aauthenticate` coroutine and throttles whose `allow_request`
is a coroutine run there; sync ones (and DRF's permission classes, which only read the request)
are called inline, so every class used here must be cheap and free of blocking I/O.
Invariant: a request is admitted exactly as DRF would admit it (same order: negotiation,
version, authentication, permissions, throttles; same exceptions), only on the loop.
"""
import inspect
from collections.abc import Callable
from typing import Any, cast

from adrf.views import APIView as AsyncAPIView
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.template.response import SimpleTemplateResponse
from rest_framework import exceptions
from rest_framework.request import Request


class LoopAPIView(AsyncAPIView):
    async def async_dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        self.args, self.kwargs = args, kwargs
        drf_request = self.initialize_request(request, *args, **kwargs)
        self.request = drf_request
        self.headers = self.default_response_headers
        try:
            await self.ainitial(drf_request, *args, **kwargs)
            name = (drf_request.method or "").lower()
            handler = cast(Callable[..., Any], getattr(self, name, self.http_method_not_allowed)
                           if name in self.http_method_names else self.http_method_not_allowed)
            response = handler(drf_request, *args, **kwargs)
            if inspect.isawaitable(response):
                response = await response
        except Exception as exc:
            response = self.handle_exception(exc)
        self.response = self.finalize_response(drf_request, response, *args, **kwargs)
        return rendered_on_loop(self.response)

    async def ainitial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """DRF's APIView.initial, awaiting what can wait."""
        self.format_kwarg = self.get_format_suffix(**kwargs)
        request.accepted_renderer, request.accepted_media_type = self.perform_content_negotiation(request)
        request.version, request.versioning_scheme = self.determine_version(request, *args, **kwargs)
        await self.aperform_authentication(request)
        self.check_permissions(request)
        await self.acheck_throttles(request)

    async def aperform_authentication(self, request: Request) -> None:
        """Request._authenticate, with each authenticator's coroutine when it has one."""
        for authenticator in request.authenticators or ():  # initialize_request set them
            try:
                if hasattr(authenticator, "aauthenticate"):
                    user_auth = await authenticator.aauthenticate(request)
                else:
                    user_auth = authenticator.authenticate(request)
            # _not_authenticated / _authenticator: Request._authenticate's own steps, which drf-stubs omits
            except exceptions.APIException:
                request._not_authenticated()  # type: ignore[attr-defined]
                raise
            if user_auth is not None:
                request._authenticator = authenticator  # type: ignore[attr-defined]
                request.user, request.auth = user_auth
                return
        request._not_authenticated()  # type: ignore[attr-defined]

    async def acheck_throttles(self, request: Request) -> None:
        durations = []
        for throttle in self.get_throttles():
            allowed = throttle.allow_request(request, self)
            if inspect.isawaitable(allowed):
                allowed = await allowed
            if not allowed:
                durations.append(throttle.wait())
        if durations:
            self.throttled(request, max((d for d in durations if d is not None), default=None))


def rendered_on_loop(response: HttpResponseBase) -> HttpResponseBase:
    """A DRF Response rendered here, on the loop, and handed to Django as a plain HttpResponse.
    Django's async handler renders every response that has a render() method through
    sync_to_async, one thread hop per request (its CPU, two context switches, and a wait for the
    executor when it is busy); DRF's renderers here only encode JSON, no I/O. Streams pass as they are."""
    if not isinstance(response, SimpleTemplateResponse):
        return response
    response.render()
    plain = HttpResponse(response.content, status=response.status_code)
    plain.headers = response.headers
    plain.cookies = response.cookies
    return plain
