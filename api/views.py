"""/v1 (API key) and /api/keys (session) endpoints. Thin: parsing in openai_chat, generation in
engine, wire shapes in projectors.

The /v1 views are DRF APIViews with three DRF defaults replaced, each a known pitfall:
* negotiation never answers 406 (`Accept: text/event-stream`; streaming is chosen by the body);
* no parsers: the body is json.loads(request.body) whatever the Content-Type, which also
  covers chunked bodies (DRF's request.data is empty without Content-Length);
* errors use the OpenAI envelope (api.errors.openai_exception_handler).
DRF views are sync; generation is async. A stream bridges once (async_to_sync) to wait for
ACCEPT, then hands Django an async iterator, which Django cancels on client disconnect (that
closes generate() and the bridge cancels the job).
"""
from asgiref.sync import async_to_sync
from django.conf import settings
from django.http import StreamingHttpResponse
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from api import engine, openai_chat, projectors, served
from api.auth import ApiKeyAuthentication
from api.errors import ApiError, openai_exception_handler
from api.models import ApiKey

KEEPALIVE_S = 10


class AnyAcceptNegotiation(BaseContentNegotiation):
    def select_parser(self, request, parsers):
        return None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class OpenAIApi(APIView):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [IsAuthenticated]
    content_negotiation_class = AnyAcceptNegotiation
    parser_classes = []
    renderer_classes = [JSONRenderer]

    def get_exception_handler(self):
        return openai_exception_handler


class ModelListApi(OpenAIApi):
    def get(self, request):
        return Response({"object": "list", "data": [served.model_entry(served.served_model())]})


class ModelDetailApi(OpenAIApi):
    def get(self, request, model_id):
        m = served.served_model()
        if model_id not in m["aliases"]:
            raise ApiError(404, f"The model {model_id!r} does not exist", param="model", code="model_not_found")
        return Response(served.model_entry(m))


class ChatCompletionsApi(OpenAIApi):
    def post(self, request):
        body = openai_chat.parse_body(request._request.body)
        call = openai_chat.parse_chat(body, served=served.served_model(), default_budget=settings.ENGINE_CTX)
        projector = projectors.OpenAIChatProjector(model=call.model, include_usage=call.include_usage,
                                                   discard_text=call.discard_text)
        if not call.stream:
            return Response(async_to_sync(_buffered)(call.request, projector))
        accepted, events = async_to_sync(engine.open_generation)(call.request)
        response = StreamingHttpResponse(_sse(projector, accepted, events), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response


async def _buffered(request, projector):
    accepted, events = await engine.open_generation(request)
    projector.feed(accepted)
    for event in await engine.collect(events):
        projector.feed(event)
    if projector.error:
        raise ApiError(500, f"engine error ({projector.error.get('code')}): {projector.error.get('message', '')}",
                       type="server_error", code="engine_error")
    if not projector.done:
        raise ApiError(500, "the engine ended the request without DONE", type="server_error", code="engine_error")
    return projector.response()


async def _sse(projector, accepted, events):
    for frame in projector.feed(accepted):
        yield frame
    async for event in engine.with_keepalive(events, KEEPALIVE_S):
        if event is None:
            yield projectors.KEEPALIVE
            continue
        for frame in projector.feed(event):
            yield frame
        if projector.finished:
            break
    if not projector.finished:  # stream ended without DONE: say so in-band
        projector.feed({"kind": "error", "code": "ENGINE_ERROR", "message": "the engine ended the request without DONE"})
        for frame in projector.on_error():
            yield frame
    for frame in projector.end():
        yield frame


class KeyCreateInput(serializers.Serializer):
    name = serializers.CharField(max_length=100, allow_blank=True, required=False, default="")


class ApiKeysApi(APIView):
    """The browser UI's key management (session + CSRF). The full key appears only in the POST answer."""
    authentication_classes = [SessionAuthentication]
    permission_classes = [IsAuthenticated]

    def get(self, request):
        keys = ApiKey.objects.filter(user=request.user)
        return Response({"keys": [_key_dict(k) for k in keys]})

    def post(self, request):
        data = KeyCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        row, full_key = ApiKey.issue(user=request.user, name=data.validated_data["name"])
        return Response({**_key_dict(row), "key": full_key}, status=status.HTTP_201_CREATED)


class ApiKeyRevokeApi(ApiKeysApi):
    def delete(self, request, pk):
        ApiKey.objects.filter(user=request.user, pk=pk).update(revoked=True)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _key_dict(k):
    return {"id": k.pk, "name": k.name, "prefix": k.prefix, "created": k.created.isoformat(),
            "last_used": k.last_used.isoformat() if k.last_used else None, "revoked": k.revoked}
