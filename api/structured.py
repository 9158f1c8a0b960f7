"""Structured output on the OpenAI surfaces: Chat's `response_format` and Responses' `text.format`
-> the wire grammar (engine_bridge.grammar) that constrains the engine's sampling.

    {"type": "json_schema", "json_schema": {name, schema, strict}}   Chat Completions
    {"type": "json_schema", name, schema, strict}                    Responses text.format (flat)
    {"type": "json_object"}                                          both
    {"type": "text"} / null / absent                                 no grammar

Invariants: a malformed format or schema is a 400 naming the field (`response_format.json_schema
.schema.properties.x.maxLength`); an engine that does not announce the grammar extension (the
real colibri binary) gets a 400 refusal ("refused mode"), never unconstrained output passed off
as valid JSON; `strict` is accepted either way (the output is always constrained).
"""
from api.errors import ApiError, bad_param
from engine_bridge.grammar import GrammarError, grammar_for_json_object, grammar_for_schema
from engine_bridge.served import ServedModel

REFUSED_MESSAGE = ("{name} type {kind!r} needs constrained decoding, which the engine this server runs does not "
                   "support; omit {name} or use type \"text\"")


def _schema_of(value: dict, name: str, *, flat: bool) -> tuple[dict | bool, str]:
    """(schema, its field path) of a json_schema format."""
    spec: object
    if flat:
        spec, base = value, name
    else:
        spec, base = value.get("json_schema"), f"{name}.json_schema"
        if not isinstance(spec, dict):
            raise bad_param(base, f"{base} must be an object with name and schema")
    label = spec.get("name")
    if label is not None and not isinstance(label, str):
        raise bad_param(f"{base}.name", f"{base}.name must be a string")
    if "strict" in spec and spec["strict"] is not None and not isinstance(spec["strict"], bool):
        raise bad_param(f"{base}.strict", f"{base}.strict must be a boolean")
    if flat and "schema" not in spec:
        raise bad_param(f"{base}.schema", f"{base}.schema is required for type json_schema")
    schema = spec.get("schema", {})
    if not isinstance(schema, (dict, bool)):
        raise bad_param(f"{base}.schema", f"{base}.schema must be a JSON Schema object")
    return schema, f"{base}.schema"


def grammar_for(value: object, name: str, *, served: ServedModel, flat: bool = False) -> bytes | None:
    """The grammar a format asks for (None: plain text), or ApiError 400 naming the field."""
    if value is None:
        return None
    if isinstance(value, str):  # a bare spelling: only "text" means something
        if value == "text":
            return None
        raise bad_param(name, f"{name} type {value[:40]!r} is not supported as a string; "
                        f"send an object such as {{\"type\": \"json_object\"}}")
    if not isinstance(value, dict):
        raise bad_param(name, f"{name} must be an object")
    kind = value.get("type")
    if kind in (None, "text"):
        return None
    if kind not in ("json_schema", "json_object"):
        shown = kind if isinstance(kind, str) else str(kind)[:40]
        raise bad_param(name, f"{name} type {shown!r} is not supported (text, json_object, json_schema)")
    if not getattr(served, "grammar", False):  # first: no schema work for an engine that cannot use it
        raise ApiError(400, REFUSED_MESSAGE.format(name=name, kind=kind), param=name,
                       code="structured_output_unsupported")
    schema, path = _schema_of(value, name, flat=flat) if kind == "json_schema" else (None, name)
    try:
        return grammar_for_json_object() if schema is None else grammar_for_schema(schema)
    except GrammarError as exc:
        field = f"{path}.{exc.field}" if exc.field else path
        raise bad_param(field, f"{field}: {exc.message}") from None
