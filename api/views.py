"""/v1 (API key) and /api/keys (session) endpoints. Thin: intake and the surface modules parse,
engine generates, projectors shape the wire, errors render the surface's envelope. What differs
by surface is its row in api.surfaces: one generation view per row (generation_view).

The /v1 views are DRF APIViews with three DRF defaults replaced, each a known pitfall:
* negotiation never answers 406 (`Accept: text/event-stream`; streaming is chosen by the body);
* no parsers: the body is json.loads(request.body) whatever the Content-Type, which also
  covers chunked bodies (DRF's request.data is empty without Content-Length);
* errors use the surface's envelope (OpenAI, or Anthropic for /v1/messages and for clients that
  send `anthropic-version`), for every exception, unexpected ones included (a JSON 500).
The generation and model routes are async views (api.loopview): authentication, permissions,
throttles, the view and the rendering of its JSON run on the event loop, and a generation awaits
the bridge there too: no thread is parked per waiting request and no thread hop sits between the
request and its answer (issue 14). A stream
hands Django an async iterator, which Django cancels on client disconnect (that closes generate()
and the bridge cancels the job); a buffered request's view is cancelled the same way.
"""
import asyncio
import contextlib
import math
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, NoReturn, overload

from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from prometheus_client import CONTENT_TYPE_LATEST
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import anthropic_messages, engine, intake, limits, openapi, outage, served, surfaces
from api.auth import ApiKeyAuthentication
from api.errors import ANTHROPIC, OPENAI, ApiError, Envelope, as_api_error, from_engine_error, render
from api.loopview import LoopAPIView
from api.metering import Meter
from api.models import ApiKey
from api.projectors import Choices, Projector
from colibri_base import metrics
from colibri_base.access import signed_in_user
from engine_bridge import fleet, telemetry
from engine_bridge.request import GenerationRequest

KEEPALIVE_S = 10
QUEUE_POSITION_HEADER = "x-colibri-queue-position"
BRIDGE_HEADER = "x-colibri-bridge"  # the engine host (bridge id) that answered a generation
# What the openai and anthropic SDKs send (api-surfaces §1.2).
CORS_ALLOW_HEADERS = ", ".join([
    "Authorization", "Content-Type", "x-api-key", "anthropic-version", "anthropic-beta",
    "anthropic-dangerous-direct-browser-access", "Idempotency-Key", "OpenAI-Organization", "OpenAI-Project",
    "x-stainless-arch", "x-stainless-async", "x-stainless-lang", "x-stainless-os", "x-stainless-package-version",
    "x-stainless-runtime", "x-stainless-runtime-version", "x-stainless-retry-count", "x-stainless-read-timeout",
    "x-stainless-timeout", "x-stainless-helper-method",
])


class AnyAcceptNegotiation(BaseContentNegotiation):
    def select_parser(self, request: Request, parsers: Any) -> None:
        return None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> tuple[Any, str]:
        return renderers[0], renderers[0].media_type


def _wants_anthropic(request: Request) -> bool:
    return bool(request.META.get("HTTP_ANTHROPIC_VERSION"))


class V1Api(APIView):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated]
    content_negotiation_class = AnyAcceptNegotiation
    parser_classes = []
    renderer_classes = [JSONRenderer]
    schema = openapi.V1Schema()
    envelope: Envelope = OPENAI

    def envelope_for(self, request: Request) -> Envelope:
        return self.envelope

    @staticmethod
    def is_preflight(request: Request) -> bool:
        return request.method == "OPTIONS"  # a CORS preflight carries no key: answered before authentication

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        if not self.is_preflight(request):
            super().initial(request, *args, **kwargs)

    # options, finalize_response: drf-stubs leaves out APIView.options (DRF calls it with its
    # Request) and types finalize_response's response as a Response (DRF takes any HttpResponseBase).
    def options(self, request: Request, *args: Any, **kwargs: Any) -> Response:  # type: ignore[override]
        response = Response(status=status.HTTP_204_NO_CONTENT)
        response["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
        response["Access-Control-Allow-Headers"] = CORS_ALLOW_HEADERS
        response["Access-Control-Max-Age"] = "600"
        return response

    def finalize_response(self, request: Request, response: HttpResponseBase,  # type: ignore[override]
                          *args: Any, **kwargs: Any) -> HttpResponseBase:
        # Keys, not cookies, authenticate /v1, so any origin may call it from a browser (a
        # wildcard never covers Authorization in Allow-Headers, hence the explicit list).
        response["Access-Control-Allow-Origin"] = "*"
        response["Access-Control-Expose-Headers"] = ", ".join([
            "Retry-After", "retry-after-ms", QUEUE_POSITION_HEADER, BRIDGE_HEADER, *(f"x-ratelimit-{a}-{k}" for a in (
                "limit", "remaining", "reset") for k in ("requests", "tokens")), *(f"anthropic-ratelimit-{k}-{a}" for k in (
                "requests", "tokens") for a in ("limit", "remaining", "reset"))])
        return super().finalize_response(request, response, *args, **kwargs)  # type: ignore[arg-type]

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Response]:
        return lambda exc, context: render(self.envelope_for(context["request"]), as_api_error(exc))


class ByClientEnvelope:
    """Routes both SDKs use: the Anthropic envelope when the client sends anthropic-version."""

    def envelope_for(self, request: Request) -> Envelope:
        return ANTHROPIC if _wants_anthropic(request) else OPENAI


class LoopV1Api(V1Api, LoopAPIView):
    """A /v1 view served on the event loop (api.loopview): admission, the handler and the
    rendering, with no thread hop. A CORS preflight is answered before authentication."""

    async def ainitial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        outage.begin()  # its own window for riding out a Redis outage
        if not self.is_preflight(request):
            await super().ainitial(request, *args, **kwargs)


class ModelListApi(ByClientEnvelope, LoopV1Api):
    """One list in both styles (the union of the item fields; `has_more` is always false, or the
    Anthropic SDK's pager loops): every model a live bridge serves (api.served.listed)."""

    @openapi.models_list
    async def get(self, request: Request) -> Response:
        models = await served.aserved_models_get()
        default = None if models else await served.aserved_model_get(with_boot=False)
        data = served.listed(models, default)
        after, before = request.query_params.get("after_id"), request.query_params.get("before_id")
        if after in {m["id"] for m in data}:
            data = [m for m in data if m["id"] > after]
        if before in {m["id"] for m in data}:
            data = [m for m in data if m["id"] < before]
        return Response({"object": "list", "data": data, "has_more": False,
                         "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None})


class ModelDetailApi(ByClientEnvelope, LoopV1Api):
    @openapi.model_detail
    async def get(self, request: Request, model_id: str) -> Response:
        m = await served.aserved_model_get(model_id, with_boot=False)
        if m is None or model_id not in m.aliases:
            raise ApiError(404, f"The model {model_id!r} does not exist", param="model", code="model_not_found")
        return Response({**served.openai_entry(m), **served.anthropic_entry(m)})


@extend_schema(exclude=True)
class V1NotFoundApi(ByClientEnvelope, LoopV1Api):
    """Unknown /v1 routes: 404 in the envelope, not Django's HTML page."""

    def _missing(self, request: Request, rest: str) -> NoReturn:
        raise ApiError(404, f"Unknown route /v1/{rest}", code="unknown_route")

    get = post = put = patch = delete = _missing


class GenerationApi(LoopV1Api):
    """POST one surface: parse (intake + the surface's parser) -> buffered object or SSE stream.
    One subclass per row of api.surfaces (generation_view), which says everything that differs."""

    surface: surfaces.Surface  # its api.surfaces row (generation_view makes one subclass per row)
    throttle_classes = [limits.KeyRequestThrottle, limits.UserRequestThrottle]

    async def ainitial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        if self.is_preflight(request):
            return
        # The body and the facts of the model it names (and the bridge boot) are read while the
        # key is checked: one wait on Redis before the submit instead of two, and on a busy loop
        # each wait lets the other requests' work go first (issue 14).
        self.served_read = asyncio.ensure_future(_body_and_model(request._request))
        self.served_read.add_done_callback(_retrieved)  # a refused key leaves it unawaited
        await super().ainitial(request, *args, **kwargs)

    async def post(self, request: Request) -> HttpResponseBase:
        body, facts = await self.served_read
        call = await _parsed(self.surface, body, facts, size=len(request._request.body))
        assert facts is not None  # the parse refused a model no bridge serves
        # Tokens per minute: the prompt's estimate plus the output budget, charged before the
        # engine sees the request, settled against its usage when it ends (api.limits).
        reservation = await _tokens_admit(request, call)
        meter = Meter(self.surface.name, reservation=reservation)
        try:
            if not call.stream:
                answer, bridge = await _buffered(call, meter, boot=facts.boot)
                return _from_bridge(Response(answer), bridge)
            # The 200 starts at ACCEPT, or earlier at the first `queued` event (the job was
            # admitted: its client learns its position while it waits); the wait stays bounded.
            deadline = engine.queue_deadline()
            tick = _keepalive_tick(call.projector, deadline)
            first, events = await engine.open_generation(call.request, prompt_param=call.prompt_param,
                                                         admit_queued=True, deadline=deadline, boot=facts.boot,
                                                         tick=tick)
            if len(call.requests) > 1:
                first, events = {**first, "choice": 0}, _choice_events(call, events, boot=facts.boot, tick=tick)
        except BaseException:
            meter.release()
            raise
        response = StreamingHttpResponse(_sse(call, first, events, meter, deadline), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        if first.get("kind") == "queued":
            response[QUEUE_POSITION_HEADER] = str(first.get("position") or 0)
        return _from_bridge(response, first.get("bridge"))

    def finalize_response(self, request: Request, response: HttpResponseBase,  # type: ignore[override]
                          *args: Any, **kwargs: Any) -> HttpResponseBase:
        metrics.REQUESTS.labels(self.surface.name, str(response.status_code)).inc()
        for name, value in ratelimit_headers(getattr(request, "_api_ratelimit", None) or {},
                                             anthropic=self.envelope is ANTHROPIC).items():
            response[name] = value
        return super().finalize_response(request, response, *args, **kwargs)


def _retrieved(future: asyncio.Future) -> None:
    """Marks the read's exception as seen: a request refused before post never awaits it."""
    if not future.cancelled():
        future.exception()


async def _body_and_model(django_request: HttpRequest) -> tuple[dict, served.ServedModel | None]:
    """The request's JSON body and the ServedModel its `model` field names (engine_bridge.served:
    None for a name no live bridge serves). A body that does not parse is raised by the await,
    after authentication (a missing key is a 401 whatever the body)."""
    body = intake.body_read(django_request)
    return body, await served.aserved_model_get(served.model_of(body))


# What a parse may do on the event loop every stream shares: a body without the fields that can
# make it compile a grammar (structured output, a forced tool call: a new schema can take a
# second; tools alone render longer templates), and small enough that rendering it is quick.
GRAMMAR_FIELDS = ("response_format", "text", "tool_choice", "tools", "functions", "function_call", "output_format",
                  "output_config")
INLINE_PARSE_BYTES = 32 * 1024


async def _parsed(surface: surfaces.Surface, body: dict, facts: served.ServedModel | None, *,
                  size: int) -> intake.Call:
    """The surface's parse of `body` (`size`: its bytes on the wire). A small plain one (the
    template's rendering, a fraction of a millisecond) runs on the loop: in a worker thread it
    waited for the GIL behind the loop's other work, and a burst of 8 requests reached the bridge
    ~9 ms after its registry read (bench/webpath.py, issue 26). Any other goes to a thread."""
    if size <= INLINE_PARSE_BYTES and isinstance(body, dict) and not any(f in body for f in GRAMMAR_FIELDS):
        return surface.parse(body, served=facts, surface=surface)
    return await asyncio.to_thread(surface.parse, body, served=facts, surface=surface)


async def _tokens_admit(request: Request, call: intake.Call) -> limits.Reservation:
    accounts = limits.accounts_for(request)
    if not accounts:
        return limits.Reservation()
    amount = limits.estimate_tokens(call.request.prompt) + call.request.max_tokens * len(call.requests)
    info = getattr(request, "_api_ratelimit", None)
    if info is None:
        info = {}
        setattr(request, "_api_ratelimit", info)
    try:
        reservation = await limits.atokens_admit(accounts, amount)
    except limits.TokenLimitExceeded as exc:
        info["tokens"] = exc.info
        retry = max(1, math.ceil(exc.wait))
        raise ApiError(429, f"Rate limit reached on tokens per minute: limit {exc.info[0]}, remaining "
                       f"{exc.info[1]}, requested about {min(amount, exc.info[0])} (prompt estimate + output budget; "
                       f"a smaller max_tokens needs less). Please try again in {retry}s.",
                       type="rate_limit_error", code="rate_limit_exceeded", headers={"Retry-After": str(retry)})
    info["tokens"] = reservation.info()
    return reservation


def _duration(seconds: float) -> str:
    """OpenAI's reset format: 1s, 12.5s, 6m0s."""
    if seconds < 60:
        return f"{max(0.0, seconds):.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(seconds // 60)}m{int(seconds % 60)}s"


def ratelimit_headers(info: dict[str, limits.RateInfo | None], *, anthropic: bool = False) -> dict[str, str]:
    """The rate-limit headers clients read, from {"requests"|"tokens": (limit, remaining, seconds
    until fully reset)}: x-ratelimit-* (OpenAI) or anthropic-ratelimit-* (RFC 3339 reset)."""
    headers: dict[str, str] = {}
    for kind, values in info.items():
        if not values:
            continue
        limit, remaining, reset = values
        if anthropic:
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + math.ceil(reset)))
            headers.update({f"anthropic-ratelimit-{kind}-limit": str(limit),
                            f"anthropic-ratelimit-{kind}-remaining": str(remaining),
                            f"anthropic-ratelimit-{kind}-reset": at})
        else:
            headers.update({f"x-ratelimit-limit-{kind}": str(limit), f"x-ratelimit-remaining-{kind}": str(remaining),
                            f"x-ratelimit-reset-{kind}": _duration(reset)})
    return headers


class MessagesCountTokensApi(LoopV1Api):
    """POST /v1/messages/count_tokens (Anthropic): {"input_tokens": N} for system + tools +
    messages, rendered with the served model's template (api.anthropic_messages.count_prompt)
    and counted by the engine's own tokenizer: the prompt is submitted and the count read from
    the engine's ACCEPT line, then the job is cancelled (the mux wire has no count-only command,
    so a count costs the engine the prompt's prefill, which also warms a slot's KV prefix for the
    create that usually follows). Not charged against tokens per minute; requests per minute
    count it as any request."""

    envelope = ANTHROPIC
    throttle_classes = [limits.KeyRequestThrottle, limits.UserRequestThrottle]

    @openapi.documented(request={"application/json": openapi.COUNT_TOKENS}, summary="Anthropic count_tokens",
                        responses={200: openapi.COUNT_TOKENS_RESPONSE, 400: openapi.ANTHROPIC_ERROR,
                                   529: openapi.ANTHROPIC_ERROR})
    async def post(self, request: Request) -> HttpResponseBase:
        body, facts = await _body_and_model(request._request)
        model, prompt = await asyncio.to_thread(anthropic_messages.count_prompt, body, served=facts)
        assert facts is not None  # count_prompt refused a model no bridge serves
        job = GenerationRequest(prompt=prompt, max_tokens=1, temperature=0.0, top_p=1.0, model=model)
        accepted, events = await engine.open_generation(job, prompt_param="messages", boot=facts.boot)
        await events.aclose()  # cancels the job: only its count was wanted
        return _from_bridge(Response({"input_tokens": int(accepted.get("prompt_tokens") or 0)}), accepted.get("bridge"))


def generation_view(surface: surfaces.Surface) -> type["GenerationApi"]:
    """The view class of one api.surfaces row: its parser, envelope, metrics label and OpenAPI
    description all come from the row."""
    async def post(self: "GenerationApi", request: Request) -> HttpResponseBase:
        return await GenerationApi.post(self, request)

    envelope = openapi.ERROR_SCHEMAS[surface.envelope]
    post = openapi.generation(surface.request_schema, surface.summary, envelope=envelope,
                              busy=surface.busy_status)(post)
    name = "".join(part.title() for part in surface.name.split("_")) + "Api"
    return type(name, (GenerationApi,), {"surface": surface, "envelope": surface.envelope, "post": post,
                                         "__doc__": f"POST /{surface.route}: {surface.summary}."})


GENERATION_VIEWS = {s.name: generation_view(s) for s in surfaces.SURFACES}


@overload
def _tagged(event: dict, choice: int) -> dict: ...
@overload
def _tagged(event: dict | None, choice: int) -> dict | None: ...


def _tagged(event: dict | None, choice: int) -> dict | None:  # None: a stream's tick
    return event if event is None else {**event, "choice": choice}


async def _choice_events(call: intake.Call, events: AsyncGenerator[dict | None, None], *, boot: str | None = None,
                         tick: Callable[[], float] | None = None) -> AsyncGenerator[dict | None, None]:
    """n > 1: the events of choice 0 (`events`, already open), then of choices 1 … n-1, each
    generation opened when the one before it ended (sequential: one slot per request, and the
    later choices reuse the first one's KV prefix), every event tagged with its `choice`. A
    later choice the engine refuses ends the group with that choice's error."""
    async with contextlib.aclosing(events) as stream:
        async for event in stream:
            yield _tagged(event, 0)
    for i, request in enumerate(call.requests[1:], start=1):
        try:
            accepted, more = await engine.open_generation(request, prompt_param=call.prompt_param, boot=boot,
                                                          tick=tick)
        except ApiError as exc:
            yield {"kind": "error", "code": exc.code or "ENGINE_ERROR", "api_error": exc, "choice": i}
            return
        yield _tagged(accepted, i)
        async with contextlib.aclosing(more) as stream:
            async for event in stream:
                yield _tagged(event, i)


def _from_bridge(response: HttpResponseBase, bridge: str | None) -> HttpResponseBase:
    """Names the engine host that answered (BRIDGE_HEADER), when the router said."""
    if bridge:
        response[BRIDGE_HEADER] = bridge
    return response


async def _buffered(call: intake.Call, meter: Meter, *, boot: str | None = None) -> tuple[dict, str | None]:
    """The answer object of a buffered generation, and the bridge that made it."""
    projector = call.projector
    accepted, events = await engine.open_generation(call.request, prompt_param=call.prompt_param, boot=boot)
    bridge = accepted.get("bridge")
    if len(call.requests) > 1:
        accepted, events = _tagged(accepted, 0), _choice_events(call, events, boot=boot)
    meter.observe(accepted)
    projector.feed(accepted)
    try:
        async for event in events:
            if event is None:
                continue
            meter.observe(event)
            projector.feed(event)
            if projector.error:
                break
    finally:
        await events.aclose()
        meter.end(projector)
    if projector.error:
        refused = next((p.api_error for p in getattr(projector, "choices", ()) if p.api_error is not None), None)
        raise refused or ApiError(500, projector.error_message, type="server_error", code="engine_error")
    if not projector.done:
        raise ApiError(500, "The engine ended the request without finishing it.", type="server_error", code="engine_error")
    return projector.response(), bridge


def _queue_deadline(projector: Projector | Choices, deadline: float) -> float | None:
    """The loop time a stream must end by while its job is not yet accepted; None after."""
    return None if projector.accepted or projector.finished else deadline


def _keepalive_tick(projector: Projector | Choices, deadline: float) -> Callable[[], float]:
    """Seconds a stream waits for an event before its keepalive: KEEPALIVE_S, or until the queue
    deadline while that holds, so that _sse can end the stream in time."""
    loop = asyncio.get_running_loop()

    def tick() -> float:
        until = _queue_deadline(projector, deadline)
        return KEEPALIVE_S if until is None else max(0.0, min(KEEPALIVE_S, until - loop.time()))
    return tick


async def _sse(call: intake.Call, first: dict, events: AsyncGenerator[dict | None, None], meter: Meter,
               deadline: float) -> AsyncGenerator[str, None]:
    """The stream of one generation. `first` is the accepted event, or the first queued one: until
    ACCEPT the queue deadline still holds, and an error is the HTTP error it would have been,
    said in-band (the 200 has gone out). The frames of one event leave as one chunk, and the last
    event's with the stream's end: one socket write and one wakeup of the client per event."""
    projector = call.projector
    loop = asyncio.get_running_loop()
    waiting = lambda: _queue_deadline(projector, deadline)  # noqa: E731
    frames: list[str] = []
    try:
        meter.observe(first)
        if first_frames := projector.feed(first):
            yield "".join(first_frames)
        async with contextlib.aclosing(events) as stream:
            async for event in stream:
                if event is None:
                    if waiting() is not None and loop.time() >= deadline:
                        # Leaving the loop closes the stream: the bridge cancels the waiting job.
                        frames = projector.feed({"kind": "error", "code": "QUEUE_TIMEOUT",
                                                 "api_error": engine.queue_timeout_error()})
                        break
                    yield projector.keepalive
                    continue
                if event.get("kind") == "error" and not projector.accepted:
                    event = {**event, "api_error": from_engine_error(event, prompt_param=call.prompt_param)}
                meter.observe(event)
                frames = projector.feed(event)
                if projector.finished:
                    break
                if frames:
                    yield "".join(frames)
                frames = []
        if not projector.finished:  # stream ended without DONE: say so in-band
            frames = [*frames, *projector.feed({"kind": "error", "code": "ENGINE_ERROR"})]
        if tail := "".join([*frames, *projector.end()]):
            yield tail
    finally:
        # A client that left (Django cancels this generator) is a cancelled generation.
        meter.end(projector, outcome=None if projector.finished else "cancelled")


class KeyCreateInput(serializers.Serializer):
    name = serializers.CharField(max_length=100, allow_blank=True, required=False, default="")


class StatsApi(V1Api):
    """GET /v1/stats: the figures of /metrics as JSON, for humans and scripts (any API key)."""

    @openapi.documented(summary="The /metrics figures as JSON, per bridge and per model",
                        responses={200: openapi.OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        """`engine` is one bridge's (`?bridge=<id>`, else the default one); `bridges` and `models`
        list every live bridge (id, host, model, status, slots, busy, queued) and model."""
        try:
            return Response(fleet.stats(request.query_params.get("bridge")))
        except fleet.UnknownBridge as exc:
            raise ApiError(404, exc.detail, param="bridge", code="bridge_not_found")


def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET /metrics: Prometheus text (no key: scrapers run inside the deployment)."""
    return HttpResponse(metrics.exposition(telemetry.get_state), content_type=CONTENT_TYPE_LATEST)


@extend_schema(exclude=True)  # the browser UI's session endpoint, not part of the API
class ApiKeysApi(APIView):
    """The browser UI's key management (session + CSRF). The full key appears only in the POST answer."""
    authentication_classes = [SessionAuthentication]
    permission_classes = [IsAuthenticated]
    schema = openapi.V1Schema()

    def get(self, request: Request) -> Response:
        keys = ApiKey.objects.filter(user=signed_in_user(request))
        return Response({"keys": [_key_dict(k) for k in keys], **_where(request)})

    def post(self, request: Request) -> Response:
        data = KeyCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        row, full_key = ApiKey.issue(user=signed_in_user(request), name=data.validated_data["name"])
        return Response({**_key_dict(row), "key": full_key, **_where(request)}, status=status.HTTP_201_CREATED)


class ApiKeyRevokeApi(ApiKeysApi):
    def delete(self, request: Request, pk: int) -> Response:
        ApiKey.objects.filter(user=signed_in_user(request), pk=pk).revoke()
        return Response(status=status.HTTP_204_NO_CONTENT)


def _where(request: Request) -> dict[str, str]:
    """What the keys dialog's snippets need: the OpenAI base URL (Anthropic's is its origin)
    and the model id to type."""
    return {"base_url": request.build_absolute_uri("/v1"), "model": served.served_model_get().id}


def _key_dict(k: ApiKey) -> dict[str, Any]:
    return {"id": k.pk, "name": k.name, "prefix": k.prefix, "created": k.created.isoformat(),
            "last_used": k.last_used.isoformat() if k.last_used else None, "revoked": k.revoked}
