"""Validation of client frames on /ws/chat/ (docs/contracts.md). Pure functions, no I/O.

Every string must be encodable as UTF-8 (json accepts lone surrogates, the database does not) and
free of NUL (PostgreSQL text cannot hold it: refused naming the field, as on every surface), and
every id must fit the database's bigint; sampling values follow engine_bridge.sampling, the one
owner of their rules, so a frame that passes here can neither break a save nor the engine.
"""
from typing import Any

from engine_bridge import sampling
from engine_bridge.request import NUL_REFUSAL, encodable, has_nul

MAX_TEXT_CHARS = 100_000
FRAME_FIELDS = {
    # model / system_prompt (optional): the conversation's own, set before the turn (a New chat's
    # picker choice travels with its first message); absent or null: unchanged.
    "send": {"conversation": "id_or_null", "text": "text", "params": "params", "model": "string_or_null",
             "system_prompt": "string_or_null"},
    "stop": {"conversation": "id"},
    "regenerate": {"conversation": "id", "params": "params"},
    "edit": {"conversation": "id", "message": "id", "text": "text", "params": "params"},
    "open": {"conversation": "id"},
}
MAX_ID = (1 << 63) - 1
MAX_TOKENS_LIMIT = 1 << 20
MAX_EXPERTS = 1024  # a sanity bound; the bridge checks the served model's own range
PARAM_RULES = {
    "temperature": sampling.wire_temperature,
    "top_p": sampling.wire_top_p,
}


class FrameError(ValueError):
    def __init__(self, field: str, detail: str) -> None:
        super().__init__(detail)
        self.field, self.detail = field, detail


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_ID


def _experts(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_EXPERTS:
        raise FrameError(field, f"{field} must be an integer in [1, {MAX_EXPERTS}]")
    return value


def _max_tokens(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FrameError(field, f"{field} must be an integer")
    if not 1 <= value <= MAX_TOKENS_LIMIT:
        raise FrameError(field, f"{field} must be in [1, {MAX_TOKENS_LIMIT}]")
    return value


def _check_params(params: object) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise FrameError("params", "params must be an object")
    out: dict[str, Any] = {}
    for name, value in params.items():
        field = f"params.{name}"
        if name not in (*PARAM_RULES, "max_tokens", "experts"):
            raise FrameError(field, f"unknown parameter {field}")
        if value is None:
            continue
        if name == "max_tokens":
            out[name] = _max_tokens(value, field)
            continue
        if name == "experts":
            out[name] = _experts(value, field)
            continue
        try:
            out[name] = PARAM_RULES[name](value, field)
        except sampling.SamplingError as exc:
            raise FrameError(exc.field, exc.message) from None
    return out


def parse(frame: object) -> tuple[str, dict[str, Any]]:
    """Returns (type, cleaned fields) or raises FrameError naming the bad field."""
    if not isinstance(frame, dict):
        raise FrameError("type", "frame must be a JSON object")
    kind = frame.get("type")
    if not isinstance(kind, str) or kind not in FRAME_FIELDS:
        raise FrameError("type", f"unknown frame type; expected one of {', '.join(FRAME_FIELDS)}")
    out: dict[str, Any] = {}
    for name, rule in FRAME_FIELDS[kind].items():
        value = frame.get(name)
        if rule == "id" and not _is_id(value):
            raise FrameError(name, f"{name} must be a positive integer id")
        if rule == "id_or_null" and value is not None and not _is_id(value):
            raise FrameError(name, f"{name} must be a positive integer id or null")
        if rule == "text":
            if not isinstance(value, str) or not value.strip():
                raise FrameError(name, f"{name} must be a non-empty string")
            if not encodable(value):
                raise FrameError(name, f"{name} is not valid Unicode (it contains a lone surrogate)")
            if has_nul(value):
                raise FrameError(name, f"{name} {NUL_REFUSAL}")
            if len(value) > MAX_TEXT_CHARS:
                raise FrameError(name, f"{name} is longer than {MAX_TEXT_CHARS} characters")
        if rule == "params":
            value = _check_params(value)
        if rule == "string_or_null" and value is not None and not isinstance(value, str):
            raise FrameError(name, f"{name} must be a string or null")
        out[name] = value
    return kind, out
