"""JSON endpoints for the browser UI (session auth + CSRF), the export download and, for the atlas
page, a message's routing."""
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chat import services
from chat.export import FORMATS, export_content
from chat.imports import ImportRefused, import_conversation
from chat.models import MODEL_ID_CHARS, SYSTEM_PROMPT_CHARS, Conversation
from colibri_base.access import signed_in_user, staff_json
from engine_bridge.served import served_model_get, served_models_get
from engine_bridge.request import NUL_REFUSAL, has_nul


class SessionApi(APIView):
    # DRF's SessionAuthentication enforces CSRF on unsafe methods for logged-in users.
    authentication_classes = [SessionAuthentication]
    permission_classes = [IsAuthenticated]

    def conversation(self, pk: int) -> Conversation:
        try:
            return services.conversation_for(signed_in_user(self.request), pk)
        except services.ChatError as exc:
            raise NotFound(exc.detail)


# Titles and every other DRF CharField refuse NUL already (DRF's ProhibitNullCharactersValidator:
# 400 "Null characters are not allowed." naming the field), the rule of engine_bridge.request.has_nul.
class TitleInput(serializers.Serializer):
    title = serializers.CharField(max_length=200, allow_blank=True, required=False, default="")


class ConversationListApi(SessionApi):
    def get(self, request: Request) -> Response:
        q = request.query_params.get("q", "").strip()
        if has_nul(q):  # PostgreSQL cannot compare with it: refused like any client text
            raise ValidationError({"q": [f"q {NUL_REFUSAL}"]})
        convs = services.conversation_search(signed_in_user(request), q)[:500]
        return Response({"conversations": [c.as_dict() for c in convs]})

    def post(self, request: Request) -> Response:
        data = TitleInput(data=request.data)
        data.is_valid(raise_exception=True)
        conv = Conversation.objects.create(owner=signed_in_user(request), title=data.validated_data["title"])
        return Response(conv.as_dict(), status=status.HTTP_201_CREATED)


class ConversationImportApi(SessionApi):
    """POST an API conversation (an OpenAI Chat request's `messages`, tool calls and results
    included; chat/imports.py) -> 201 with the new conversation, or 400 {"error", "field"} naming
    the offending value; nothing is stored on a 400."""

    def post(self, request: Request) -> Response:
        try:
            conv = import_conversation(signed_in_user(request), request.data)
        except ImportRefused as exc:
            return Response({"error": str(exc), "field": exc.field}, status=status.HTTP_400_BAD_REQUEST)
        return Response(conv.as_dict(), status=status.HTTP_201_CREATED)


class ConversationUpdateInput(serializers.Serializer):
    """PATCH: any of the title, the model (a served model's id or name; "" = the default) and the
    system prompt; at least one."""
    title = serializers.CharField(max_length=200, allow_blank=False, required=False)
    model = serializers.CharField(max_length=MODEL_ID_CHARS, allow_blank=True, required=False)
    system_prompt = serializers.CharField(max_length=SYSTEM_PROMPT_CHARS, allow_blank=True, required=False,
                                          trim_whitespace=False)

    def validate(self, attrs: dict) -> dict:
        if not attrs:
            raise ValidationError({"title": ["give a title, model or system_prompt to change"]})
        return attrs


class ConversationDetailApi(SessionApi):
    def get(self, request: Request, pk: int) -> Response:
        return Response(self.conversation(pk).as_dict(detail=True))

    def patch(self, request: Request, pk: int) -> Response:
        conv = self.conversation(pk)
        data = ConversationUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        try:
            services.conversation_configure(conv, model=fields.get("model"), system_prompt=fields.get("system_prompt"))
        except services.ChatError as exc:
            raise ValidationError({exc.field or "conversation": [exc.detail]})
        if "title" in fields:
            conv = services.conversation_rename(signed_in_user(request), pk, fields["title"])
        return Response(conv.as_dict(detail=True))

    def delete(self, request: Request, pk: int) -> Response:
        self.conversation(pk).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class ModelListApi(SessionApi):
    """GET /api/models: what the chat page's model picker offers — every model a live bridge
    serves ({"id", "display_name", "context_length", "status", "bridges"}), and the default's id
    (what a conversation with no model of its own uses; null while no engine runs)."""

    def get(self, request: Request) -> Response:
        models = served_models_get()
        default = served_model_get() if models else None
        return Response({"default": default.id if default is not None else None, "models": [
            {"id": m.id, "display_name": m.display_name, "context_length": m.context_length, "status": m.status,
             "bridges": list(m.bridges)} for m in models]})


class ConversationMessagesApi(SessionApi):
    def get(self, request: Request, pk: int) -> Response:
        self.conversation(pk)
        conv, messages = services.conversation_snapshot(signed_in_user(request), pk)
        return Response({"conversation": conv.as_dict(), "messages": messages})


@login_required
@require_GET
def export_view(request: HttpRequest) -> HttpResponse:
    # Inline: a chat UI's history exports in well under a second; chat.tasks.export_conversations
    # builds the same content in Celery for very large accounts.
    fmt = request.GET.get("format", "json")
    if fmt not in FORMATS:
        return JsonResponse({"error": "format must be json or md", "field": "format"}, status=400)
    body, content_type, name = export_content(signed_in_user(request), fmt)
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@require_GET
@staff_json
def message_routing(request: HttpRequest, pk: int) -> JsonResponse:
    """Which experts answered one chat message (its request's ROUTES, kept by the chat): the
    atlas page's ?message=<id> filter. Staff only, like every atlas route; no message text.
    Served here, under the atlas's /atlas/api/ path, because the rows are the chat's: the experts
    app reads them over HTTP (its page) and never imports chat/."""
    routing = services.message_routing(pk)
    if routing is None:
        return JsonResponse({"error": "no such message"}, status=404)
    if not routing["counts"]:
        return JsonResponse({**routing, "error": "the engine reported no routing for this message"}, status=404)
    return JsonResponse(routing)
