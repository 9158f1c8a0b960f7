"""Tool calling on the wire: each surface's `tools`, `tool_choice` and tool history -> one
surface-neutral ToolPlan and neutral messages (engine_bridge.toolsyntax renders them with the
served model's syntax and parses its calls back).

Why one module: the three surfaces spell the same three things differently (Chat nests
`function`, Responses is flat, Anthropic says `input_schema`, `any`, `tool_use` / `tool_result`);
after intake they are the same plan, so a projector and the prompt never look at the spelling.
Invariants: every malformed tool, choice or history item is a 400 naming its field; a tool result
must answer a call made earlier in the conversation (Anthropic: in the previous assistant turn);
`required` / a named tool are held to a grammar (constrained decoding) or refused, never
generated unconstrained and passed off as a call; `none` renders no tools and parses no calls.
Legacy Completions has no tools (the prompt goes raw, there is no template to render them
into): `tools`, `functions` and a tool_choice that needs tools are refused there with a 400.
"""
import json
import re
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from api import intake
from api.errors import bad_param
from engine_bridge import toolsyntax
from engine_bridge.request import GenerationRequest
from engine_bridge.grammar import GrammarError, grammar_for_schema
from engine_bridge.served import ServedModel
from engine_bridge.toolsyntax import Message

Body = intake.Body

NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}\Z")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass
class ToolPlan:
    tools: list[toolsyntax.Tool] = field(default_factory=list)
    choice: str = "none"                         # none | auto | required | named
    name: str | None = None                      # the named tool
    parallel: bool = True
    echo: object = None                          # the request's tool_choice as the surface echoes it
    legacy: bool = False                         # Chat's `functions`: answered as message.function_call

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @property
    def named(self) -> bool:
        return self.choice == "named"

    def parser(self, served: ServedModel, *, new_id: Callable[[int], str]) -> toolsyntax.ToolCallParser | None:
        """A fresh ToolCallParser for one generation, or None (no tools, or tool_choice none)."""
        if not self.active:
            return None
        schemas = {t.name: t.parameters for t in self.tools}
        mode = {"auto": "auto", "required": "calls", "named": "args"}[self.choice]
        return toolsyntax.ToolCallParser(schemas, syntax=toolsyntax.syntax_for(served.template), mode=mode,
                                         forced=self.name, max_calls=None if self.parallel else 1, new_id=new_id)


def new_id(prefix: str) -> Callable[[int], str]:
    return lambda index: prefix + uuid.uuid4().hex[:24]


# --- tools ---------------------------------------------------------------------------------------

def _tool(spec: object, path: str, *, name_key: str = "name", schema_key: str = "parameters",
          schema_required: bool = False) -> toolsyntax.Tool:
    if not isinstance(spec, dict):
        raise bad_param(path, f"{path} must be an object")
    name = spec.get(name_key)
    if not isinstance(name, str) or not NAME.match(name):
        raise bad_param(f"{path}.{name_key}", f"{path}.{name_key} must be 1-128 letters, digits, '_', '-', '.' or ':'")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_param(f"{path}.description", f"{path}.description must be a string")
    if schema_required and schema_key not in spec:
        raise bad_param(f"{path}.{schema_key}", f"missing {path}.{schema_key}")
    schema = spec.get(schema_key)
    if schema is None:
        schema = EMPTY_PARAMETERS
    if not isinstance(schema, dict):
        raise bad_param(f"{path}.{schema_key}", f"{path}.{schema_key} must be a JSON Schema object")
    if schema.get("type", "object") != "object":
        raise bad_param(f"{path}.{schema_key}.type", f"{path}.{schema_key}.type must be \"object\" (arguments are an object)")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_param(f"{path}.strict", f"{path}.strict must be a boolean")
    return toolsyntax.Tool(name=name, description=description or "", parameters=schema)


def _tool_list(value: object, name: str) -> list | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_param(name, f"{name} must be an array")
    return value


def _unique(tools: list[toolsyntax.Tool], name: str) -> list[toolsyntax.Tool]:
    seen = set()
    for i, t in enumerate(tools):
        if t.name in seen:
            raise bad_param(f"{name}[{i}].name", f"{name}[{i}]: the tool name {t.name!r} is used twice")
        seen.add(t.name)
    return tools


def _choice_string(value: object, tools: list[toolsyntax.Tool], name: str) -> str:
    if value in ("none", "auto"):
        return value
    if value == "required":
        if not tools:
            raise bad_param(name, f"{name}=required requires at least one tool")
        return "required"
    raise bad_param(name, f"{name}={str(value)[:40]} not supported")


def _named(tools: list[toolsyntax.Tool], tool_name: object, path: str) -> str:
    if not isinstance(tool_name, str):
        raise bad_param(path, f"{path} must be a string")
    if tool_name not in {t.name for t in tools}:
        raise bad_param(path, f"{path} {tool_name[:64]!r} is not one of the tools")
    return tool_name


def openai_choice(value: object, tools: list[toolsyntax.Tool], name: str = "tool_choice") -> tuple[str, str | None]:
    """Chat and Responses: none | auto | required | {type: function, function: {name}} (Chat) or
    {type: function, name} (Responses; each surface accepts both spellings)."""
    if value is None:
        return ("auto" if tools else "none"), None
    if isinstance(value, str):
        return _choice_string(value, tools, name), None
    if not isinstance(value, dict):
        raise bad_param(name, f"{name} must be a string or an object")
    if value.get("type") != "function":
        shown = value.get("type") if isinstance(value.get("type"), str) else json.dumps(value.get("type"))[:40]
        raise bad_param(f"{name}.type", f"{name}.type {shown!r} is not supported (function)")
    if isinstance(value.get("function"), dict):
        return "named", _named(tools, value["function"].get("name"), f"{name}.function.name")
    return "named", _named(tools, value.get("name"), f"{name}.name")


def chat_plan(body: Body) -> ToolPlan:
    """Chat: tools (or the legacy functions), tool_choice (or function_call), parallel_tool_calls."""
    tools_raw = _tool_list(body.get("tools"), "tools")
    functions = _tool_list(body.get("functions"), "functions")
    if tools_raw is not None and functions is not None:
        raise bad_param("functions", "send tools or the legacy functions, not both")
    tools = []
    for i, spec in enumerate(tools_raw or []):
        if not isinstance(spec, dict):
            raise bad_param(f"tools[{i}]", f"tools[{i}] must be an object")
        if spec.get("type", "function") != "function":
            raise bad_param(f"tools[{i}].type", f"tools[{i}].type {str(spec.get('type'))[:40]!r} is not supported (function)")
        if not isinstance(spec.get("function"), dict):
            raise bad_param(f"tools[{i}].function", f"tools[{i}].function must be an object")
        tools.append(_tool(spec["function"], f"tools[{i}].function"))
    tools += [_tool(spec, f"functions[{i}]") for i, spec in enumerate(functions or [])]
    _unique(tools, "tools" if tools_raw is not None else "functions")
    if "tool_choice" in body and body["tool_choice"] is not None:
        choice, name = openai_choice(body["tool_choice"], tools)
    elif body.get("function_call") is not None:
        legacy = body["function_call"]
        if isinstance(legacy, dict):
            choice, name = "named", _named(tools, legacy.get("name"), "function_call.name")
        elif legacy in ("none", "auto"):
            choice, name = legacy, None
        else:
            raise bad_param("function_call", "function_call must be \"none\", \"auto\" or {\"name\": ...}")
    else:
        choice, name = openai_choice(None, tools)
    legacy = functions is not None
    parallel = intake.field_bool(body, "parallel_tool_calls", True) and not legacy  # legacy: one call
    return ToolPlan(tools=tools, choice=choice, name=name, parallel=parallel, echo=body.get("tool_choice"),
                    legacy=legacy)


def responses_plan(body: Body) -> ToolPlan:
    """Responses: flat function tools; other tool types (web_search, file_search, ...) are refused."""
    tools = []
    for i, spec in enumerate(_tool_list(body.get("tools"), "tools") or []):
        if not isinstance(spec, dict):
            raise bad_param(f"tools[{i}]", f"tools[{i}] must be an object")
        if spec.get("type") != "function":
            raise bad_param(f"tools[{i}].type", f"tools[{i}].type {str(spec.get('type'))[:40]!r} is not supported (function)")
        tools.append(_tool(spec, f"tools[{i}]"))
    _unique(tools, "tools")
    choice, name = openai_choice(body.get("tool_choice"), tools)
    parallel = intake.field_bool(body, "parallel_tool_calls", True)
    echo = body.get("tool_choice") if body.get("tool_choice") is not None else "auto"
    return ToolPlan(tools=tools, choice=choice, name=name, parallel=parallel, echo=echo)


def anthropic_plan(body: Body) -> ToolPlan:
    """Messages: tools with input_schema; tool_choice auto | any | tool | none, and
    disable_parallel_tool_use (at most one call for auto, exactly one for any / tool)."""
    tools = []
    for i, spec in enumerate(_tool_list(body.get("tools"), "tools") or []):
        if isinstance(spec, dict) and spec.get("type") not in (None, "custom"):
            raise bad_param(f"tools[{i}].type", f"tools[{i}].type {str(spec.get('type'))[:40]!r} is not supported (custom)")
        tools.append(_tool(spec, f"tools[{i}]", schema_key="input_schema", schema_required=True))
    _unique(tools, "tools")
    value = body.get("tool_choice")
    if value is None:
        return ToolPlan(tools=tools, choice="auto" if tools else "none")
    if not isinstance(value, dict):
        raise bad_param("tool_choice", "tool_choice must be an object")
    kind = value.get("type")
    disable = value.get("disable_parallel_tool_use") or False
    if not isinstance(disable, bool):
        raise bad_param("tool_choice.disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use must be a boolean")
    if kind in ("auto", "none"):
        return ToolPlan(tools=tools, choice=kind if tools else "none", parallel=not disable)
    if kind == "any":
        if not tools:
            raise bad_param("tool_choice", "tool_choice=any requires at least one tool")
        return ToolPlan(tools=tools, choice="required", parallel=not disable)
    if kind == "tool":
        return ToolPlan(tools=tools, choice="named", name=_named(tools, value.get("name"), "tool_choice.name"),
                        parallel=False)
    shown = kind if isinstance(kind, str) else json.dumps(kind)[:40]
    raise bad_param("tool_choice.type", f"tool_choice.type {shown!r} is not supported (auto, any, tool, none)")


# --- constrained choices ---------------------------------------------------------------------------

def constrain(plan: ToolPlan, request: GenerationRequest, served: ServedModel,
              param: str = "tool_choice") -> GenerationRequest:
    """`required` / a named tool: compile the schema the output is held to and put it on the
    request (engine_bridge.grammar, GenerationRequest.grammar); without constrained decoding in
    this server or its engine: a 400 naming tool_choice, never unconstrained output."""
    if plan.choice not in ("required", "named"):
        return request
    what = "a named tool" if plan.named else "required"
    if not served.grammar:
        raise bad_param(param, f"{param}={what} needs constrained decoding, which the engine this server runs "
                        "does not offer; use tool_choice auto")
    choice = plan.name if plan.named else "required"
    assert choice is not None  # a named plan names its tool (openai_choice, anthropic_plan)
    schema = toolsyntax.forced_schema(plan.tools, choice=choice, parallel=plan.parallel)
    try:
        request.grammar = grammar_for_schema(schema)
    except GrammarError as exc:
        index = next((i for i, t in enumerate(plan.tools) if t.name == plan.name), 0)
        raise bad_param(f"tools[{index}]", f"the tool's parameters schema cannot be enforced: {exc}")
    return request


# --- history ---------------------------------------------------------------------------------------

def _arguments(value: object, path: str) -> dict:
    """A call's arguments (a JSON string, or an object as some clients send) -> dict."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise bad_param(path, f"{path} must be a JSON object encoded as a string")
    if not isinstance(value, dict):
        raise bad_param(path, f"{path} must be a JSON object encoded as a string")
    return value


def _call_id(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad_param(path, f"{path} must be a non-empty string")
    return value


def chat_messages(body: Body, *, roles: Collection[str], text_types: Collection[str],
                  rename: dict[str, str]) -> list[Message]:
    """Chat messages -> neutral messages: assistant `tool_calls` (content may be null),
    `role: tool` results (list content too), the legacy `function_call` / `role: function`."""
    if "messages" not in body:
        raise bad_param("messages", "missing messages")
    msgs = body["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise bad_param("messages", "messages must be a non-empty array")
    out, calls_by_id, legacy_by_name = [], {}, {}
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict):
            raise bad_param(f"messages[{i}]", f"messages[{i}] must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or role not in roles:
            raise bad_param(f"messages[{i}].role", f"messages[{i}].role must be one of {', '.join(sorted(roles))}")
        content = intake.text_parts(msg.get("content"), f"messages[{i}].content", text_types=text_types)
        if role == "assistant" and (msg.get("tool_calls") or msg.get("function_call")):
            calls = []
            raw_calls = msg.get("tool_calls") or []
            if not isinstance(raw_calls, list):
                raise bad_param(f"messages[{i}].tool_calls", f"messages[{i}].tool_calls must be an array")
            for j, call in enumerate(raw_calls):
                path = f"messages[{i}].tool_calls[{j}]"
                if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
                    raise bad_param(path, f"{path} must be an object with a function")
                if call.get("type", "function") != "function":
                    raise bad_param(f"{path}.type", f"{path}.type must be \"function\"")
                name = call["function"].get("name")
                if not isinstance(name, str) or not name:
                    raise bad_param(f"{path}.function.name", f"{path}.function.name must be a non-empty string")
                call_id = _call_id(call.get("id"), f"{path}.id")
                calls.append({"id": call_id, "name": name,
                              "arguments": _arguments(call["function"].get("arguments"), f"{path}.function.arguments")})
                calls_by_id[call_id] = name
            legacy = msg.get("function_call")
            if legacy is not None:
                path = f"messages[{i}].function_call"
                if not isinstance(legacy, dict) or not isinstance(legacy.get("name"), str):
                    raise bad_param(path, f"{path} must be an object with a name")
                call_id = f"call_legacy_{i}"
                calls.append({"id": call_id, "name": legacy["name"],
                              "arguments": _arguments(legacy.get("arguments", "{}"), f"{path}.arguments")})
                legacy_by_name[legacy["name"]] = call_id
                calls_by_id[call_id] = legacy["name"]
            out.append({"role": "assistant", "content": content, "tool_calls": calls, **_chat_reasoning(msg, i)})
        elif role == "tool":
            call_id = _call_id(msg.get("tool_call_id"), f"messages[{i}].tool_call_id")
            if call_id not in calls_by_id:
                raise bad_param(f"messages[{i}].tool_call_id", f"messages[{i}].tool_call_id {call_id[:64]!r} matches "
                                "no tool call of an earlier assistant message")
            out.append({"role": "tool", "tool_call_id": call_id, "name": calls_by_id[call_id], "content": content})
        elif role == "function":
            name = msg.get("name")
            if not isinstance(name, str) or name not in legacy_by_name:
                raise bad_param(f"messages[{i}].name", f"messages[{i}].name must name an earlier function_call")
            out.append({"role": "tool", "tool_call_id": legacy_by_name[name], "name": name, "content": content})
        elif role == "assistant":
            out.append({"role": "assistant", "content": content, **_chat_reasoning(msg, i)})
        else:
            out.append({"role": rename.get(role, role), "content": content})
    return out


def _chat_reasoning(msg: dict, i: int) -> dict[str, str]:
    """An assistant message's thinking sent back: `reasoning_content` (llama-server, DeepSeek) or
    `reasoning` (vLLM) -> the neutral `reasoning` (rendered as the template wants)."""
    for name in ("reasoning_content", "reasoning"):
        value = msg.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise bad_param(f"messages[{i}].{name}", f"messages[{i}].{name} must be a string")
        return {"reasoning": value}
    return {}


def _tool_result_text(block: dict, path: str) -> str:
    content = block.get("content")
    if isinstance(content, list):
        text = intake.text_parts(content, f"{path}.content")
    elif content is None or isinstance(content, str):
        text = content or ""
    else:
        raise bad_param(f"{path}.content", f"{path}.content must be a string or a list of blocks")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise bad_param(f"{path}.is_error", f"{path}.is_error must be a boolean")
    return ("Error: " + text) if is_error else text  # the template has no error flag: say it in words


def anthropic_messages(body: Body) -> list[Message]:
    """Messages -> neutral messages: `tool_use` blocks in assistant turns, `tool_result` blocks
    (string or text-block content, `is_error`) in the user turn after them."""
    if "messages" not in body:
        raise bad_param("messages", "missing messages")
    msgs = body["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise bad_param("messages", "messages must be a non-empty array")
    out: list[Message] = []
    last_calls: dict[str, str] = {}
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict):
            raise bad_param(f"messages[{i}]", f"messages[{i}] must be an object")
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise bad_param(f"messages[{i}].role", f"messages[{i}].role must be one of assistant, user")
        content = msg.get("content")
        blocks = content if isinstance(content, list) else None
        if blocks is None:
            out.append({"role": role, "content": intake.text_parts(content, f"messages[{i}].content")})
            last_calls = {}
            continue
        texts, calls, results, thoughts = [], [], [], []
        for j, block in enumerate(blocks):
            path = f"messages[{i}].content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "thinking" and role == "assistant":
                if not isinstance(block.get("thinking"), str):
                    raise bad_param(f"{path}.thinking", f"{path}.thinking must be a string")
                thoughts.append(block["thinking"])
            elif kind == "redacted_thinking" and role == "assistant":
                continue  # encrypted elsewhere: nothing this server can render
            elif kind == "tool_use" and role == "assistant":
                name = block.get("name")
                if not isinstance(name, str) or not name:
                    raise bad_param(f"{path}.name", f"{path}.name must be a non-empty string")
                if not isinstance(block.get("input"), dict):
                    raise bad_param(f"{path}.input", f"{path}.input must be an object")
                calls.append({"id": _call_id(block.get("id"), f"{path}.id"), "name": name, "arguments": block["input"]})
            elif kind == "tool_result" and role == "user":
                use_id = _call_id(block.get("tool_use_id"), f"{path}.tool_use_id")
                if use_id not in last_calls:
                    raise bad_param(f"{path}.tool_use_id", f"{path}.tool_use_id {use_id[:64]!r} matches no tool_use "
                                    "block of the previous assistant message")
                results.append({"role": "tool", "tool_call_id": use_id, "name": last_calls[use_id],
                                "content": _tool_result_text(block, path)})
            elif kind in ("tool_use", "tool_result"):
                raise bad_param(f"{path}.type", f"{kind} blocks belong in {'assistant' if kind == 'tool_use' else 'user'} messages")
            elif kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            else:  # refused as intake refuses it (images, unknown blocks), naming this block's index
                intake.text_parts([{"type": "text", "text": ""}] * j + [block], f"messages[{i}].content")
        text = "".join(texts)
        if role == "assistant":
            out.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {}),
                        **({"reasoning": "".join(thoughts)} if thoughts else {})})
            last_calls = {c["id"]: c["name"] for c in calls}
        else:
            out += results
            if text or not results:
                out.append({"role": "user", "content": text})
            last_calls = {}
    return out


def responses_items(body: Body, *, roles: Collection[str], text_types: Collection[str]) -> list[Message]:
    """Responses input -> neutral messages: message items, `function_call` items (joined to the
    assistant turn before them) and `function_call_output` items (by call_id)."""
    if "input" not in body or body["input"] is None:
        raise bad_param("input", "missing input")
    items = body["input"]
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_param("input", "input must be a string or a non-empty array of messages")
    out: list[Message] = []
    calls_by_id: dict[str, str] = {}
    thought: str | None = None  # a reasoning item's text, for the assistant turn that follows it
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_param(f"input[{i}]", f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "reasoning":
            thought = (thought or "") + _reasoning_item_text(item, f"input[{i}]")
            continue
        if thought is not None and kind in ("function_call", "message") and item.get("role", "assistant") == "assistant":
            out.append({"role": "assistant", "content": "", "reasoning": thought, "_open": True})
        thought = None
        if kind == "function_call":
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise bad_param(f"input[{i}].name", f"input[{i}].name must be a non-empty string")
            call_id = _call_id(item.get("call_id"), f"input[{i}].call_id")
            call = {"id": call_id, "name": name, "arguments": _arguments(item.get("arguments"), f"input[{i}].arguments")}
            calls_by_id[call_id] = name
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _call_id(item.get("call_id"), f"input[{i}].call_id")
            if call_id not in calls_by_id:
                raise bad_param(f"input[{i}].call_id", f"input[{i}].call_id {call_id[:64]!r} matches no earlier "
                                "function_call item")
            output = item.get("output")
            text = output if isinstance(output, str) else intake.text_parts(output, f"input[{i}].output",
                                                                            text_types=text_types)
            out.append({"role": "tool", "tool_call_id": call_id, "name": calls_by_id[call_id], "content": text})
        elif kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in roles:
                raise bad_param(f"input[{i}].role", f"input[{i}].role must be one of {', '.join(sorted(roles))}")
            content = intake.text_parts(item.get("content"), f"input[{i}].content", text_types=text_types)
            if role == "assistant" and out and out[-1].get("_open") and not out[-1]["content"]:
                out[-1]["content"] = content  # the message its reasoning item came before
            else:
                out.append({"role": "system" if role == "developer" else role, "content": content})
        else:
            raise bad_param(f"input[{i}].type", f"input item type {str(kind)[:40]!r} is not supported by this server")
    for m in out:
        m.pop("_open", None)
    return out


def _reasoning_item_text(item: dict, path: str) -> str:
    """A Responses reasoning item sent back -> its text (its reasoning_text content, else its
    summary's text)."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise bad_param(f"{path}.content", f"{path}.content must be an array")
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise bad_param(f"{path}.content[{j}]", f"{path}.content[{j}] must be a part with text")
        texts.append(part["text"])
    return "".join(texts)


def responses_tools_echo(plan: ToolPlan) -> list[dict[str, Any]]:
    """The response object's `tools` (the flat function form the request used)."""
    return [{"type": "function", "name": t.name, "description": t.description or None, "parameters": t.parameters,
             "strict": True} for t in plan.tools]
