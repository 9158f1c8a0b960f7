"""Validation of client frames on /ws/chat/ (docs/contracts.md). Pure functions, no I/O."""

MAX_TEXT_CHARS = 100_000
FRAME_FIELDS = {
    "send": {"conversation": "id_or_null", "text": "text", "params": "params"},
    "stop": {"conversation": "id"},
    "regenerate": {"conversation": "id", "params": "params"},
    "edit": {"conversation": "id", "message": "id", "text": "text", "params": "params"},
    "open": {"conversation": "id"},
}
PARAM_RANGES = {
    # name: (type check, low, high, low inclusive)
    "temperature": ((int, float), 0.0, 2.0, True),
    "top_p": ((int, float), 0.0, 1.0, False),
    "max_tokens": ((int,), 1, 1 << 20, True),
}


class FrameError(ValueError):
    def __init__(self, field, detail):
        super().__init__(detail)
        self.field, self.detail = field, detail


def _is_id(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_params(params):
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise FrameError("params", "params must be an object")
    out = {}
    for name, value in params.items():
        if name not in PARAM_RANGES:
            raise FrameError(f"params.{name}", f"unknown parameter params.{name}")
        if value is None:
            continue
        types, low, high, low_inclusive = PARAM_RANGES[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise FrameError(f"params.{name}", f"params.{name} must be a number" + (" (integer)" if types == (int,) else ""))
        if value > high or value < low or (value == low and not low_inclusive):
            bracket = "[" if low_inclusive else "("
            raise FrameError(f"params.{name}", f"params.{name} must be in {bracket}{low}, {high}]")
        out[name] = value
    return out


def parse(frame):
    """Returns (type, cleaned fields) or raises FrameError naming the bad field."""
    if not isinstance(frame, dict):
        raise FrameError("type", "frame must be a JSON object")
    kind = frame.get("type")
    if kind not in FRAME_FIELDS:
        raise FrameError("type", f"unknown frame type {kind!r}")
    out = {}
    for name, rule in FRAME_FIELDS[kind].items():
        value = frame.get(name)
        if rule == "id" and not _is_id(value):
            raise FrameError(name, f"{name} must be a positive integer id")
        if rule == "id_or_null" and value is not None and not _is_id(value):
            raise FrameError(name, f"{name} must be a positive integer id or null")
        if rule == "text":
            if not isinstance(value, str) or not value.strip():
                raise FrameError(name, f"{name} must be a non-empty string")
            if len(value) > MAX_TEXT_CHARS:
                raise FrameError(name, f"{name} is longer than {MAX_TEXT_CHARS} characters")
        if rule == "params":
            value = _check_params(value)
        out[name] = value
    return kind, out
