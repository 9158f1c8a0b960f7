"""The served model's tool-call syntax: rendering tools, past calls and tool results into the
prompt, and parsing calls back out of the model's text as it is written.

Syntax choice (sniffing the template source, as llama.cpp's first tool-call era did):
* `<arg_key>` in the template -> "glm45": `<tool_call>name\\n<arg_key>k</arg_key>\\n<arg_value>v
  </arg_value>...</tool_call>` (GLM-4.5; the template iterates arguments.items(), so arguments are
  passed as a mapping);
* `<tool_call>` and `tools` -> "hermes": `<tool_call>\\n{"name": n, "arguments": {...}}\\n
  </tool_call>` (Qwen 2.5 / Qwen3 / Hermes 2 Pro; arguments passed as a mapping, which both the
  Qwen2.5 `tojson` and the Qwen3 string-or-mapping templates render once, never double-encoded);
* anything else -> "generic" (ChatML templates that never read `tools`, such as the default
  SmolLM2 model): a system note lists the tools as JSON and shows the exact call form, which is
  the hermes form; past calls become assistant content in that form; tool results become a user
  message of `<tool_response>` blocks (every template renders a user turn); null content -> "".

Invariant: rendering is a pure function of (messages, tools, syntax), so the history of turn N+1
renders byte-identically whenever the client replays turn N unchanged (the KV-prefix rule of
engine_bridge.prompting). Arguments are re-serialised with json.dumps, so a call the model wrote
with other spacing re-renders canonically: the prefix still matches up to that call.

The parser (ToolCallParser) is fed the text deltas the model writes and returns events: Text,
CallStart (index, id, name), CallArgs (a fragment of the arguments' JSON text), CallEnd. It holds
back only a suffix that could begin a call marker (and trailing whitespace, dropped around calls),
so a call's events appear while it is generated. A call is committed (CallStart sent) once its
name is known and is one of the tools and its arguments object has begun; every fragment after
that is a valid JSON prefix (checked character by character). What cannot be parsed comes back as
Text, never dropped: a call that breaks after its start ends with CallEnd(ok=False) followed by
its raw text. The modes: "auto" (calls in the model's syntax among text), "args" (a forced named
call: the whole output is its arguments object) and "calls" (tool_choice required: the output is
a JSON array of {"name", "arguments"}), the last two for grammar-constrained output.
"""
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine_bridge.reasoning import mode_for
from engine_bridge.served import ServedModel

Message = dict[str, Any]  # a neutral message (see prepare)

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
ARG_KEY, ARG_KEY_END = "<arg_key>", "</arg_key>"
ARG_VALUE, ARG_VALUE_END = "<arg_value>", "</arg_value>"
WS = " \t\r\n"
ARG_KEYS = ("arguments", "parameters")  # some models write the schema's word


def syntax_for(template: str | None) -> str:
    """'harmony' | 'glm45' | 'hermes' | 'generic' from the chat template's source."""
    template = template or ""
    if mode_for(template) == "harmony":
        return "harmony"
    if ARG_KEY in template and CALL_OPEN in template:
        return "glm45"
    if CALL_OPEN in template and "tools" in template:
        return "hermes"
    return "generic"


# --- rendering ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})

    def openai(self) -> dict[str, Any]:
        """The OpenAI Chat form every tool-aware template reads."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


def call_text(name: str, arguments: object) -> str:
    """One call in the hermes / generic form (what the system note shows and past calls become)."""
    return CALL_OPEN + "\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n" + CALL_CLOSE


def generic_note(tools: Iterable[Tool]) -> str:
    lines = ["You can call tools. The available tools, one JSON object per line:"]
    lines += [json.dumps(t.openai(), ensure_ascii=False) for t in tools]
    lines.append("To call a tool, write exactly this, one block per call, and nothing else in the block:")
    lines.append(call_text("<tool name>", {"<argument>": "<value>"}))
    lines.append("Tool results come back inside <tool_response></tool_response>.")
    return "\n".join(lines)


def _tool_response(message: Message) -> str:
    body = {"name": message.get("name") or "", "content": message.get("content") or ""}
    return "<tool_response>\n" + json.dumps(body, ensure_ascii=False) + "\n</tool_response>"


def prepare(messages: Iterable[Message], tools: Iterable[Tool] | None,
            syntax: str) -> tuple[list[Message], dict[str, Any]]:
    """Neutral messages -> (messages for the template, extra template variables).

    Neutral messages: {"role": system|user|assistant, "content": str}, an assistant turn may add
    "tool_calls": [{"id", "name", "arguments": dict}] and "reasoning" (its thinking: the
    template's `reasoning_content`, harmony's `thinking`), and {"role": "tool", "tool_call_id",
    "name", "content": str} is a tool result."""
    tools = list(tools or ())
    if syntax == "generic":
        return _prepare_generic(messages, tools), {}
    thought = "thinking" if syntax == "harmony" else "reasoning_content"
    out: list[Message] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                     for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": m.get("content") or "", "tool_calls": calls,
                        **_thought(m, thought)})
        elif m["role"] == "assistant":
            out.append({"role": "assistant", "content": m.get("content") or "", **_thought(m, thought)})
        elif m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": m.get("tool_call_id") or "", "name": m.get("name") or "",
                        "content": m.get("content") or ""})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return out, ({"tools": [t.openai() for t in tools]} if tools else {})


def _thought(m: Message, key: str) -> dict[str, str]:
    return {key: m["reasoning"]} if isinstance(m.get("reasoning"), str) else {}


def render(messages: Iterable[Message], tools: Iterable[Tool] | None, served: ServedModel, *,
           thinking: bool | None = None, effort: str | None = None, prefill: str = "") -> str:
    """Neutral messages (and the tools to offer) -> the prompt in the served model's template and
    tool syntax (served: engine_bridge.served.ServedModel). The one composition of prepare and the
    template, for the API surfaces and the chat page alike. Raises prompting.TemplateError.

    Reasoning models: `thinking` False asks for none (the template's `enable_thinking=false`;
    harmony cannot turn it off and gets effort low); `effort` low | medium | high is harmony's
    `Reasoning:` line (default medium). Harmony conversations are rendered by
    engine_bridge.harmony (byte-equal to gpt-oss's template). `prefill`: text the prompt ends
    with (a harmony header a constrained output starts in, engine_bridge.harmony.constrained_header)."""
    from engine_bridge import harmony
    from engine_bridge.prompting import render_prompt

    syntax = syntax_for(served.template)
    prepared, extra = prepare(messages, tools, syntax)
    if syntax == "harmony":
        level = effort or ("low" if thinking is False else "medium")
        return harmony.render(prepared, extra.get("tools"), effort=level) + prefill
    if thinking is False:
        extra["enable_thinking"] = False
    return render_prompt(prepared, template=served.template, bos_token=served.bos_token,
                         eos_token=served.eos_token, extra=extra) + prefill


def _prepare_generic(messages: Iterable[Message], tools: list[Tool]) -> list[Message]:
    out: list[Message] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            parts = [m["content"]] if m.get("content") else []
            parts += [call_text(c["name"], c["arguments"]) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif m["role"] == "tool":
            block = _tool_response(m)
            if out and out[-1].get("_results"):  # consecutive results: one user turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_results": True})
        else:
            out.append({"role": m["role"], "content": m.get("content") or "", **_thought(m, "reasoning")})
    out = [{"role": m["role"], "content": m["content"], **_thought(m, "reasoning_content")} for m in out]
    if tools:
        note = generic_note(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + note}
        else:
            out.insert(0, {"role": "system", "content": note})
    return out


# --- incremental JSON syntax check --------------------------------------------------------------

_VALUE, _VALUE_OR_END, _KEY_OR_END, _KEY, _COLON, _AFTER, _STR, _KEY_STR, _ATOM = range(9)
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?\Z")
_NUMBER_PREFIX = re.compile(r"-?(0|[1-9][0-9]*)?(\.[0-9]*)?([eE][+-]?[0-9]*)?\Z")
_LITERALS = ("true", "false", "null")
_ATOM_CHARS = frozenset("-+.0123456789eEtrufalsn")


class BadJson(ValueError):
    pass


ScanEvent = tuple[str, int, str | None]  # (kind, depth, key): see JsonScan


class JsonScan:
    """One JSON value checked a character at a time. push(ch) -> events, each (kind, depth, key):
    ("vstart", d, None) a value begins at container depth d, ("vend", d, None) it ends, ("key", d,
    text) an object key at depth d (its value then starts at d); raises BadJson at the first
    character that no valid JSON continues. `done` once the top value is complete (a top-level
    atom: after close())."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.state = _VALUE
        self.atom = ""
        self.esc = 0
        self.key: list[str] = []
        self.done = False

    def push(self, ch: str) -> list[ScanEvent]:
        ev: list[ScanEvent] = []
        st = self.state
        if st in (_STR, _KEY_STR):
            if self.esc == 1:
                if ch == "u":
                    self.esc = 5
                elif ch in '"\\/bfnrt':
                    self.esc = 0
                else:
                    raise BadJson(ch)
            elif self.esc > 1:
                if ch not in "0123456789abcdefABCDEF":
                    raise BadJson(ch)
                self.esc = 0 if self.esc == 2 else self.esc - 1
            elif ch == "\\":
                self.esc = 1
            elif ch == '"':
                if st == _KEY_STR:
                    ev.append(("key", len(self.stack), json.loads('"' + "".join(self.key) + '"')))
                    self.key = []
                    self.state = _COLON
                else:
                    self._after(ev)
                return ev
            elif ord(ch) < 0x20:
                raise BadJson(ch)
            if st == _KEY_STR:
                self.key.append(ch)
            return ev
        if st == _ATOM:
            if ch in _ATOM_CHARS:
                self.atom += ch
                if not (_NUMBER_PREFIX.match(self.atom) or any(w.startswith(self.atom) for w in _LITERALS)):
                    raise BadJson(ch)
                return ev
            self._end_atom(ev)
            st = self.state
        if ch in WS:
            return ev
        if self.done:
            raise BadJson(ch)
        if st == _VALUE_OR_END and ch == "]":
            self.stack.pop()
            self._after(ev)
        elif st in (_VALUE, _VALUE_OR_END):
            ev.append(("vstart", len(self.stack), None))
            if ch == "{":
                self.stack.append("{")
                self.state = _KEY_OR_END
            elif ch == "[":
                self.stack.append("[")
                self.state = _VALUE_OR_END
            elif ch == '"':
                self.state = _STR
            elif ch in "-0123456789tfn":
                self.state, self.atom = _ATOM, ch
            else:
                raise BadJson(ch)
        elif st in (_KEY_OR_END, _KEY):
            if ch == '"':
                self.state = _KEY_STR
            elif ch == "}" and st == _KEY_OR_END:
                self.stack.pop()
                self._after(ev)
            else:
                raise BadJson(ch)
        elif st == _COLON:
            if ch != ":":
                raise BadJson(ch)
            self.state = _VALUE
        elif st == _AFTER:
            top = self.stack[-1]
            if ch == ",":
                self.state = _KEY if top == "{" else _VALUE
            elif (ch == "}" and top == "{") or (ch == "]" and top == "["):
                self.stack.pop()
                self._after(ev)
            else:
                raise BadJson(ch)
        return ev

    def _after(self, ev: list[ScanEvent]) -> None:
        ev.append(("vend", len(self.stack), None))
        self.state = _AFTER
        if not self.stack:
            self.done = True

    def _end_atom(self, ev: list[ScanEvent]) -> None:
        if not (_NUMBER.match(self.atom) or self.atom in _LITERALS):
            raise BadJson(self.atom)
        self._after(ev)

    def close(self) -> None:
        """End of input: completes a top-level atom; raises BadJson if the value is unfinished."""
        if self.state == _ATOM:
            self._end_atom([])
        if not self.done:
            raise BadJson("unfinished")


# --- parser events ------------------------------------------------------------------------------

@dataclass
class Text:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class CallArgs:
    index: int
    delta: str


@dataclass
class CallEnd:
    index: int
    arguments: str  # the whole arguments JSON text ("" when broken)
    ok: bool = True


ParserEvent = Text | CallStart | CallArgs | CallEnd


@dataclass
class Call:
    index: int
    id: str
    name: str
    arguments: str = ""
    ok: bool = False
    done: bool = False


def default_id(index: int) -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class _CallObject:
    """Tracks one {"name": ..., "arguments": {...}} object inside a JsonScan, the object's own
    value at depth `base`: its name, and where its arguments' text begins and ends in raw."""

    def __init__(self, base: int, start: int = 0) -> None:
        self.base = base
        self.start = start      # offset of the object's "{" in raw
        self.key: str | None = None
        self.name: str | None = None
        self.name_start: int | None = None
        self.args_start: int | None = None
        self.args_end: int | None = None
        self.args_object = False

    def on(self, events: Iterable[ScanEvent], pos: int, raw: str) -> None:
        """events: what the character at raw[pos] produced."""
        inner = self.base + 1
        for kind, depth, key in events:
            if depth != inner:
                continue
            if kind == "key":
                self.key = key
            elif kind == "vstart":
                if self.key == "name":
                    self.name_start = pos
                elif self.key in ARG_KEYS and self.args_start is None:
                    self.args_start = pos
                    self.args_object = raw[pos] == "{"
            elif kind == "vend":
                if self.key == "name" and self.name_start is not None and self.name is None:
                    try:
                        name = json.loads(raw[self.name_start:pos + 1])
                    except ValueError:
                        name = None
                    self.name = name if isinstance(name, str) else ""
                elif self.key in ARG_KEYS and self.args_start is not None and self.args_end is None:
                    self.args_end = pos + 1


class ToolCallParser:
    """Incremental tool-call parser for one generation (see the module docstring).

    tools: {name: parameters schema}; syntax: hermes | generic | glm45; mode: auto | args | calls;
    forced: the tool name in "args" mode; max_calls: 1 when parallel calls are off (later markers
    are then plain text); new_id(index) -> the call's id. After finish(): `text` (the content),
    `calls` (every started call; `ok_calls` the complete ones) and `cut` (the output ended inside
    a call)."""

    def __init__(self, tools: Mapping[str, Any] | Iterable[tuple[str, Any]], *, syntax: str = "generic",
                 mode: str = "auto", forced: str | None = None, max_calls: int | None = None,
                 new_id: Callable[[int], str] = default_id) -> None:
        self.tools = dict(tools)
        self.syntax = syntax
        self.mode = mode
        self.forced = forced
        self.max_calls = max_calls
        self.new_id = new_id
        self.calls: list[Call] = []
        self.parts: list[str] = []
        self.pending = ""   # held back: a possible marker prefix, trailing whitespace, a JSON tail
        self.state = "text" if mode == "auto" else "json"
        self.raw = ""       # the current call's text after its marker (json modes: the whole output)
        self.began = False  # the current JSON value has had its first non-space character
        self.scan: JsonScan | None = JsonScan() if mode != "auto" else None
        self.obj: _CallObject | None = None
        self.call: Call | None = None
        self.sent = 0       # offset in raw up to which the current call's arguments went out
        self.glm: dict[str, Any] | None = None
        self.cut = False

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def ok_calls(self) -> list[Call]:
        return [c for c in self.calls if c.ok]

    def feed(self, delta: str) -> list[ParserEvent]:
        out: list[ParserEvent] = []
        if delta:
            if self.state in ("json", "sink"):
                self._json_feed(delta, out)
            else:
                self._marker_feed(delta, out)
        return out

    def finish(self) -> list[ParserEvent]:
        """End of the output: what was held back, and a cut call as CallEnd(ok=False) + Text."""
        out: list[ParserEvent] = []
        if self.state == "json":
            assert self.scan is not None  # json modes make theirs at the start
            try:
                self.scan.close()
            except BadJson:
                self.cut = True
                self._json_break(out)
            else:
                if self.call is not None:  # a top-level atom completed only now: not a call
                    self._end(out)
        elif self.state == "text":
            if self.pending.strip() or not self.calls:
                self._text(self.pending, out)
        elif self.state == "call":
            self.cut = True
            self._break(CALL_OPEN + self.raw, out)
        if self.state == "sink" and self.pending.strip():
            self._text(self.pending, out)
        self.pending = ""
        self.state = "end"
        return out

    # -- text

    def _text(self, text: str, out: list[ParserEvent]) -> None:
        if text:
            self.parts.append(text)
            if out and isinstance(out[-1], Text):
                out[-1].text += text
            else:
                out.append(Text(text))

    def _can_call(self) -> bool:
        return self.max_calls is None or len(self.ok_calls) < self.max_calls

    def _marker_feed(self, delta: str, out: list[ParserEvent]) -> None:
        buf = self.pending + delta
        self.pending = ""
        while buf:
            if self.state == "text":
                at = buf.find(CALL_OPEN) if self._can_call() else -1
                if at < 0:
                    hold = _partial_suffix(buf, CALL_OPEN) if self._can_call() else 0
                    body = buf[:len(buf) - hold]
                    stripped = body.rstrip(WS)
                    self._text(stripped, out)
                    self.pending = body[len(stripped):] + buf[len(buf) - hold:]
                    return
                if buf[:at].strip():
                    self._text(buf[:at].rstrip(WS), out)
                self._open_call()
                buf = buf[at + len(CALL_OPEN):]
            elif self.state == "call":
                buf = self._glm_feed(buf, out) if self.syntax == "glm45" else self._call_feed(buf, out)
            else:  # "after": between a call's end and its closing marker
                rest = buf.lstrip(WS)
                if not rest:
                    return
                if rest.startswith(CALL_CLOSE):
                    buf = rest[len(CALL_CLOSE):]
                    self.state = "text"
                elif CALL_CLOSE.startswith(rest):
                    self.pending = rest
                    return
                else:
                    self.state, buf = "text", rest

    def _open_call(self) -> None:
        self.state = "call"
        self.raw = ""
        self.began = False
        self.call = None
        self.sent = 0
        if self.syntax == "glm45":
            self.glm = {"stage": "name", "data": "", "nargs": 0, "key": None, "value": "", "string": False}
        else:
            self.scan, self.obj = JsonScan(), _CallObject(0)

    # -- hermes / generic: one JSON object between the markers

    def _call_feed(self, buf: str, out: list[ParserEvent]) -> str:
        assert self.scan is not None and self.obj is not None  # _open_call made them
        base = len(self.raw)
        self.raw += buf
        for i, ch in enumerate(buf):
            pos = base + i
            try:
                events = self.scan.push(ch)
                if not self.began and ch not in WS:
                    self.began = True
                    if ch != "{":
                        raise BadJson(ch)
            except BadJson:
                self.raw = self.raw[:pos]
                self._flush_args(out)  # up to, not including, the character that broke it
                self.raw += ch
                self._break(CALL_OPEN + self.raw, out)
                return buf[i + 1:]
            self.obj.on(events, pos, self.raw)
            self._maybe_commit(out)
            if self.scan.done:
                self.raw = self.raw[:pos + 1]
                self._flush_args(out)
                self._end_object(self.raw, CALL_OPEN + self.raw, out)
                self.state = "after"
                return buf[i + 1:]
        self._flush_args(out)
        return ""

    def _maybe_commit(self, out: list[ParserEvent]) -> None:
        obj = self.obj
        assert obj is not None  # called while a call object is open
        if self.call is None and obj.args_start is not None and obj.args_object and obj.name is not None:
            if obj.name in self.tools and self._can_call():
                self._start(obj.name, out)
                self.sent = obj.args_start

    def _start(self, name: str, out: list[ParserEvent]) -> None:
        index = len(self.calls)
        self.call = Call(index=index, id=self.new_id(index), name=name)
        self.calls.append(self.call)
        out.append(CallStart(index, self.call.id, name))

    def _flush_args(self, out: list[ParserEvent]) -> None:
        """Sends the arguments' text the scan has passed since the last flush."""
        call, obj = self.call, self.obj
        if call is None or obj is None or obj.args_start is None:
            return
        end = obj.args_end if obj.args_end is not None else len(self.raw)
        if end > self.sent:
            self._args(self.raw[self.sent:end], out)
            self.sent = end

    def _args(self, fragment: str, out: list[ParserEvent]) -> None:
        assert self.call is not None  # arguments belong to a started call
        self.call.arguments += fragment
        if out and isinstance(out[-1], CallArgs) and out[-1].index == self.call.index:
            out[-1].delta += fragment
        else:
            out.append(CallArgs(self.call.index, fragment))

    def _end_object(self, obj_raw: str, as_text: str, out: list[ParserEvent]) -> None:
        """A complete call object: end the committed call, or parse it whole (arguments before
        the name, or as a string); what is not a call of a known tool is text."""
        if self.call is not None:
            self._end(out)
            return
        try:
            value = json.loads(obj_raw)
        except ValueError:
            value = None
        name, args = _call_parts(value)
        if name in self.tools and args is not None and self._can_call():
            self._start(name, out)
            self._args(json.dumps(args, ensure_ascii=False), out)
            self._end(out)
        else:
            self._text(as_text, out)

    def _end(self, out: list[ParserEvent]) -> None:
        call = self.call
        assert call is not None  # only a started call ends
        call.ok = call.done = True
        out.append(CallEnd(call.index, call.arguments))
        self.call = None

    def _break(self, raw: str, out: list[ParserEvent]) -> None:
        """The current call cannot be parsed: CallEnd(ok=False) if it had started, and its raw
        text as content."""
        if self.call is not None:
            self.call.done = True
            out.append(CallEnd(self.call.index, "", ok=False))
            self.call = None
        self._text(raw, out)
        self.state = "text" if self.mode == "auto" else "sink"

    # -- GLM-4.5: a name line, then <arg_key>/<arg_value> pairs

    def _glm_feed(self, buf: str, out: list[ParserEvent]) -> str:
        """raw holds everything fed since the marker; data the part not yet consumed."""
        g = self.glm
        assert g is not None  # _open_call made it
        self.raw += buf
        data = g["data"] + buf
        g["data"] = ""

        def consumed(rest: str) -> str:  # the call's text up to where `rest` begins
            return CALL_OPEN + self.raw[:len(self.raw) - len(rest)]

        def wait(rest: str) -> str:
            g["data"] = rest
            return ""

        def broken(rest: str) -> str:
            text = consumed(rest)
            self.raw = ""
            self._break(text, out)
            return rest

        while True:
            stage = g["stage"]
            if stage == "name":
                cuts = [i for i in (data.find("\n"), data.find(ARG_KEY), data.find(CALL_CLOSE)) if i >= 0]
                if not cuts or min(cuts) > 256:
                    return broken(data) if len(data) > 256 else wait(data)
                name = data[:min(cuts)].strip()
                data = data[min(cuts):]
                if name in self.tools and self._can_call():
                    self._start(name, out)
                    g["stage"] = "pairs"
                else:
                    g["stage"] = "unknown"
            elif stage == "unknown":  # not a call of a known tool: text up to its close
                at = data.find(CALL_CLOSE)
                if at < 0:
                    return wait(data)
                rest = data[at + len(CALL_CLOSE):]
                self._text(consumed(rest), out)
                self.state = "text"
                return rest
            elif stage == "pairs":
                rest = data.lstrip(WS)
                if rest.startswith(CALL_CLOSE):
                    self._args("}" if g["nargs"] else "{}", out)
                    self._end(out)
                    self.state = "text"
                    return rest[len(CALL_CLOSE):]
                if rest.startswith(ARG_KEY):
                    end = rest.find(ARG_KEY_END)
                    if end < 0:
                        return wait(data)
                    g["key"] = rest[len(ARG_KEY):end].strip()
                    data = rest[end + len(ARG_KEY_END):]
                    g["stage"] = "value"
                elif not rest or ARG_KEY.startswith(rest) or CALL_CLOSE.startswith(rest):
                    return wait(data)
                else:
                    return broken(rest)
            elif stage == "value":
                rest = data.lstrip(WS)
                if not rest or (ARG_VALUE.startswith(rest) and rest != ARG_VALUE):
                    return wait(data)
                if not rest.startswith(ARG_VALUE):
                    return broken(rest)
                data = rest[len(ARG_VALUE):]
                key = g["key"]
                self._args(("{" if not g["nargs"] else ", ") + json.dumps(key, ensure_ascii=False) + ": ", out)
                g["nargs"] += 1
                assert self.call is not None  # the pairs stage follows _start
                g["string"] = _is_string_param(self.tools.get(self.call.name), key)
                g["value"] = ""
                if g["string"]:
                    self._args('"', out)
                g["stage"] = "in_value"
            else:  # in_value
                end = data.find(ARG_VALUE_END)
                if end < 0:
                    hold = _partial_suffix(data, ARG_VALUE_END)
                    self._glm_value(data[:len(data) - hold], out)
                    return wait(data[len(data) - hold:])
                self._glm_value(data[:end], out)
                self._args('"' if g["string"] else _json_value(g["value"]), out)
                data = data[end + len(ARG_VALUE_END):]
                g["stage"] = "pairs"

    def _glm_value(self, text: str, out: list[ParserEvent]) -> None:
        g = self.glm
        assert g is not None  # _open_call made it
        if text and g["string"]:
            self._args(json.dumps(text, ensure_ascii=False)[1:-1], out)
        elif text:
            g["value"] += text

    # -- constrained output: the whole output is one JSON value

    def _json_feed(self, delta: str, out: list[ParserEvent]) -> None:
        if self.state == "sink":
            self.pending += delta
            return
        assert self.scan is not None  # json modes make theirs at the start
        base = len(self.raw)
        self.raw += delta
        for i, ch in enumerate(delta):
            pos = base + i
            try:
                events = self.scan.push(ch)
                if not self.began and ch not in WS:
                    self.began = True
                    if ch != ("{" if self.mode == "args" else "["):
                        raise BadJson(ch)
                    if self.mode == "args" and self.forced in self.tools:
                        self.obj = _CallObject(-1, pos)
                        self.obj.args_start, self.obj.args_object = pos, True
                        self._start(self.forced, out)
                        self.sent = pos
                if self.mode == "calls":
                    self._calls_step(pos, ch, events, out)
            except BadJson:
                self.raw = self.raw[:pos]
                self._flush_args(out)
                self.raw += ch
                self._json_break(out)
                self.pending = delta[i + 1:]
                return
            if self.scan.done:
                self.raw = self.raw[:pos + 1]
                if self.mode == "args" and self.call is not None:
                    assert self.obj is not None  # made with the forced call
                    self.obj.args_end = pos + 1
                    self._flush_args(out)
                    self._end(out)
                elif self.mode == "args":
                    self._text(self.raw, out)
                self.state = "sink"
                self.pending = delta[i + 1:]
                return
        self._flush_args(out)

    def _calls_step(self, pos: int, ch: str, events: list[ScanEvent], out: list[ParserEvent]) -> None:
        for kind, depth, _ in events:
            if kind == "vstart" and depth == 1:
                if ch != "{":
                    raise BadJson(ch)
                self.obj = _CallObject(1, pos)
        obj = self.obj
        if obj is None:
            return
        obj.on(events, pos, self.raw)
        self._maybe_commit(out)
        if any(kind == "vend" and depth == 1 for kind, depth, _ in events):
            self._flush_args(out)
            text = self.raw[obj.start:pos + 1]
            self._end_object(text, text, out)
            self.obj = None

    def _json_break(self, out: list[ParserEvent]) -> None:
        """JSON output that cannot be parsed (or was cut): the part that is no complete call
        comes back as text (args mode: all of it; calls mode: the open call object)."""
        if self.mode == "calls":
            text = self.raw[self.obj.start:] if self.obj is not None else ("" if self.calls else self.raw)
        else:
            text = self.raw
        self.obj = None
        self._break(text, out)


def _is_string_param(schema: object, key: str) -> bool:
    props = schema.get("properties") if isinstance(schema, dict) else None
    prop = props.get(key) if isinstance(props, dict) else None
    kind = prop.get("type") if isinstance(prop, dict) else None
    return kind == "string" or (isinstance(kind, list) and kind == ["string"])


def _json_value(text: str) -> str:
    """A GLM non-string argument value as JSON text: as written when it parses, else a string."""
    stripped = text.strip()
    try:
        return json.dumps(json.loads(stripped), ensure_ascii=False)
    except ValueError:
        return json.dumps(text, ensure_ascii=False)


def _call_parts(value: object) -> tuple[str, dict] | tuple[None, None]:
    """(name, arguments dict) of a parsed call object, or (None, None)."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None, None
    args: Any = next((value[k] for k in ARG_KEYS if k in value), {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None, None
    return (value["name"], args) if isinstance(args, dict) else (None, None)


# --- constrained decoding: the schema a forced choice is held to ---------------------------------

def forced_schema(tools: Iterable[Tool], *, choice: str, parallel: bool = True) -> dict[str, Any]:
    """The JSON Schema the output must satisfy: a named tool's parameters ("args" mode), or for
    `required` an array of 1 (or, with parallel calls, more) {"name", "arguments"} objects, one
    branch per tool (vLLM's form) ("calls" mode). tools: [Tool]."""
    if choice == "required":
        branches = [{"type": "object", "properties": {"name": {"enum": [t.name]}, "arguments": t.parameters},
                     "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": branches}}
        if not parallel:
            schema["maxItems"] = 1
        return schema
    tool = next(t for t in tools if t.name == choice)
    return tool.parameters
