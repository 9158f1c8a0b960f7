"""OpenAPI description of the /v1 routes (drf-spectacular), served at GET /v1/openapi.json.

These serializers document the wire; they validate nothing (intake and the surface modules do,
with the contracts' own error texts). Only the main fields are listed: every surface accepts and
ignores metadata-like fields (user, metadata, store, service_tier, ...), and refuses, with 400
naming the field, what the engine cannot honour.
"""
from collections.abc import Callable
from typing import Any, TypeVar

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.renderers import OpenApiJsonRenderer
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from drf_spectacular.views import SpectacularAPIView
from rest_framework import serializers as s

from api.intake import MAX_CHOICES, MAX_TOP_LOGPROBS
from engine_bridge.request import MAX_STOP_CHARS, MAX_STOPS

F = TypeVar("F", bound=Callable[..., Any])

SCHEMA_URL = "/v1/openapi.json"
SETTINGS = {
    "TITLE": "colibri API",
    "DESCRIPTION": (
        "Four wire surfaces on one engine: OpenAI Chat Completions, legacy Completions, OpenAI Responses "
        "and Anthropic Messages, plus the model list in both styles. Authenticate with "
        "`Authorization: Bearer <key>` or `x-api-key: <key>`. Streams are chosen by `\"stream\": true` in "
        "the body and sent as server-sent events. Errors use the OpenAI envelope, or the Anthropic one on "
        "/v1/messages (and on the model list for clients that send `anthropic-version`)."
    ),
    "VERSION": "1",
    "COMPONENT_SPLIT_REQUEST": True,
    "SECURITY": [{"bearer": []}, {"apiKey": []}],
    "APPEND_COMPONENTS": {"securitySchemes": {
        "bearer": {"type": "http", "scheme": "bearer"},
        "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
    }},
}


class V1Schema(AutoSchema):
    def get_auth(self) -> list[dict[str, list[str]]]:
        return [{"bearer": []}, {"apiKey": []}]


def documented(**kwargs: Any) -> Callable[[F], F]:
    """extend_schema on a view method, based on V1Schema: drf-spectacular bases a method's schema
    on DRF's DEFAULT_SCHEMA_CLASS unless the function names one (the site keeps DRF's default)."""
    def decorate(f: F) -> F:
        setattr(f, "schema", V1Schema)  # read by drf-spectacular off the view method
        return extend_schema(**kwargs)(f)
    return decorate


# Public (no key): the schema says how to authenticate. Only api.urls is described.
schema_view = SpectacularAPIView.as_view(urlconf="api.urls", custom_settings=SETTINGS,
                                         renderer_classes=[OpenApiJsonRenderer], authentication_classes=[],
                                         permission_classes=[], schema=None)

_sampling: dict[str, s.Field] = {
    "temperature": s.FloatField(required=False, min_value=0, max_value=2, help_text="0 = greedy; default: the served model's recommendation (GET /health `sampling`), else 0.7"),
    "top_p": s.FloatField(required=False, help_text="in (0, 1]; default: the served model's recommendation, else 1.0"),
    "stream": s.BooleanField(required=False, default=False),
    "top_k": s.IntegerField(required=False, min_value=0, help_text=(
        "sample among the k most likely tokens (0: no cut); needs our engine (400 naming top_k otherwise)")),
    "colibri": s.JSONField(required=False, help_text=(
        'our extension: {"experts": N} routed experts per token for this request, in the range '
        '/health reports (omitted: the model\'s default); {"topk": true} per-token candidates '
        '(Chat Completions); {"routing": true} this request\'s expert selections, returned as '
        '`colibri.routing` = {"rows": R, "cols": C, "counts": [[row, expert, count], ...]} (rows = MoE '
        "layers in the engine's order, nonzero counts only; with an engine that reports per-token routing also "
        '`phases` = {"prompt", "thinking" (reasoning models only), "answer"}: the same counts split by where '
        "the position was, adding up to `counts`, and `positions` = positions per phase) in the answer's `colibri` object, or in the "
        "stream's final event (Chat/Completions: a last chunk with empty choices; Messages: message_stop; "
        "Responses: the terminal event's response); off by default; 400 naming colibri.routing on an "
        "engine without our extensions")),
}
_FORCED = ("required / a named tool are held to a grammar (constrained decoding) and refused with a 400 naming "
           "tool_choice by an engine without one")
_openai_tools: dict[str, s.Field] = {
    "tools": s.JSONField(required=False, help_text=(
        "function tools; the served model's own tool syntax renders them (Qwen/Hermes <tool_call>, GLM-4.5 "
        "arg_key/arg_value, else a generic JSON form) and calls are parsed back as they stream")),
    "tool_choice": s.JSONField(required=False, help_text=f"none | auto (default with tools) | required | a named "
                               f"function; {_FORCED}"),
    "parallel_tool_calls": s.BooleanField(required=False, default=True, help_text="false: at most one call"),
}
_messages = inline_serializer("ChatMessage", {
    "role": s.ChoiceField(["system", "developer", "user", "assistant", "tool"]),
    "content": s.JSONField(help_text="a string or a list of text parts (null beside tool_calls)"),
    "tool_calls": s.JSONField(required=False, help_text="assistant: [{id, type: function, function: {name, arguments}}]"),
    "tool_call_id": s.CharField(required=False, help_text="tool: the call this result answers"),
}, many=True)

_STOP_BOUNDS = f"each at most {MAX_STOP_CHARS} characters; past the bounds: 400 naming the field"
_choices: dict[str, s.Field] = {
    "n": s.IntegerField(required=False, min_value=1, max_value=MAX_CHOICES, help_text=(
        "independent choices, generated one after another (seed + i each when seeded); usage sums the "
        "completion tokens")),
}
CHAT = inline_serializer("ChatCompletionRequest", {
    "model": s.CharField(), "messages": _messages, **_sampling,
    "max_completion_tokens": s.IntegerField(required=False, min_value=0),
    "max_tokens": s.IntegerField(required=False, min_value=0, help_text="omitted: the server's budget; 0: prewarm"),
    "stop": s.JSONField(required=False, help_text=f"a string or up to 4 strings, {_STOP_BOUNDS}"),
    "seed": s.IntegerField(required=False, min_value=0), **_choices,
    "logprobs": s.BooleanField(required=False, help_text="each token's logprob and bytes (needs our engine)"),
    "top_logprobs": s.IntegerField(required=False, min_value=0, max_value=MAX_TOP_LOGPROBS,
                                   help_text="candidates per token; needs logprobs: true"),
    "stream_options": s.JSONField(required=False, help_text='{"include_usage": true}'),
    "response_format": s.JSONField(required=False, help_text='{"type": "text"}, {"type": "json_object"} or '
                                   '{"type": "json_schema", "json_schema": {name, schema, strict}} (constrained decoding)'),
    **_openai_tools,
    "functions": s.JSONField(required=False, help_text="legacy: mapped onto tools (function_call onto tool_choice)"),
    "reasoning_effort": s.CharField(required=False, help_text=(
        "none | minimal | low | medium | high. A reasoning model's thinking comes in message.reasoning_content "
        "(delta.reasoning_content when streamed), its tokens in usage.completion_tokens_details.reasoning_tokens; "
        "effort sets gpt-oss's Reasoning: level, none asks for no thinking")),
    "chat_template_kwargs": s.JSONField(required=False, help_text='{"enable_thinking": false}: no thinking (Qwen3)'),
})
COMPLETION = inline_serializer("CompletionRequest", {
    "model": s.CharField(), "prompt": s.JSONField(help_text="a string (or an array of exactly one)"), **_sampling,
    "max_tokens": s.IntegerField(required=False, min_value=0),
    "stop": s.JSONField(required=False, help_text=f"a string or up to 4 strings, {_STOP_BOUNDS}"),
    "seed": s.IntegerField(required=False, min_value=0), "stream_options": s.JSONField(required=False), **_choices,
    "logprobs": s.IntegerField(required=False, min_value=0, max_value=MAX_TOP_LOGPROBS, help_text=(
        "candidates per token (tokens, token_logprobs, top_logprobs, text_offset); 0: off; needs our engine")),
})
MESSAGES = inline_serializer("MessagesRequest", {
    "model": s.CharField(), "messages": s.JSONField(help_text="[{role: user|assistant, content}]"),
    "system": s.JSONField(required=False), "max_tokens": s.IntegerField(required=False, min_value=0),
    "stop_sequences": s.ListField(child=s.CharField(), required=False, max_length=MAX_STOPS,
                                  help_text=f"up to {MAX_STOPS} strings, {_STOP_BOUNDS}"),
    "metadata": s.JSONField(required=False, help_text="accepted and ignored"), **_sampling,
    "tools": s.JSONField(required=False, help_text="[{name, description, input_schema}] (custom tools)"),
    "tool_choice": s.JSONField(required=False, help_text=f"{{type: auto|any|tool|none, name, disable_parallel_tool_use}}; "
                               f"any / tool: {_FORCED}"),
    "thinking": s.JSONField(required=False, help_text=(
        "{type: enabled, budget_tokens} | {type: disabled}: a reasoning model's thinking comes as thinking blocks "
        "(thinking_delta, signature_delta); budget_tokens: the server closes the thinking when spent")),
    "output_format": s.JSONField(required=False, help_text='{"type": "json_schema", "schema": {...}} (constrained decoding)'),
    "output_config": s.JSONField(required=False, help_text='{"format": {"type": "json_schema", "schema": {...}}}'),
})
RESPONSES = inline_serializer("ResponsesRequest", {
    "model": s.CharField(), "input": s.JSONField(help_text="a string or a list of messages"),
    "instructions": s.CharField(required=False), "max_output_tokens": s.IntegerField(required=False, min_value=0),
    "text": s.JSONField(required=False, help_text='{"format": {"type": "text" | "json_object"}} or '
                        '{"format": {"type": "json_schema", name, schema, strict}} (constrained decoding)'), **_sampling,
    **_openai_tools,
    "reasoning": s.JSONField(required=False, help_text=(
        '{"effort": none|minimal|low|medium|high}: a reasoning model\'s thinking comes as a reasoning output item '
        "(response.reasoning_text.* events), its tokens in usage.output_tokens_details.reasoning_tokens")),
})

COUNT_TOKENS = inline_serializer("CountTokensRequest", {
    "model": s.CharField(), "messages": s.JSONField(help_text="[{role: user|assistant, content}]"),
    "system": s.JSONField(required=False), "tools": s.JSONField(required=False, help_text=(
        "[{name, description, input_schema}]: counted as a create renders them (the model's tool syntax)")),
})
COUNT_TOKENS_RESPONSE = inline_serializer("CountTokensResponse", {"input_tokens": s.IntegerField()})
OPENAI_ERROR = inline_serializer("OpenAIError", {"error": inline_serializer("OpenAIErrorBody", {
    "message": s.CharField(), "type": s.CharField(), "param": s.CharField(allow_null=True),
    "code": s.CharField(allow_null=True)})})
ANTHROPIC_ERROR = inline_serializer("AnthropicError", {"type": s.CharField(), "error": inline_serializer(
    "AnthropicErrorBody", {"type": s.CharField(), "message": s.CharField()})})


def _error_schemas() -> dict[object, object]:
    from api.errors import ANTHROPIC, OPENAI

    return {OPENAI: OPENAI_ERROR, ANTHROPIC: ANTHROPIC_ERROR}


ERROR_SCHEMAS = _error_schemas()  # a surface's envelope (api.errors) -> its OpenAPI schema


def _errors(envelope: object, busy: int) -> dict[int, OpenApiResponse]:
    doc = {400: "bad request, naming the field", 401: "missing or bad key", 404: "unknown model",
           413: "body over 4 MiB", 429: "queue full or timed out (Retry-After)",
           busy: "engine starting, restarting or down (Retry-After)", 500: "engine error"}
    return {code: OpenApiResponse(envelope, description=text) for code, text in doc.items()}


def generation(request: object, summary: str, *, envelope: object = OPENAI_ERROR, busy: int = 503) -> Callable[[F], F]:
    return documented(
        request={"application/json": request}, summary=summary,
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description=(
            "the surface's object, or an SSE stream (text/event-stream) when the body says stream: true. "
            "A stream whose request waits for a slot starts at once: header `x-colibri-queue-position: N` "
            "(1 = next), SSE comments `: queued position=N` while it waits (Anthropic: also `ping` events with "
            "`colibri.queue_position`; Responses: the official `response.created`/`response.queued` with status "
            "`queued`); an error found before a slot took it (queue timeout, context exceeded, engine down) then "
            "comes in-band as the surface's error event")),
                   **_errors(envelope, busy)},
    )


models_list = documented(
    operation_id="v1_models_list",
    summary="The served model, in both the OpenAI and the Anthropic list shapes",
    parameters=[OpenApiParameter("limit", int), OpenApiParameter("after_id", str), OpenApiParameter("before_id", str)],
    responses={200: OpenApiTypes.OBJECT, 401: OPENAI_ERROR},
)
model_detail = documented(operation_id="v1_models_retrieve", summary="One model by id, display name or alias",
                             responses={200: OpenApiTypes.OBJECT, 404: OPENAI_ERROR})
