"""Reasoning kept apart from the answer: the bridge splits a reasoning model's output into
thinking (`reasoning` events) and answer (`text` events) as it streams.

Two formats, chosen per request by the job's `reasoning` field (set by the web side from the
served model's template, `mode_for`):
* "think": Qwen3-style `<think>…</think>` before the answer (DeepSeek-R1, QwQ and Qwen3 write
  it). A generation prompt that already opens `<think>` (a template that starts the model inside
  its thinking) means the output starts inside thinking; one that closed an empty block
  (`enable_thinking=false`) means it starts in the answer. The prompt's tail decides, so no
  second job field can disagree with the prompt.
* "harmony": gpt-oss's channels. `analysis` is reasoning, `final` the answer, a `commentary`
  message addressed `to=functions.NAME` is a tool call, re-emitted in the hermes call form
  (`<tool_call>\\n{"name": …, "arguments": <the body as written>}\\n</tool_call>`) that the
  surfaces' tool parser (engine_bridge.toolsyntax) already reads incrementally, so every surface
  gets harmony calls with no parser of its own. `<|return|>` and `<|call|>` end the output
  (`ended`: the bridge stops the engine). A header the prompt already wrote (a constrained
  choice prefills `<|channel|>…<|message|>`) puts the parser straight into that message, whose
  body then goes out as plain answer text (the grammar holds it to the JSON a forced choice or
  response format asks for, and the surfaces parse it as such).

Invariant (tested with hypothesis): the events, with adjacent events of one kind merged, do not
depend on how the output is cut into deltas. Each splitter holds back only a suffix that may
still grow into a marker, so thinking streams while it is written.
"""
from __future__ import annotations

import json
from collections.abc import Iterable

REASONING, TEXT = "reasoning", "text"
Segment = tuple[str, str]  # (REASONING | TEXT, text)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
START, END, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"
RETURN, CALL = "<|return|>", "<|call|>"
BODY_ENDS = (END, RETURN, CALL)
MAX_HEADER = 512  # characters of a harmony header before the output is taken as plain text
MODES = ("think", "harmony")


def mode_for(template: str | None) -> str | None:
    """The reasoning format of a chat template's model: "harmony", "think" or None."""
    template = template or ""
    if CHANNEL in template and "<|start|>" in template:
        return "harmony"
    if THINK_CLOSE in template:
        return "think"
    return None


def _hold(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of one of the markers."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if marker.startswith(text[-n:]):
                best = n
                break
    return best


class _Out:
    """Segments in order, adjacent ones of a kind merged."""

    def __init__(self) -> None:
        self.items: list[Segment] = []

    def add(self, kind: str, text: str) -> None:
        if not text:
            return
        if self.items and self.items[-1][0] == kind:
            self.items[-1] = (kind, self.items[-1][1] + text)
        else:
            self.items.append((kind, text))


class ThinkSplitter:
    """`<think>` reasoning, then the answer. The reasoning's surrounding newlines are dropped
    and so are the newlines between `</think>` and the answer (the Qwen3 template writes
    `<think>\\n…\\n</think>\\n\\n` and strips them back off when it renders a past turn)."""

    ended = False  # the format has no end marker of its own: the engine's EOS ends it

    def __init__(self, *, inside: bool = False) -> None:
        self.state = "think" if inside else "start"  # start | think | gap | answer
        self.buf = ""
        self.began = False  # the reasoning has had a character other than a newline

    @property
    def thinking(self) -> bool:
        """Inside the thinking, or inside its opening marker (a token read now counts as a
        reasoning token)."""
        opening = self.state == "start" and (rest := self.buf.lstrip()) != "" and THINK_OPEN.startswith(rest)
        return self.state == "think" or opening

    @property
    def closable(self) -> bool:
        """Inside the thinking proper: writing `</think>` now ends it."""
        return self.state == "think"

    @classmethod
    def for_prompt(cls, prompt: str) -> ThinkSplitter:
        """The splitter for the output of `prompt`: inside thinking when the prompt's tail opens
        `<think>` without closing it."""
        tail = prompt.rstrip()
        return cls(inside=tail.endswith(THINK_OPEN))

    def feed(self, delta: str) -> list[Segment]:
        out = _Out()
        self.buf += delta
        self._run(out, final=False)
        return out.items

    def finish(self, end_token: bool = False) -> list[Segment]:
        """The rest at the end of the output (end_token: as HarmonyParser.finish; no marker here
        is an end-of-generation token)."""
        out = _Out()
        self._run(out, final=True)
        if self.state == "start":  # whitespace or a `<think` prefix that never became the marker
            out.add(TEXT, self.buf)
        elif self.state == "think":  # cut inside thinking: a partial `</think>` is reasoning text
            out.add(REASONING, self.buf.rstrip("\n"))
        self.buf = ""
        return out.items

    def _run(self, out: _Out, *, final: bool) -> None:
        while True:
            if self.state == "start":
                rest = self.buf.lstrip()
                if rest.startswith(THINK_OPEN):
                    self.buf, self.state = rest[len(THINK_OPEN):], "think"
                elif not rest or (THINK_OPEN.startswith(rest) and not final):
                    return  # only whitespace, or a `<think` prefix: wait
                else:
                    self.state = "answer"
            elif self.state == "think":
                if not self.began:
                    self.buf = self.buf.lstrip("\n")
                    if not self.buf:
                        return
                    self.began = True
                at = self.buf.find(THINK_CLOSE)
                if at >= 0:
                    out.add(REASONING, self.buf[:at].rstrip("\n"))
                    self.buf, self.state = self.buf[at + len(THINK_CLOSE):], "gap"
                    continue
                keep = _hold(self.buf, (THINK_CLOSE,))
                body = self.buf[:len(self.buf) - keep]
                sent = body.rstrip("\n")  # trailing newlines wait: they may end the reasoning
                out.add(REASONING, sent)
                self.buf = self.buf[len(sent):]
                return
            elif self.state == "gap":
                self.buf = self.buf.lstrip("\n")
                if not self.buf:
                    return
                self.state = "answer"
            else:
                out.add(TEXT, self.buf)
                self.buf = ""
                return


class HarmonyParser:
    """gpt-oss output (after the prompt's `<|start|>assistant`) -> reasoning and answer segments;
    see the module docstring. `ended`: `<|return|>` or `<|call|>` was read (nothing after it is
    output); `broken`: the output was not harmony and passed through as plain answer text."""

    def __init__(self, header: str = "assistant") -> None:
        self.state = "header"  # header | body | between | ended | raw
        self.header = header   # the current message's header so far (role, recipient, channel)
        self.buf = ""
        self.kind = TEXT       # where the open body goes
        self.call: str | None = None  # the open body is this tool call's arguments (wrapped)
        self.prefilled = False  # the prompt wrote the open message's header: its body is plain text
        self.ended = False
        self.broken = False

    @property
    def thinking(self) -> bool:
        """Inside an analysis message or its header (a token read now counts as a reasoning token)."""
        return (self.state == "body" and self.kind == REASONING) or (self.state == "header" and "analysis" in self.header)

    @property
    def closable(self) -> bool:
        """Inside an analysis body: `<|end|>` now ends it."""
        return self.state == "body" and self.kind == REASONING

    @classmethod
    def for_prompt(cls, prompt: str) -> HarmonyParser:
        """The parser for the output of `prompt`, primed with what the prompt wrote after its
        last `<|start|>` (the role, and a prefilled channel header if any)."""
        at = prompt.rfind(START)
        parser = cls(prompt[at + len(START):] if at >= 0 else "assistant")
        if MESSAGE in parser.header:  # the prompt opened the message: its body is the output
            parser.prefilled = True
            parser._run(_Out(), final=False)
        return parser

    def feed(self, delta: str) -> list[Segment]:
        out = _Out()
        if self.state == "ended":
            return []
        if self.state == "header":
            self.header += delta
        else:
            self.buf += delta
        self._run(out, final=False)
        return out.items

    def finish(self, end_token: bool = False) -> list[Segment]:
        """The rest at the end of the output. end_token: the engine ended it at an
        end-of-generation token (`<|return|>` / `<|call|>`, the file's EOG tokens), which it does
        not write as text: an open body ends as that marker would end it (a call is closed)."""
        out = _Out()
        self._run(out, final=True)
        if end_token and self.state == "body":
            out.add(self.kind, self.buf)
            self.buf = ""
            self._close(CALL if self.call is not None else RETURN, out)
        if self.state == "body":
            out.add(self.kind, self.buf)  # cut mid-message (a call stays unclosed: cut)
        elif self.state == "header" and "<|" not in self._plain_header():  # words, not a cut header
            out.add(TEXT, self._plain_header())
        elif self.state == "raw":
            out.add(TEXT, self.buf)
        self.buf, self.header = "", ""
        self.state = "ended" if self.ended else self.state
        return out.items

    def _plain_header(self) -> str:
        """A header that never became one: the text the model wrote (past the primed role)."""
        return self.header.removeprefix("assistant")

    def _run(self, out: _Out, *, final: bool) -> None:
        while True:
            if self.state == "header":
                at = self.header.find(MESSAGE)
                if at > MAX_HEADER or (at < 0 and len(self.header) >= MAX_HEADER + len(MESSAGE)):
                    self.state, self.broken = "raw", True
                    self.buf = self._plain_header() + self.buf
                    continue
                if at < 0:
                    return
                head, self.buf = self.header[:at], self.header[at + len(MESSAGE):] + self.buf
                self.header = ""
                self._open(head, out)
            elif self.state == "body":
                hits = [(i, m) for m in BODY_ENDS if (i := self.buf.find(m)) >= 0]
                if not hits:
                    keep = 0 if final else _hold(self.buf, BODY_ENDS)
                    out.add(self.kind, self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    return
                at, marker = min(hits)
                out.add(self.kind, self.buf[:at])
                self.buf = self.buf[at + len(marker):]
                self._close(marker, out)
            elif self.state == "between":
                if self.buf.startswith(START):
                    self.buf = self.buf[len(START):]
                elif START.startswith(self.buf) and not final:
                    return  # empty, or a partial <|start|>
                self.state, self.header, self.buf = "header", self.buf, ""
                if final and not self.header:
                    return
            elif self.state == "raw":
                out.add(TEXT, self.buf)
                self.buf = ""
                return
            else:  # ended: nothing after <|return|> / <|call|> is output
                self.buf = ""
                return

    def _open(self, head: str, out: _Out) -> None:
        """A message header is complete: where its body goes."""
        channel, recipient = _header_fields(head)
        self.state, self.call = "body", None
        if recipient and recipient != "assistant" and not self.prefilled:
            self.call, self.kind = recipient.removeprefix("functions."), TEXT
            out.add(TEXT, '<tool_call>\n{"name": ' + json.dumps(self.call, ensure_ascii=False) + ', "arguments": ')
        elif channel == "analysis" and not self.prefilled:
            self.kind = REASONING
        else:
            self.kind = TEXT  # final, a preamble on commentary, or a prefilled (constrained) body

    def _close(self, marker: str, out: _Out) -> None:
        if self.call is not None:
            out.add(TEXT, "}\n</tool_call>")
            self.call = None
        self.prefilled = False
        if marker == END:
            self.state = "between"
        else:
            self.state, self.ended = "ended", True


def _header_fields(head: str) -> tuple[str, str | None]:
    """(channel, recipient) of a harmony header such as `assistant<|channel|>commentary
    to=functions.f <|constrain|>json` or `assistant to=functions.f<|channel|>commentary json`."""
    channel, recipient = "", None
    words = head.replace(CHANNEL, " " + CHANNEL + " ").replace(CONSTRAIN, " " + CONSTRAIN + " ").split()
    for i, word in enumerate(words):
        if word.startswith("to="):
            recipient = word[3:]
        elif word == CHANNEL and i + 1 < len(words):
            channel = words[i + 1]
    return channel, recipient


Splitter = ThinkSplitter | HarmonyParser


def splitter_for(mode: str | None, prompt: str) -> Splitter | None:
    """The splitter a job's `reasoning` field asks for (None: the output is all answer)."""
    if mode == "think":
        return ThinkSplitter.for_prompt(prompt)
    if mode == "harmony":
        return HarmonyParser.for_prompt(prompt)
    return None


def split_all(splitter: Splitter, deltas: Iterable[str]) -> list[Segment]:
    """Every segment of a whole output fed as `deltas`, adjacent ones of a kind merged (tests)."""
    out = _Out()
    for delta in deltas:
        for kind, text in splitter.feed(delta):
            out.add(kind, text)
    for kind, text in splitter.finish():
        out.add(kind, text)
    return out.items
