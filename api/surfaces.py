"""The wire surfaces of /v1: one row per surface, read by everything that differs by surface.

Why a table: a surface is a wire contract (routes, request fields, stream framing, ids, finish
values, error envelope). Before this table each difference sat in its own place (views, urls,
the OpenAPI schema, metrics labels, the refused-field lists, the context-overflow field), so a
new field touched every surface module and a fifth surface about fourteen files. Now a new field
is a column (or a value in `features` / `refused`), a new surface one row; the parser module of
a surface keeps only what is truly its own (how its body becomes messages and a prompt).

Who reads it: api.urls (one route per row), api.views (one generation view per row: its parser,
envelope, metrics label and OpenAPI description), api.openapi (request schemas are named in the
row), colibri_base.metrics (the label set, declared at the end), and each row's `parse`, which gets its row and takes
`refused`, `stop`, `budget`, `prompt_param` and `projector` from it.

Columns (every row fills every one; `None` where a surface has no such thing):
  name          the surface's label in /metrics and logs (DS4's names)
  route         its path under the site root, as api.urls mounts it
  url_name      the Django URL name
  summary       the OpenAPI operation summary
  parse         parse(body, *, served, surface) -> intake.Call (the surface module's parser)
  projector     the api.projectors.Projector subclass that writes its wire (frames and objects)
  envelope      its error envelope: api.errors.OPENAI or api.errors.ANTHROPIC
  busy_status   what "engine not ready" answers in its envelope (OpenAI 503, Anthropic 529)
  framing       its stream framing, one of FRAMINGS (see there)
  prompt_param  the request field a context overflow names (messages / prompt / input)
  budget        the client's output-budget fields, preferred first
  stop          StopRule(field, count, length): where its stop strings come from and their
                bounds, or None (the surface takes none)
  features      the optional request fields it honours (documentation and tests read it; a
                field not here and not in `refused` is accepted and ignored, api-surfaces §1.6)
  refused       {field: predicate(value) -> True when the value asks for what the surface
                cannot do}: 400 naming the field (intake.refuse), never a silent change
  request_schema the OpenAPI request serializer (api.openapi)
"""
from dataclasses import dataclass
from typing import Any, Callable

from api import anthropic_messages, completions, openai_chat, openapi, responses
from api.errors import ANTHROPIC, OPENAI, Envelope
from api.intake import Call
from api.projectors import AnthropicProjector, CompletionProjector, OpenAIChatProjector, ResponsesProjector
from colibri_base import metrics
from engine_bridge.request import MAX_STOP_CHARS, MAX_STOPS

# Stream framings: how a surface's SSE stream is cut into records.
FRAMINGS = {
    "chat-chunks": "data-only chat.completion.chunk deltas, then data: [DONE]",
    "completion-chunks": "data-only text_completion objects (never a delta), then data: [DONE]",
    "anthropic-events": "event: + data: records, type inside equal to the event name, no [DONE]",
    "responses-events": "event: + data: response.* records with a contiguous sequence_number from 0, no [DONE]",
}


@dataclass(frozen=True)
class StopRule:
    """Where a surface's stop strings are read and how many / how long they may be (None: no bound)."""
    field: str
    count: int | None = None
    length: int | None = None


@dataclass(frozen=True)
class Surface:
    name: str
    route: str
    url_name: str
    summary: str
    parse: Callable[..., Call]  # (body, *, served, surface) -> Call
    projector: Callable[..., Any]  # a Projector subclass; each takes its surface's own keywords
    envelope: Envelope
    busy_status: int
    framing: str
    prompt_param: str
    budget: tuple
    stop: StopRule | None
    features: frozenset
    refused: dict
    request_schema: object


def _truthy(v: object) -> bool:
    return bool(v)


def _not_none(v: object) -> bool:
    return v is not None


def _not_one(v: object) -> bool:
    return v not in (None, 1)


def _nonzero(v: object) -> bool:
    return v not in (None, 0, 0.0)


# Sampling controls the engine cannot honour (api-surfaces §1.6).
_PENALTIES = {"logit_bias": _truthy, "frequency_penalty": _nonzero, "presence_penalty": _nonzero}
_TOOLS = ("tools", "tool_choice", "parallel_tool_calls")  # api.tools
_COMMON = frozenset({"model", "stream", "temperature", "top_p", "seed", "colibri", "user", "metadata"})

SURFACES = (
    Surface(
        name="openai_chat", route="v1/chat/completions", url_name="v1-chat-completions",
        summary="OpenAI Chat Completions", parse=openai_chat.parse, projector=OpenAIChatProjector,
        envelope=OPENAI, busy_status=503, framing="chat-chunks", prompt_param="messages",
        budget=("max_completion_tokens", "max_tokens"), stop=StopRule("stop", count=4, length=MAX_STOP_CHARS),
        features=_COMMON | {"messages", "stream_options", "stop", "max_completion_tokens", "max_tokens",
                            "response_format", *_TOOLS, "functions", "function_call", "n", "logprobs",
                            "top_logprobs", "top_k", "reasoning_effort", "chat_template_kwargs"},
        refused={**_PENALTIES},
        request_schema=openapi.CHAT,
    ),
    Surface(
        name="openai_completion", route="v1/completions", url_name="v1-completions",
        summary="OpenAI legacy Completions (the prompt is sent raw)", parse=completions.parse,
        projector=CompletionProjector, envelope=OPENAI, busy_status=503, framing="completion-chunks",
        prompt_param="prompt", budget=("max_tokens",), stop=StopRule("stop", count=4, length=MAX_STOP_CHARS),
        features=_COMMON | {"prompt", "stream_options", "stop", "max_tokens", "n", "logprobs", "top_k"},
        refused={"top_logprobs": _not_none, **_PENALTIES, "tools": _truthy, "functions": _truthy, "best_of": _not_one, "echo": _truthy,
                 "suffix": lambda v: v not in (None, "")},
        request_schema=openapi.COMPLETION,
    ),
    Surface(
        name="anthropic_messages", route="v1/messages", url_name="v1-messages", summary="Anthropic Messages",
        parse=anthropic_messages.parse, projector=AnthropicProjector, envelope=ANTHROPIC, busy_status=529,
        framing="anthropic-events", prompt_param="messages", budget=("max_tokens",),
        stop=StopRule("stop_sequences", count=MAX_STOPS, length=MAX_STOP_CHARS),
        features=_COMMON | {"messages", "system", "stop_sequences", "max_tokens", "tools", "tool_choice", "top_k",
                            "thinking", "output_format", "output_config"},
        refused={},
        request_schema=openapi.MESSAGES,
    ),
    Surface(
        name="openai_responses", route="v1/responses", url_name="v1-responses",
        summary="OpenAI Responses (stateless: replay the full input)", parse=responses.parse,
        projector=ResponsesProjector, envelope=OPENAI, busy_status=503, framing="responses-events",
        prompt_param="input", budget=("max_output_tokens",), stop=None,
        features=_COMMON | {"input", "instructions", "max_output_tokens", "text", *_TOOLS, "store", "top_k",
                            "reasoning"},
        refused={"top_logprobs": lambda v: v not in (None, 0)},
        request_schema=openapi.RESPONSES,
    ),
)
BY_NAME = {s.name: s for s in SURFACES}
NAMES = tuple(s.name for s in SURFACES)
metrics.declare_surfaces(NAMES)  # /metrics labels its series by these names (colibri_base imports no app)
