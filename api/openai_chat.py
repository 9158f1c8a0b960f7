"""Parses and validates a Chat Completions body into a GenerationRequest (400s name the field)."""
import json
from dataclasses import dataclass

from api.errors import ApiError, bad_param
from engine_bridge.prompting import TemplateError, render_prompt

ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_BUDGET = (1 << 31) - 1
# Parameters the engine cannot honour: refused, never silently changed (api-surfaces §1.6).
REFUSED = {
    "n": lambda v: v not in (None, 1),
    "logprobs": lambda v: bool(v),
    "top_logprobs": lambda v: v is not None,
    "logit_bias": lambda v: bool(v),
    "frequency_penalty": lambda v: v not in (None, 0, 0.0),
    "presence_penalty": lambda v: v not in (None, 0, 0.0),
    "top_k": lambda v: v is not None,
    "tools": lambda v: bool(v),
}


@dataclass
class ChatCall:
    request: object  # engine_bridge.client.GenerationRequest
    model: str
    stream: bool
    include_usage: bool
    discard_text: bool


def parse_body(raw: bytes):
    """JSON whatever the Content-Type (curl -d sends a form type; SDKs send JSON)."""
    try:
        body = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "invalid JSON request")
    if not isinstance(body, dict):
        raise ApiError(400, "invalid JSON request: the body must be an object")
    return body


def _number(body, name, low, high, *, low_open=False, default):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_param(name, f"{name} must be a number")
    if value > high or value < low or (low_open and value == low):
        raise bad_param(name, f"{name} must be in {'(' if low_open else '['}{low}, {high}]")
    return float(value)


def _content(msg, i):
    content = msg.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_param(f"messages[{i}].content", f"messages[{i}].content must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        ptype = part.get("type") if isinstance(part, dict) else None
        if ptype in ("text", "input_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif ptype in ("image_url", "input_image", "input_audio", "file"):
            raise ApiError(400, f"content type {ptype!r} is not supported by this text-only model",
                           param=f"messages[{i}].content[{j}]", code="unsupported_content_type")
        else:
            raise bad_param(f"messages[{i}].content[{j}]", f"messages[{i}].content[{j}] must be a text part")
    return "".join(texts)


def _messages(body):
    if "messages" not in body:
        raise bad_param("messages", "missing messages")
    msgs = body["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise bad_param("messages", "messages must be a non-empty array")
    out = []
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict):
            raise bad_param(f"messages[{i}]", f"messages[{i}] must be an object")
        role = msg.get("role")
        if role not in ROLES:
            raise bad_param(f"messages[{i}].role", f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}")
        out.append({"role": "system" if role == "developer" else role, "content": _content(msg, i)})
    return out


def _budget(body):
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad_param(name, f"{name} must be an integer")
        if value < 0:
            raise bad_param(name, f"{name} must be >= 0")
        return min(int(value), MAX_BUDGET)  # fractions truncated; huge values clamped, not refused
    return None


def _stop(body):
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise bad_param("stop", "stop must be a string or an array of up to 4 non-empty strings")
    return stop


def _check_refused(body):
    for name, refused in REFUSED.items():
        if name in body and refused(body[name]):
            raise bad_param(name, f"{name} is not supported by this server")
    fmt = body.get("response_format")
    ftype = fmt if isinstance(fmt, str) else (fmt.get("type") if isinstance(fmt, dict) else None)
    if ftype not in (None, "text"):
        raise bad_param("response_format", f"response_format type {ftype!r} is not supported: structured output is "
                        "unsupported; omit response_format or use type \"text\"")


def parse_chat(body, *, served, default_budget):
    from engine_bridge.client import GenerationRequest

    model = body.get("model")
    if model is None:
        raise bad_param("model", "missing model")
    if model not in served["aliases"]:
        raise ApiError(404, f"The model {model!r} does not exist", param="model", code="model_not_found")
    messages = _messages(body)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad_param("stream", "stream must be a boolean")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise bad_param("stream_options", "stream_options must be an object")
    _check_refused(body)
    temperature = _number(body, "temperature", 0, 2, default=0.7)
    top_p = _number(body, "top_p", 0, 1, low_open=True, default=0.9)
    stop = _stop(body)
    budget = _budget(body)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise bad_param("seed", "seed must be an integer in [0, 2^63)")
    extension = body.get("colibri") if isinstance(body.get("colibri"), dict) else {}
    try:
        prompt = render_prompt(messages)
    except TemplateError as exc:
        raise bad_param("messages", str(exc))
    request = GenerationRequest(
        prompt=prompt,
        # Explicit 0: the engine needs >= 1; submit 1 and drop it (prewarms the KV prefix).
        max_tokens=max(1, default_budget if budget is None else min(budget, default_budget)),
        temperature=temperature, top_p=top_p, stop=stop, seed=seed,
        conversation_key=None,  # stateless: the bridge picks a slot by prompt prefix
        priority="interactive", topk=bool(extension.get("topk")),
    )
    return ChatCall(request=request, model=model, stream=stream,
                    include_usage=bool(opts.get("include_usage")), discard_text=budget == 0)
