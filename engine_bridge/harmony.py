"""gpt-oss conversations rendered in the harmony format, as the model's own chat template renders
them (tests/bridge/test_harmony_render.py renders that template with jinja2 through
engine_bridge.prompting's environment and compares byte for byte).

Why in Python and not the template: the template is the model's, shipped in its GGUF, and the
engine may not announce it; the harmony prompt must still be exact, since gpt-oss was trained on
exactly this text. Where the template loses what a client sent, this renderer keeps it and says
so here: an assistant turn with several tool calls renders each call as its own commentary
message (the template renders only the first), and each tool result is addressed from the tool
its call named (the template uses the last call's name for all of them). Everything else follows
the template, quirks included (the TypeScript-ish tool signatures below, whose whitespace the
template's tags leave in).

The format (harmony): `<|start|>ROLE<|message|>…<|end|>`; the system message carries the
reasoning effort, the developer message the instructions and the tools (namespace `functions`);
an assistant turn is a `final` message, or for a call `<|start|>assistant to=functions.NAME
<|channel|>commentary json<|message|>ARGS<|call|>`, its analysis kept only while no later final
answer exists (earlier turns' analysis is dropped); a tool result is `<|start|>functions.NAME
to=assistant<|channel|>commentary<|message|>"…"<|end|>`.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from engine_bridge.prompting import TemplateError

EFFORTS = ("low", "medium", "high")
IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
CUTOFF = "2024-06"
CHANNELS_NOTE = "# Valid channels: analysis, commentary, final. Channel must be included for every message."
TOOLS_NOTE = "\nCalls to these tools must go to the commentary channel: 'functions'."
CHANNEL_TAGS = ("<|channel|>analysis<|message|>", "<|channel|>final<|message|>")
OBJECT_PROP_GAP = "\n" + " " * 16   # the template's whitespace before a nested property's type
VARIANT_DEFAULT_GAP = " " * 20     # before a oneOf variant's default note
Message = dict[str, Any]


def _tojson(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def _text(value: object) -> str:
    """A value as jinja prints it ({{ x }}): str() of it, booleans and None as Python writes them."""
    return value if isinstance(value, str) else str(value)


def _concat(prefix: str, value: object) -> str:
    if not isinstance(value, str):  # the template's `+` of a string and a non-string fails
        raise TemplateError(f"chat template failed: cannot join a {type(value).__name__} to text")
    return prefix + value


def _type_list(spec: dict) -> list | None:
    kind = spec.get("type")
    return list(kind) if isinstance(kind, (list, tuple)) and kind else None


def ts_type(spec: object) -> str:
    """A parameter schema as the template's TypeScript-like type."""
    if not isinstance(spec, dict):
        return "any"
    kind = spec.get("type")
    if kind == "array":
        items = spec.get("items")
        if items:
            item_kind = items.get("type") if isinstance(items, dict) else None
            simple = {"string": "string[]", "number": "number[]", "integer": "number[]", "boolean": "boolean[]"}
            if isinstance(item_kind, str) and item_kind in simple:
                out = simple[item_kind]
            else:
                inner = ts_type(items)
                out = "any[]" if inner == "object | object" or len(inner) > 50 else inner + "[]"
        else:
            out = "any[]"
        return out + (" | null" if spec.get("nullable") else "")
    if (types := _type_list(spec)) is not None:
        return " | ".join(_text(t) for t in types) if len(types) > 1 else _text(types[0])
    if spec.get("oneOf"):
        # The template means to answer `any` for unions of objects, but its flag is set inside
        # a loop and jinja scopes it there: every union renders its variants.
        variants = spec["oneOf"]
        out = ""
        for i, variant in enumerate(variants):
            out += ts_type(variant)
            if isinstance(variant, dict) and variant.get("description"):
                out += _concat("// ", variant["description"])
            if isinstance(variant, dict) and "default" in variant:
                out += VARIANT_DEFAULT_GAP + "// default: " + _tojson(variant["default"])
            if i < len(variants) - 1:
                out += " | \n"
        return out
    if kind == "string":
        if spec.get("enum"):
            return '"' + '" | "'.join(_text(v) for v in spec["enum"]) + '"'
        return "string" + (" | null" if spec.get("nullable") else "")
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "object":
        props = spec.get("properties")
        if not props:
            return "object"
        required = spec.get("required") or []
        parts = []
        for name, prop in props.items():
            parts.append(name + ("" if name in required else "?") + ": " + OBJECT_PROP_GAP + ts_type(prop))
        return "{\n" + ", ".join(parts) + "}"
    return "any"


def _param(name: str, spec: object, required: list) -> str:
    spec_d = spec if isinstance(spec, dict) else {}
    out = _concat("// ", spec_d["description"]) + "\n" if spec_d.get("description") else ""
    out += name + ("" if name in required else "?") + ": " + ts_type(spec)
    if "default" in spec_d:
        if spec_d.get("enum"):
            out += _concat(", // default: ", spec_d["default"])
        elif spec_d.get("oneOf"):
            out += _concat("// default: ", spec_d["default"])
        else:
            out += ", // default: " + _tojson(spec_d["default"])
    return out + ",\n"


def tool_namespace(tools: list[dict], namespace: str = "functions") -> str:
    """The tools (OpenAI Chat form: {"type": "function", "function": {...}}) as the developer
    message declares them."""
    out = f"## {namespace}\n\nnamespace {namespace} {{\n\n"
    for tool in tools:
        fn = tool.get("function", tool)
        out += _concat("// ", fn.get("description")) + "\n"
        out += "type " + fn["name"] + " = "
        params = fn.get("parameters") or {}
        props = params.get("properties") if isinstance(params, dict) else None
        if props:
            required = params.get("required") or []
            out += "(_: {\n" + "".join(_param(name, spec, required) for name, spec in props.items()) + "}) => any;\n\n"
        else:
            out += "() => any;\n\n"
    return out + "} // namespace " + namespace


def system_message(*, effort: str, date: str, tools: bool, identity: str = IDENTITY) -> str:
    body = (f"{identity}\nKnowledge cutoff: {CUTOFF}\nCurrent date: {date}\n\nReasoning: {effort}\n\n"
            + CHANNELS_NOTE + (TOOLS_NOTE if tools else ""))
    return "<|start|>system<|message|>" + body + "<|end|>"


def _check_tags(message: Message) -> None:
    for field in ("content", "thinking"):
        if any(tag in (message.get(field) or "") for tag in CHANNEL_TAGS):
            raise TemplateError(f"an assistant message's {field} holds harmony channel tags; send the analysis "
                                "as its reasoning and the answer as its content")


def _call(call: dict) -> tuple[str, object, str]:
    fn = call.get("function", call)
    return fn["name"], fn.get("arguments", {}), fn.get("content_type", "json")


def render(messages: list[Message], tools: list[dict] | None = None, *, effort: str = "medium",
           date: str | None = None, add_generation_prompt: bool = True, identity: str = IDENTITY) -> str:
    """Messages in the template's form ({"role", "content"}; an assistant turn may carry
    "thinking" (its analysis) and "tool_calls" [{"id", "function": {"name", "arguments": dict}}];
    a tool result "tool_call_id") -> the harmony prompt. Raises TemplateError where the template
    raises."""
    if effort not in EFFORTS:
        raise TemplateError(f"reasoning effort must be one of {', '.join(EFFORTS)}")
    tools = list(tools or [])
    date = date or datetime.now().strftime("%Y-%m-%d")
    out = [system_message(effort=effort, date=date, tools=bool(tools), identity=identity)]
    developer, loop = "", messages
    if messages and messages[0]["role"] in ("developer", "system"):
        developer, loop = messages[0].get("content") or "", messages[1:]
    if developer or tools:
        dev = "# Instructions\n\n" + developer + "\n\n" if developer else ""
        dev += "# Tools\n\n" + tool_namespace(tools) if tools else ""
        out.append("<|start|>developer<|message|>" + dev + "<|end|>")
    last_call: str | None = None
    names: dict[str, str] = {}  # tool_call_id -> the tool it called
    for i, m in enumerate(loop):
        role = m["role"]
        if role == "assistant":
            _check_tags(m)
            if m.get("tool_calls"):
                later_final = any(f["role"] == "assistant" and not f.get("tool_calls") for f in loop[i + 1:])
                content, thinking = m.get("content") or "", m.get("thinking") or ""
                if content and thinking:
                    raise TemplateError("an assistant message with tool calls cannot carry both content and "
                                        "reasoning: put the analysis in one of them")
                if (content or thinking) and not later_final:
                    out.append("<|start|>assistant<|channel|>analysis<|message|>" + (content or thinking) + "<|end|>")
                for call in m["tool_calls"]:
                    name, arguments, ctype = _call(call)
                    out.append(f"<|start|>assistant to=functions.{name}<|channel|>commentary {ctype}<|message|>"
                               + _tojson(arguments) + "<|call|>")
                    names[call.get("id") or ""] = last_call = name
            elif i == len(loop) - 1 and not add_generation_prompt:
                if "thinking" in m:
                    out.append("<|start|>assistant<|channel|>analysis<|message|>" + (m["thinking"] or "") + "<|end|>")
                out.append("<|start|>assistant<|channel|>final<|message|>" + (m.get("content") or "") + "<|return|>")
            else:
                out.append("<|start|>assistant<|channel|>final<|message|>" + (m.get("content") or "") + "<|end|>")
                last_call = None
        elif role == "tool":
            if last_call is None:
                raise TemplateError("a tool message must follow an assistant message with a tool call")
            called = names.get(m.get("tool_call_id") or "", last_call)
            out.append(f"<|start|>functions.{called} to=assistant<|channel|>commentary<|message|>"
                       + _tojson(m.get("content") or "") + "<|end|>")
        elif role == "user":
            out.append("<|start|>user<|message|>" + (m.get("content") or "") + "<|end|>")
        # a system or developer message after the first is not rendered (as the template does)
    if add_generation_prompt:
        out.append("<|start|>assistant")
    return "".join(out)


def constrained_header(*, tool: str | None = None, calls: bool = False) -> str:
    """What a harmony prompt ends with when a grammar holds the output (the grammar knows JSON,
    not harmony's headers): the header of the one message the output is, so the model writes its
    body only. A named tool: its call's commentary header; `required` (a JSON array of calls):
    a commentary message; a response format: the final answer."""
    if tool is not None:
        return f"<|channel|>commentary to=functions.{tool} <|constrain|>json<|message|>"
    if calls:
        return "<|channel|>commentary<|message|>"
    return "<|channel|>final<|message|>"
