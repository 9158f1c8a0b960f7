"""Request intake shared by every /v1 surface: body -> checked dict, and the field rules that do
not depend on the surface (budget, stop strings, sampling, refused parameters, model id).

Why here: hostile bodies must fail the same way on every surface, as a 4xx in the surface's
envelope naming the field, before anything reaches the bridge. The invariants after body_read():
the body is a JSON object of at most settings.DATA_UPLOAD_MAX_MEMORY_SIZE bytes, nested at most
MAX_DEPTH deep, with no NaN/Infinity literal and no string (or key) that cannot be encoded as
UTF-8 (a lone surrogate would otherwise fail later, inside the channel layer) and none holding
NUL (engine_bridge.request.has_nul: refused naming the field, as on the chat socket).
Sampling values go through engine_bridge.sampling, the one owner of defaults and ranges.
"""
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest

from api.errors import ApiError, bad_param
from api.projectors import Choices, Projector
from engine_bridge.request import NUL_REFUSAL, GenerationRequest, has_nul
from engine_bridge.reasoning import mode_for
from engine_bridge.sampling import SamplingError, sampling_validate
from engine_bridge.served import ServedModel

if TYPE_CHECKING:
    from api.surfaces import StopRule, Surface

Body = dict[str, Any]  # a request's JSON object, as body_read checked it

MAX_DEPTH = 64
MAX_BUDGET = (1 << 31) - 1
MAX_CHOICES = 8        # n: independent samples of one request (each a generation of its own)
MAX_TOP_LOGPROBS = 20  # OpenAI's bound for top_logprobs (and ours for Completions' logprobs)
MAX_TOP_K = (1 << 31) - 1


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _path(parent: str, key: object) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)


def _check_tree(body: Body) -> None:
    """Depth and UTF-8 check without recursion (the walk is bounded by the body size)."""
    stack: list[tuple[object, str, int]] = [(body, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise bad_param(path or None, f"the JSON body is nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, str):
            _utf8(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _utf8(key, _path(path, "<key>"))
                stack.append((item, _path(path, key), depth + 1))
        elif isinstance(value, list):
            stack.extend((item, _path(path, i), depth + 1) for i, item in enumerate(value))


def _utf8(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_param(path or None, f"{path or 'the body'} contains a lone UTF-16 surrogate (not valid Unicode text)")
    if has_nul(text):
        raise bad_param(path or None, f"{path or 'the body'} {NUL_REFUSAL}")


def body_parse(raw: bytes | None) -> Body:
    """bytes -> dict, or ApiError(400)."""
    try:
        body = json.loads(raw or b"", parse_constant=_refuse_constant)
    except RecursionError:
        raise ApiError(400, f"invalid JSON request: nested deeper than {MAX_DEPTH} levels")
    except (ValueError, UnicodeDecodeError) as exc:
        detail = str(exc) if "not valid JSON" in str(exc) else ""
        raise ApiError(400, "invalid JSON request" + (f": {detail}" if detail else ""))
    if not isinstance(body, dict):
        raise ApiError(400, "invalid JSON request: the body must be an object")
    _check_tree(body)
    return body


def body_read(django_request: HttpRequest) -> Body:
    """The request's JSON object whatever the Content-Type (curl -d sends a form type), chunked
    bodies included (Daphne gives Django the whole body). Too large -> 413."""
    try:
        raw = django_request.body
    except RequestDataTooBig:
        raise ApiError(413, "request body too large", code="request_too_large")
    return body_parse(raw)


# --- fields -------------------------------------------------------------------------------------

def field_bool(body: Body, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_param(name, f"{name} must be a boolean")
    return value


def field_object(body: Body, name: str) -> dict[str, Any]:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_param(name, f"{name} must be an object")
    return value


def budget(body: Body, names: Iterable[str]) -> int | None:
    """The output budget from the first present field of `names` (the client's own spelling):
    None when omitted, else an int in [0, 2^31-1]. Fractions truncate, huge values clamp."""
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad_param(name, f"{name} must be an integer")
        if value < 0:
            raise bad_param(name, f"{name} must be >= 0")
        if value >= MAX_BUDGET:  # also 1e400, which JSON parses to inf
            return MAX_BUDGET
        return int(value)
    return None


def engine_budget(requested: int | None, served: ServedModel) -> int:
    """What SUBMIT gets: >= 1 (an explicit 0 submits 1 and the projector drops it, which still
    prewarms the KV prefix), at most the served context."""
    ceiling = served.context_length
    return max(1, ceiling if requested is None else min(requested, ceiling))


def stop_list(body: Body, rule: "StopRule | None") -> list[str]:
    """The stop strings under rule.field (an api.surfaces.StopRule; None: the surface takes
    none -> []): a string or a list of non-empty strings, within the rule's bounds."""
    if rule is None:
        return []
    name, limit = rule.field, rule.count
    stop = body.get(name)
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    bad = (not isinstance(stop, list) or (limit is not None and len(stop) > limit)
           or not all(isinstance(s, str) and s for s in stop))
    if bad:
        most = f"up to {limit} " if limit else ""
        raise bad_param(name, f"{name} must be a string or an array of {most}non-empty strings")
    if rule.length is not None:
        for i, s in enumerate(stop):
            if len(s) > rule.length:
                raise bad_param(name, f"{name}[{i}] is {len(s)} characters long; at most {rule.length} are accepted")
    return stop


def sampling(body: Body, *, served: ServedModel,
             names: dict[str, str] | None = None) -> tuple[float, float, int | None]:
    """(temperature, top_p, seed) for the wire, validated by engine_bridge.sampling.
    A seed needs an engine with our extensions (it announces itself with a MODEL line)."""
    names = names or {}
    seed_name = names.get("seed", "seed")
    if body.get(seed_name) is not None and not served.extensions:
        raise bad_param(seed_name, f"{seed_name} is not supported by the engine this server runs")
    try:
        return sampling_validate(
            temperature=body.get(names.get("temperature", "temperature")),
            top_p=body.get(names.get("top_p", "top_p")),
            seed=body.get(seed_name),
            names=names,
            defaults=served.sampling_defaults,  # the served model's recommendation, as the bridge applies it
        )
    except SamplingError as exc:
        raise bad_param(exc.field, exc.message)


def _int_field(body: Body, name: str, low: int, high: int) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad_param(name, f"{name} must be an integer in [{low}, {high}]")
    return value


def _needs_extensions(served: ServedModel, name: str) -> None:
    if not served.extensions:
        raise bad_param(name, f"{name} is not supported by the engine this server runs")


def choices_count(body: Body, name: str = "n") -> int:
    """n: how many independent choices (1 … MAX_CHOICES); omitted or null: 1."""
    return 1 if body.get(name) is None else _int_field(body, name, 1, MAX_CHOICES)


def chat_logprobs(body: Body, *, served: ServedModel) -> int | None:
    """Chat's `logprobs` (bool) + `top_logprobs` (0 … 20) -> None (off) or the candidates per token."""
    want = field_bool(body, "logprobs")
    top = None if body.get("top_logprobs") is None else _int_field(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not want:
        raise bad_param("top_logprobs", "top_logprobs requires logprobs: true")
    if not want:
        return None
    _needs_extensions(served, "logprobs")
    return top or 0


def completion_logprobs(body: Body, *, served: ServedModel) -> int | None:
    """Completions' integer `logprobs` (0 … 20): None when omitted, null, false or 0 (as before)."""
    value = body.get("logprobs")
    if value is None or value is False or value == 0:
        return None
    value = _int_field(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    _needs_extensions(served, "logprobs")
    return value


def top_k(body: Body, *, served: ServedModel, name: str = "top_k") -> int | None:
    """top_k: sample among the k most likely tokens (0 = no cut); None when omitted. Our engine's
    top_k= key: refused naming the field on an engine without our extensions."""
    if body.get(name) is None:
        return None
    value = _int_field(body, name, 0, MAX_TOP_K)
    _needs_extensions(served, name)
    return value


def choice_requests(request: GenerationRequest, n: int) -> list[GenerationRequest]:
    """n independent requests for n choices: the same prompt and sampling, seed + i when seeded
    (reproducible, yet each choice its own sample), else each its engine's default seed."""
    from dataclasses import replace

    if n == 1:
        return [request]
    return [replace(request, seed=None if request.seed is None else (request.seed + i) % (1 << 63))
            for i in range(n)]


def engine_logprobs(k: int | None) -> int:
    """What SUBMIT's logprobs= gets for a client's k candidates (None: off): at least 1, for the
    sampled token's own logprob."""
    return 0 if k is None else max(1, k)


@dataclass
class Extension:
    experts: int | None = None
    topk: bool = False
    routing: bool = False


def colibri_extension(body: Body, *, served: ServedModel) -> Extension:
    """Our own request fields, under `colibri` (documented in the OpenAPI schema): `experts` — routed
    experts per token for this request (the served model's range; omitted = its default) —,
    `topk` (per-token candidates, Chat Completions only) and `routing` (this request's expert
    selection counts, returned in the answer's `colibri.routing`; needs an engine with our
    extensions: refused naming the field otherwise, never silently dropped). -> Extension."""
    ext = field_object(body, "colibri")
    unknown = sorted(set(ext) - {"experts", "topk", "routing"})
    if unknown:
        raise bad_param(f"colibri.{unknown[0]}", f"colibri.{unknown[0]} is not a known field (experts, topk, routing)")
    experts = ext.get("experts")
    if experts is not None:
        if isinstance(experts, bool) or not isinstance(experts, int):
            raise bad_param("colibri.experts", "colibri.experts must be an integer")
        if served.experts_range is None:
            raise bad_param("colibri.experts", "colibri.experts is not supported by the model this server runs")
        low, high = served.experts_range
        if not low <= experts <= high:
            raise bad_param("colibri.experts", f"colibri.experts must be in [{low}, {high}] for this model")
    topk = ext.get("topk", False)
    if not isinstance(topk, bool):
        raise bad_param("colibri.topk", "colibri.topk must be a boolean")
    routing = ext.get("routing", False)
    if not isinstance(routing, bool):
        raise bad_param("colibri.routing", "colibri.routing must be a boolean")
    if routing and not served.extensions:
        raise bad_param("colibri.routing", "colibri.routing is not supported by the engine this server runs "
                        "(it needs our engine's routes extension)")
    return Extension(experts=experts, topk=topk, routing=routing)


def refuse(body: Body, rules: Mapping[str, Callable[[Any], bool]]) -> None:
    """rules: {field: predicate(value) -> True when the value asks for something the engine
    cannot do}. Refused with 400 naming the field, never silently changed (api-surfaces §1.6)."""
    for name, refused in rules.items():
        if name in body and refused(body[name]):
            raise bad_param(name, f"{name} is not supported by this server")


def refuse_tool_choice(value: object, name: str = "tool_choice") -> None:
    """For a surface without tools (legacy Completions; the others read api.tools): only a choice
    that needs none passes (DS4 wording)."""
    if value is None or value in ("auto", "none"):
        return
    if isinstance(value, dict) and value.get("type") in ("auto", "none"):
        return  # Anthropic's spelling
    if value == "required" or (isinstance(value, dict) and value.get("type") == "any"):
        raise bad_param(name, f"{name}=required requires at least one tool")
    if isinstance(value, dict):
        raise bad_param(name, f"forced {name} not supported")
    shown = value if isinstance(value, str) else json.dumps(value)[:40]
    raise bad_param(name, f"{name}={shown} not supported")


def refuse_format(value: object, name: str) -> None:
    """Structured output is not supported: json_object / json_schema / any non-text type (also
    the bare string spelling) -> 400; {"type": "text"}, null and a typeless object pass."""
    if value is None:
        return
    if not isinstance(value, (str, dict)):
        raise bad_param(name, f"{name} must be an object")
    ftype = value if isinstance(value, str) else value.get("type")
    if ftype not in (None, "text"):
        shown = ftype if isinstance(ftype, str) else json.dumps(ftype)[:40]
        raise bad_param(name, f"{name} type {shown!r} is not supported: structured output is unsupported; "
                        f"omit {name} or use type \"text\"")


def model_name(body: Body, name: str = "model") -> str:
    value = body.get(name)
    if value is None:
        raise bad_param(name, f"missing {name}")
    if not isinstance(value, str):
        raise bad_param(name, f"{name} must be a string")
    return value


def message_list(body: Body, *, roles: Collection[str], text_types: Collection[str] = ("text",),
                 rename: dict[str, str] | None = None) -> list[dict[str, str]]:
    """body["messages"] -> [{role, content}] with text content; 400 naming the message or field.
    `rename` maps a client role onto the one the chat template knows (OpenAI's developer)."""
    if "messages" not in body:
        raise bad_param("messages", "missing messages")
    msgs = body["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise bad_param("messages", "messages must be a non-empty array")
    out: list[dict[str, str]] = []
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict):
            raise bad_param(f"messages[{i}]", f"messages[{i}] must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or role not in roles:
            raise bad_param(f"messages[{i}].role", f"messages[{i}].role must be one of {', '.join(sorted(roles))}")
        content = text_parts(msg.get("content"), f"messages[{i}].content", text_types=text_types)
        out.append({"role": (rename or {}).get(role, role), "content": content})
    return out


def text_parts(content: object, path: str, *, text_types: Collection[str] = ("text",),
               image_types: Collection[str] = ("image", "image_url", "input_image")) -> str:
    """A content value (string, or a list of text parts) -> its text. Images and other kinds
    are refused naming the part (a text-only model)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_param(path, f"{path} must be a string or a list of parts")
    texts: list[str] = []
    for j, part in enumerate(content):
        ptype = part.get("type") if isinstance(part, dict) else None
        if ptype in text_types and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(ptype, str) and (ptype in image_types or ptype in ("input_audio", "file", "input_file")):
            raise ApiError(400, f"content type {ptype!r} is not supported by this text-only model",
                           param=f"{path}[{j}]", code="unsupported_content_type")
        else:
            raise bad_param(f"{path}[{j}]", f"{path}[{j}] must be a text part")
    return "".join(texts)


@dataclass
class Call:
    """A parsed surface request: what to submit, how to project it, how to answer."""
    request: GenerationRequest
    projector: Projector | Choices
    stream: bool
    prompt_param: str        # the field a context overflow names (messages / prompt / input)
    # n > 1: one request per choice (the projector is then a Choices); none given: [request]
    requests: list[GenerationRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.requests:
            self.requests = [self.request]


# --- reasoning ----------------------------------------------------------------------------------

EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


@dataclass
class Thinking:
    """A request's reasoning wishes, read from its surface's own field, and the served model's
    reasoning format (`mode`, engine_bridge.reasoning.mode_for: None for a model that does not
    reason, whose requests are then unaffected)."""
    mode: str | None = None
    enabled: bool | None = None  # False: the client asked for no thinking; None: the model's default
    effort: str | None = None    # low | medium | high (harmony's Reasoning: line)
    budget: int | None = None    # Anthropic budget_tokens: the bridge closes the thinking when spent


def _effort(value: object, name: str) -> tuple[bool | None, str | None]:
    """OpenAI's effort words -> (enabled, effort): none turns thinking off, minimal is low."""
    if value is None:
        return None, None
    if value == "none":
        return False, None
    if not isinstance(value, str) or value not in EFFORTS:
        raise bad_param(name, f"{name} must be one of none, minimal, low, medium, high")
    return None, EFFORTS[value]


def _anthropic_thinking(body: Body) -> tuple[bool | None, int | None]:
    config = body.get("thinking")
    if config is None:
        return None, None
    if not isinstance(config, dict):
        raise bad_param("thinking", "thinking must be an object")
    kind = config.get("type")
    if kind == "disabled":
        return False, None
    if kind == "adaptive":
        return None, None
    if kind != "enabled":
        shown = kind if isinstance(kind, str) else json.dumps(kind)[:40]
        raise bad_param("thinking.type", f"thinking.type {shown!r} is not supported (enabled, disabled, adaptive)")
    budget_tokens = config.get("budget_tokens")
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens < 1:
        raise bad_param("thinking.budget_tokens", "thinking.budget_tokens must be a positive integer")
    return True, budget_tokens


def thinking(body: Body, surface: str, served: ServedModel) -> Thinking:
    """The surface's reasoning fields: Chat `reasoning_effort` (and llama-server's
    `chat_template_kwargs.enable_thinking`), Responses `reasoning.effort`, Anthropic `thinking`
    ({type: enabled, budget_tokens} | {type: disabled}). Checked whatever the model; they change
    nothing for a model that does not reason."""
    enabled: bool | None = None
    effort = budget = None
    if surface == "openai_chat":
        enabled, effort = _effort(body.get("reasoning_effort"), "reasoning_effort")
        kwargs = field_object(body, "chat_template_kwargs")
        if "enable_thinking" in kwargs:
            if not isinstance(kwargs["enable_thinking"], bool):
                raise bad_param("chat_template_kwargs.enable_thinking", "chat_template_kwargs.enable_thinking must be a boolean")
            enabled = kwargs["enable_thinking"]
    elif surface == "openai_responses":
        enabled, effort = _effort(field_object(body, "reasoning").get("effort"), "reasoning.effort")
    elif surface == "anthropic_messages":
        enabled, budget = _anthropic_thinking(body)
    return Thinking(mode=mode_for(served.template), enabled=enabled, effort=effort, budget=budget)


# --- the shared step ----------------------------------------------------------------------------

@dataclass
class Common:
    """The fields every generation surface reads alike, in the surface's own spelling (its row in
    api.surfaces names them): one intake step instead of one copy per surface."""
    stream: bool
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    budget: int | None
    ext: Extension
    top_k: int | None
    thinking: Thinking

    def request(self, *, prompt: str, model: str, served: ServedModel, grammar: bytes | None = None,
                logprobs: int | None = None) -> GenerationRequest:
        """The GenerationRequest of these fields and what the surface made of the rest. A
        reasoning model's output is split by the bridge (`reasoning`); a raw prompt (legacy
        Completions, `thinking.mode` None there) is returned as written."""
        return GenerationRequest(
            prompt=prompt, max_tokens=engine_budget(self.budget, served), model=model,
            temperature=self.temperature, top_p=self.top_p, stop=self.stop, seed=self.seed,
            conversation_key=None,  # stateless: the bridge picks a slot by prompt prefix
            priority="interactive", topk=self.ext.topk, experts=self.ext.experts, routes=self.ext.routing,
            top_k=self.top_k, logprobs=engine_logprobs(logprobs), grammar=grammar, reasoning=self.thinking.mode,
            think_budget=self.thinking.budget if self.thinking.mode and grammar is None else None)


def common(body: Body, *, served: ServedModel, surface: "Surface", raw_prompt: bool = False) -> Common:
    """The shared intake step (stream, refused fields, sampling, stop strings, budget, our
    extension, top_k, reasoning). `raw_prompt`: the surface sends the prompt untemplated, so
    its output is not split into reasoning."""
    stream = field_bool(body, "stream")
    refuse(body, surface.refused)
    temperature, top_p, seed = sampling(body, served=served)
    stop = stop_list(body, surface.stop)
    out_budget = budget(body, surface.budget)
    ext = colibri_extension(body, served=served)
    cut = top_k(body, served=served)
    wishes = Thinking() if raw_prompt else thinking(body, surface.name, served)
    return Common(stream=stream, temperature=temperature, top_p=top_p, seed=seed, stop=stop, budget=out_budget,
                  ext=ext, top_k=cut, thinking=wishes)
