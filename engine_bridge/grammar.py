"""The one place that turns a structured-output constraint into the engine's wire grammar.

    grammar_for_schema(schema) -> bytes    a JSON Schema -> a CGD1 byte DFA (native/src/grammar.h)
    grammar_for_json_object() -> bytes     any JSON object, containers nested at most ANY_DEPTH deep

The engine (SUBMIT ... <gbytes> grammar=1) samples only tokens that keep its output inside the
DFA, so what comes back parses and validates; the real colibri binary has no such extension
(the bridge refuses there, engine_bridge.jobs.extension_refusal).

Why our own compiler and not a library: outlines-core (JSON Schema -> regex) is the closest
model and was read to learn from (fixed property order, optional properties); but its output
is a regex string to be parsed again, its default whitespace is unbounded (a small model loops
on it), and keywords it does not know are ignored rather than refused. interegular's FSMs are
over characters, so a byte-level step would still be needed; llguidance and xgrammar compile
to token masks inside their own runtimes (and xgrammar pulls torch), not to a DFA our C engine
walks. The path here is schema -> a small regex AST over bytes (character classes become UTF-8
byte-range sequences) -> Thompson NFA -> subset-construction DFA -> Moore minimisation, all
standard library; `pattern` goes through the standard library's own regex parser (re._parser).

Invariants of the language generated (each output is valid JSON that validates):
* Object properties come in the schema's order; required ones always, optional ones maybe;
  without additionalProperties only the listed properties are produced (valid either way).
* Whitespace: at most one space after `{ [ , :` and before `} ]`; never a newline; nothing
  before or after the top-level value, so the engine ends the turn at the closing brace.
* Strings: any JSON string (escapes included; `\\u` surrogates only as pairs, so an escape is
  one code point; strings with minLength/maxLength take raw UTF-8 and the short escapes only,
  so that each counted character costs few states); the engine's budget rule
  closes them in time when max_tokens runs low. Exponents have at most two digits (no inf).
* oneOf is generated as anyOf (exclusivity is not checked); a recursive $ref unrolls at most
  REF_DEPTH levels deep and beyond that only its non-recursive branches remain.
Refused with GrammarError (`.field` = the schema path, e.g. "properties.tags.uniqueItems"):
unknown or unsupported keywords, bounds on non-integer numbers other than minimum 0,
maxLength / maxItems above MAX_COUNT, and grammars too big for the wire (GRAM_MAX_BYTES).
"""
from __future__ import annotations

import functools
import json
import math
import re
import struct
from collections.abc import Iterable, Iterator
from typing import Any, overload

try:  # the standard library's regex parser (sre_parse before 3.11)
    import re._parser as _sre
    from re._constants import MAXREPEAT
except ImportError:  # pragma: no cover
    import sre_parse as _sre
    from sre_constants import MAXREPEAT

ANY_DEPTH = 3          # containers a free JSON value may nest (json_object: the object + 3 more;
                       # 4 would take ~1.7 s to compile and twice the states)
REF_DEPTH = 3          # expansions of one $ref on the current path
MAX_COUNT = 256        # largest maxLength / maxItems / minItems compiled (each is unrolled)
MAX_STATES = 1 << 18   # native/src/grammar.h GRAM_MAX_STATES
# Compile-time bounds: a schema is compiled on the web request's path, so what a client can make
# it cost is bounded (about a second at most on one core), not only what the engine can take.
MAX_NFA_STATES = 150_000
MAX_DFA_STATES = 60_000
MOORE_ROUNDS = 48       # Moore refinement rounds at most, and state-rounds at most:
MOORE_WORK = 800_000
GRAM_MAX_BYTES = 1 << 20  # the engine's gbytes limit
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
               "readOnly", "writeOnly", "discriminator", "$defs", "definitions", "strict", "name"}


class GrammarError(ValueError):
    """A schema the compiler cannot turn into a grammar; .field names where (a dotted schema
    path, None for the whole schema) and the message names the keyword."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


# --- the regex AST over bytes ---------------------------------------------------------------
# ("lit", b"...") | ("set", [(lo, hi), ...]) | ("seq", [n...]) | ("alt", [n...]) (empty: nothing)
# | ("utf8", [byte-range sequences]) (one character of a class)
# | ("rep", n, min, max|None) | ("list", item, sep, min, max|None) | ("members", [(key, n, required)])

Node = tuple[Any, ...]  # one of the shapes above
Edge = tuple[int, int, int]  # (lo byte, hi byte, target state)

EPS: Node = ("seq", [])
NOTHING: Node = ("alt", [])
WS = ("rep", ("lit", b" "), 0, 1)


def lit(text: str | bytes) -> Node:
    return ("lit", text.encode() if isinstance(text, str) else text)


def seq(*nodes: Node) -> Node:
    return ("seq", list(nodes))


def alt(*nodes: Node) -> Node:
    return ("alt", list(nodes))


def _utf8_split(lo: int, hi: int) -> Iterator[list[tuple[int, int]]]:
    """Byte-range sequences whose union encodes exactly the code points lo..hi (one UTF-8 length)."""
    n = len(chr(lo).encode())
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                yield from _utf8_split(lo, lo | m)
                yield from _utf8_split((lo | m) + 1, hi)
                return
            if hi & m != m:
                yield from _utf8_split(lo, (hi & ~m) - 1)
                yield from _utf8_split(hi & ~m, hi)
                return
    a, b = chr(lo).encode(), chr(hi).encode()
    yield [(a[k], b[k]) for k in range(n)]


def _normalise(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _minus(ranges: Iterable[tuple[int, int]], cut: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in _normalise(ranges):
        for clo, chi in _normalise(cut):
            if chi < lo or clo > hi:
                continue
            if clo > lo:
                out.append((lo, clo - 1))
            lo = chi + 1
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return out


def utf8_chars(ranges: Iterable[tuple[int, int]]) -> Node:
    """Code point ranges (surrogates dropped) -> ("utf8", their UTF-8 byte-range sequences)."""
    seqs: list[tuple[tuple[int, int], ...]] = []
    for lo, hi in _minus(ranges, [(0xD800, 0xDFFF)]):
        for a, b in ((lo, min(hi, 0x7F)), (max(lo, 0x80), min(hi, 0x7FF)),
                     (max(lo, 0x800), min(hi, 0xFFFF)), (max(lo, 0x10000), hi)):
            if a <= b:
                seqs.extend(tuple(s) for s in _utf8_split(a, b))
    return ("utf8", seqs)


SHORT_ESCAPES = {0x22: b'\\"', 0x5C: b"\\\\", 0x08: b"\\b", 0x0C: b"\\f", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t"}
HEX = [(0x30, 0x39), (0x41, 0x46), (0x61, 0x66)]
# \uXXXX without surrogates: first digit not d/D, or d/D followed by 0-7
U_ESCAPE = seq(lit("\\u"), alt(seq(("set", [(0x30, 0x39), (0x41, 0x43), (0x45, 0x46), (0x61, 0x63), (0x65, 0x66)]),
                                   ("set", HEX), ("set", HEX), ("set", HEX)),
                               seq(("set", [(0x44, 0x44), (0x64, 0x64)]), ("set", [(0x30, 0x37)]),
                                   ("set", HEX), ("set", HEX))))
_D = ("set", [(0x44, 0x44), (0x64, 0x64)])
# a surrogate pair, \uD83D\uDE42: one code point, as a validator counts it
U_PAIR = seq(lit("\\u"), _D, ("set", [(0x38, 0x39), (0x41, 0x42), (0x61, 0x62)]), ("set", HEX), ("set", HEX),
             lit("\\u"), _D, ("set", [(0x43, 0x46), (0x63, 0x66)]), ("set", HEX), ("set", HEX))
ANY_CHAR = alt(utf8_chars([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)]), U_PAIR,
               seq(lit("\\"), ("set", [(0x22, 0x22), (0x2F, 0x2F), (0x5C, 0x5C), (0x62, 0x62), (0x66, 0x66),
                                       (0x6E, 0x6E), (0x72, 0x72), (0x74, 0x74)])),
               U_ESCAPE)


# In counted strings (minLength / maxLength: one copy per character) the \\u escapes would
# triple the states per character; raw UTF-8 says the same, so those strings do without them.
COUNTED_CHAR = alt(utf8_chars([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)]),
                   seq(lit("\\"), ("set", [(0x22, 0x22), (0x2F, 0x2F), (0x5C, 0x5C), (0x62, 0x62), (0x66, 0x66),
                                           (0x6E, 0x6E), (0x72, 0x72), (0x74, 0x74)])))


def json_chars(ranges: Iterable[tuple[int, int]]) -> Node:
    """The JSON-encoded forms of a set of decoded characters (for `pattern`, `format`)."""
    ranges = _normalise(ranges)
    raw = _minus(ranges, [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
    alts = [utf8_chars(raw)] if raw else []
    for lo, hi in ranges:
        for c in range(lo, min(hi, 0x5C) + 1):
            if c < 0x20 or c in (0x22, 0x5C):
                alts.append(lit(SHORT_ESCAPES.get(c) or b"\\u%04x" % c))
    return ("alt", alts)


# --- NFA, DFA, minimisation, wire ---------------------------------------------------------------

class _NFA:
    def __init__(self) -> None:
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []

    def state(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise GrammarError("the schema compiles to too large a grammar (reduce maxLength, maxItems or nesting)")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def build(self, node: Node, s: int) -> int:
        """Adds node from state s; returns its end state."""
        kind = node[0]
        if kind == "lit":
            for b in node[1]:
                t = self.state()
                self.edges[s].append((b, b, t))
                s = t
            return s
        if kind == "set":
            t = self.state()
            self.edges[s].extend((lo, hi, t) for lo, hi in node[1])
            return t
        if kind == "utf8":  # sequences sharing their suffixes (continuation bytes): no epsilons
            end, at = self.state(), {}
            for byte_seq in node[1]:
                nxt = end
                for k in range(len(byte_seq) - 1, 0, -1):
                    key = byte_seq[k:]
                    if key not in at:
                        at[key] = self.state()
                        self.edges[at[key]].append((*byte_seq[k], nxt))
                    nxt = at[key]
                self.edges[s].append((*byte_seq[0], nxt))
            return end
        if kind == "seq":
            for sub in node[1]:
                s = self.build(sub, s)
            return s
        if kind == "alt":
            end = self.state()
            for sub in node[1]:
                a = self.state()
                self.eps[s].append(a)
                self.eps[self.build(sub, a)].append(end)
            return end
        if kind == "rep":
            _, sub, lo, hi = node
            for _ in range(lo):
                s = self.build(sub, s)
            if hi is None:  # a loop with one copy
                h = self.state()
                self.eps[s].append(h)
                self.eps[self.build(sub, h)].append(h)
                return h
            ends = [s]
            for _ in range(hi - lo):
                s = self.build(sub, s)
                ends.append(s)
            end = self.state()
            for e in ends:
                self.eps[e].append(end)
            return end
        if kind == "list":
            _, item, sep, lo, hi = node
            if hi == 0:
                return s
            body = seq(item, ("rep", seq(sep, item), max(lo - 1, 0), None if hi is None else hi - 1))
            return self.build(body if lo > 0 else alt(body, EPS), s)
        if kind == "members":
            return self._members(node[1], s)
        raise AssertionError(kind)

    def _members(self, members: list[tuple[str, Node, bool]], s: int) -> int:
        """Properties in order, each once, commas between those present: `a` = nothing written
        yet, `b` = something written; one copy of each value (reached from a, or from b by a
        comma)."""
        a, b = s, None
        for key, value, required in members:
            entry = self.state()
            self.eps[a].append(entry)
            if b is not None:
                self.eps[self.build(seq(WS, lit(","), WS), b)].append(entry)
            done = self.build(seq(lit(json.dumps(key, ensure_ascii=False)), WS, lit(":"), WS, value), entry)
            na, nb = (self.state(), self.state())
            self.eps[done].append(nb)
            if not required:
                self.eps[a].append(na)
                if b is not None:
                    self.eps[b].append(nb)
            a, b = (na if not required else self.state()), nb
        end = self.state()
        self.eps[a].append(end)
        if b is not None:
            self.eps[b].append(end)
        return end

    def closure(self, states: Iterable[int]) -> frozenset[int]:
        seen, todo = set(states), list(states)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)


def _determinise(nfa: _NFA, start: int, final: int) -> tuple[list[bool], list[list[Edge]]]:
    """-> (accepting flags, [[(lo, hi, target)]]) of the reachable DFA, state 0 = start."""
    first = nfa.closure([start])
    index, order, trans = {first: 0}, [first], []
    closures: dict[frozenset[int], frozenset[int]] = {}
    i = 0
    while i < len(order):
        cur = order[i]
        i += 1
        edges = [e for s in cur for e in nfa.edges[s]]
        cuts = sorted({lo for lo, _, _ in edges} | {hi + 1 for _, hi, _ in edges})
        at = {c: k for k, c in enumerate(cuts)}
        segments: list[set[int]] = [set() for _ in cuts]
        for lo, hi, t in edges:
            for k in range(at[lo], at[hi + 1]):
                segments[k].add(t)
        out: list[Edge] = []
        for lo, nxt, targets in zip(cuts, cuts[1:], segments):
            if not targets:
                continue
            key = frozenset(targets)
            target = closures.get(key)
            if target is None:
                target = closures[key] = nfa.closure(key)
            if target not in index:
                if len(order) >= MAX_DFA_STATES:
                    raise GrammarError("the schema compiles to too large a grammar (reduce maxLength, maxItems or nesting)")
                index[target] = len(order)
                order.append(target)
            j = index[target]
            if out and out[-1][2] == j and out[-1][1] == lo - 1:
                out[-1] = (out[-1][0], nxt - 1, j)
            else:
                out.append((lo, nxt - 1, j))
        trans.append(out)
    return [final in st for st in order], trans


def _trim_and_minimise(accept: list[bool], trans: list[list[Edge]]) -> list[tuple[bool, list[Edge]]]:
    """Drops states that reach no accepting state, then merges equivalent ones (Moore), unless
    that takes more rounds than MOORE_ROUNDS / MOORE_WORK allow (each is a pass over the DFA); the subset
    construction's DFA is correct either way, only bigger."""
    n = len(accept)
    back: list[list[int]] = [[] for _ in range(n)]
    for q, out in enumerate(trans):
        for _, _, t in out:
            back[t].append(q)
    live, todo = {q for q in range(n) if accept[q]}, [q for q in range(n) if accept[q]]
    while todo:
        for p in back[todo.pop()]:
            if p not in live:
                live.add(p)
                todo.append(p)
    if 0 not in live:
        raise GrammarError("the schema allows no value at all")
    trans = [[e for e in trans[q] if e[2] in live] if q in live else [] for q in range(n)]
    cls = [int(accept[q]) if q in live else -1 for q in range(n)]
    for _ in range(max(4, min(MOORE_ROUNDS, MOORE_WORK // max(1, len(live))))):
        sig: dict[tuple[int, tuple[Edge, ...]], int] = {}
        new: list[int] = []
        for q in range(n):
            if cls[q] < 0:
                new.append(-1)
                continue
            merged: list[Edge] = []
            for lo, hi, t in trans[q]:
                if merged and merged[-1][2] == cls[t] and merged[-1][1] == lo - 1:
                    merged[-1] = (merged[-1][0], hi, cls[t])
                else:
                    merged.append((lo, hi, cls[t]))
            new.append(sig.setdefault((cls[q], tuple(merged)), len(sig)))
        if len(sig) == len({c for c in cls if c >= 0}):
            cls = new
            break
        cls = new
    else:  # long chains (counted strings) refine a class per round: keep the trimmed DFA as it is
        cls = [q if q in live else -1 for q in range(n)]
    # renumber: the start's class first, in breadth-first order
    order, seen = [cls[0]], {cls[0]}
    rep: dict[int, int] = {}
    for q in range(n):
        if cls[q] >= 0:
            rep.setdefault(cls[q], q)
    i = 0
    while i < len(order):
        for _, _, t in trans[rep[order[i]]]:
            if cls[t] not in seen:
                seen.add(cls[t])
                order.append(cls[t])
        i += 1
    num = {c: k for k, c in enumerate(order)}
    states = []
    for c in order:
        q = rep[c]
        merged = []
        for lo, hi, t in trans[q]:
            j = num[cls[t]]
            if merged and merged[-1][2] == j and merged[-1][1] == lo - 1:
                merged[-1] = (merged[-1][0], hi, j)
            else:
                merged.append((lo, hi, j))
        states.append((accept[q], merged))
    return states


def compile_node(node: Node) -> bytes:
    """AST -> CGD1 wire bytes (native/src/grammar.h)."""
    nfa = _NFA()
    start = nfa.state()
    final = nfa.build(node, start)
    states = _trim_and_minimise(*_determinise(nfa, start, final))
    if len(states) > MAX_STATES:
        raise GrammarError(f"the schema compiles to {len(states)} states (at most {MAX_STATES})")
    out = [b"CGD1", struct.pack("<II", len(states), 0)]
    for accepting, ranges in states:
        out.append(struct.pack("<BH", int(accepting), len(ranges)))
        out.extend(struct.pack("<BBI", lo, hi, t) for lo, hi, t in ranges)
    wire = b"".join(out)
    if len(wire) > GRAM_MAX_BYTES:
        raise GrammarError(f"the schema compiles to a {len(wire)}-byte grammar (at most {GRAM_MAX_BYTES})")
    return wire


def dfa_of(wire: bytes) -> tuple[int, list[bool], list[list[tuple[int, ...]]]]:
    """CGD1 bytes -> (start, accepting flags, [[(lo, hi, target)]]): the reference reader (tests)."""
    n, start = struct.unpack_from("<II", wire, 4)
    at, accept, trans = 12, [], []
    for _ in range(n):
        flags, nr = struct.unpack_from("<BH", wire, at)
        at += 3
        accept.append(bool(flags & 1))
        trans.append([struct.unpack_from("<BBI", wire, at + 6 * k) for k in range(nr)])
        at += 6 * nr
    return start, accept, trans


# --- JSON values ---------------------------------------------------------------------------------

DIGIT, DIGIT19 = ("set", [(0x30, 0x39)]), ("set", [(0x31, 0x39)])
NONNEG_INT = alt(lit("0"), seq(DIGIT19, ("rep", DIGIT, 0, None)))
FRACTION = seq(lit("."), ("rep", DIGIT, 1, None))
EXPONENT = seq(("set", [(0x45, 0x45), (0x65, 0x65)]), ("rep", ("set", [(0x2B, 0x2B), (0x2D, 0x2D)]), 0, 1),
               ("rep", DIGIT, 1, 2))
INTEGER = seq(("rep", lit("-"), 0, 1), NONNEG_INT)
NUMBER = seq(INTEGER, ("rep", FRACTION, 0, 1), ("rep", EXPONENT, 0, 1))
STRING = seq(lit('"'), ("rep", ANY_CHAR, 0, None), lit('"'))


def _container(kind: str, item: Node, lo: int = 0, hi: int | None = None) -> Node:
    opening, closing = ("{", "}") if kind == "object" else ("[", "]")
    return seq(lit(opening), WS, ("list", item, seq(WS, lit(","), WS), lo, hi), WS, lit(closing))


def any_value(depth: int = ANY_DEPTH) -> Node:
    """Any JSON value with containers nested at most `depth` deep."""
    scalars = [STRING, NUMBER, lit("true"), lit("false"), lit("null")]
    if depth <= 0:
        return alt(*scalars)
    inner = any_value(depth - 1)
    return alt(*scalars, _container("object", seq(STRING, WS, lit(":"), WS, inner)), _container("array", inner))


@functools.lru_cache(maxsize=1)
def grammar_for_json_object() -> bytes:
    """Any JSON object; values nest at most ANY_DEPTH containers deeper (compiled once)."""
    return compile_node(_container("object", seq(STRING, WS, lit(":"), WS, any_value(ANY_DEPTH))))


# --- integers in a range -------------------------------------------------------------------------

def _digits_range(a: str, b: str) -> Node:
    """Same-length decimal strings a <= b -> the AST of every digit string between them."""
    if not a:
        return EPS
    if a.strip("0") == "" and b.strip("9") == "":  # every string of this length: one node, not a
        return ("rep", DIGIT, len(a), len(a))     # split per digit (that doubled per digit: 2^n)
    if a[0] == b[0]:
        return seq(lit(a[0]), _digits_range(a[1:], b[1:]))
    n = len(a) - 1
    parts = [seq(lit(a[0]), _digits_range(a[1:], "9" * n))]
    if int(b[0]) - int(a[0]) > 1:
        parts.append(seq(("set", [(ord(a[0]) + 1, ord(b[0]) - 1)]), ("rep", DIGIT, n, n)))
    parts.append(seq(lit(b[0]), _digits_range("0" * n, b[1:])))
    return alt(*parts)


def _nonneg_range(lo: int, hi: int | None) -> Node:
    """Decimal forms (no leading zeros) of lo..hi, hi None = unbounded; lo >= 0."""
    parts = []
    if lo == 0:
        parts.append(lit("0"))
        lo = 1
    length = len(str(lo))
    while hi is None or lo <= hi:
        top = 10 ** length - 1
        if hi is not None and hi < top:
            top = hi
        if hi is None and lo == 10 ** (length - 1):  # all numbers of this length and longer
            parts.append(seq(DIGIT19, ("rep", DIGIT, length - 1, None)))
            break
        parts.append(_digits_range(str(lo), str(top)))
        lo, length = top + 1, length + 1
    return alt(*parts)


MAX_BOUND = 2**63  # integer bounds past int64 are refused: their digit automata grow with the digits


def int_range(lo: int | None, hi: int | None) -> Node:
    if lo is not None and hi is not None and lo > hi:
        return NOTHING
    parts = []
    if lo is None or lo < 0:  # negatives: "-" + |x| for x in [lo, min(hi, -1)]
        top = None if lo is None else -lo
        bottom = 1 if hi is None or hi >= 0 else -hi
        parts.append(seq(lit("-"), _nonneg_range(bottom, top)))
    if hi is None or hi >= 0:
        parts.append(_nonneg_range(max(lo or 0, 0), hi))
    return alt(*parts)


# --- regex patterns (JSON Schema `pattern`: ECMA-262 syntax, unanchored) --------------------------

ALL_CHARS = [(0, 0x10FFFF)]
CATEGORIES = {  # ASCII forms; negations are taken inside ASCII, a subset of Python's (validators')
    "CATEGORY_DIGIT": [(0x30, 0x39)],
    "CATEGORY_WORD": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "CATEGORY_SPACE": [(0x09, 0x0D), (0x20, 0x20)],
}


def _category(name: str) -> list[tuple[int, int]]:
    name = str(name)
    if name in CATEGORIES:
        return CATEGORIES[name]
    positive = name.replace("CATEGORY_NOT_", "CATEGORY_")
    if positive in CATEGORIES:
        return _minus([(0, 0x7F)], CATEGORIES[positive])
    raise GrammarError(f"pattern: the class {name} is not supported")


def _class(items: Iterable[tuple[Any, Any]]) -> list[tuple[int, int]]:
    ranges, negate = [], False
    for op, av in items:
        op = str(op)
        if op == "NEGATE":
            negate = True
        elif op == "LITERAL":
            ranges.append((av, av))
        elif op == "RANGE":
            ranges.append(av)
        elif op == "CATEGORY":
            ranges.extend(_category(av))
        else:
            raise GrammarError(f"pattern: {op} inside a character class is not supported")
    return _minus([(0, 0x7F)], ranges) if negate else _normalise(ranges)


def _pattern_nodes(parsed: Iterable[tuple[Any, Any]], field: str) -> list[Node]:
    out = []
    for op, av in parsed:
        op = str(op)
        if op == "LITERAL":
            out.append(json_chars([(av, av)]))
        elif op == "NOT_LITERAL":
            out.append(json_chars(_minus([(0, 0x7F)], [(av, av)])))
        elif op == "ANY":
            out.append(json_chars(_minus(ALL_CHARS, [(0x0A, 0x0A)])))
        elif op == "IN":
            out.append(json_chars(_class(av)))
        elif op in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, sub = av
            hi = None if hi == MAXREPEAT else hi
            if lo > MAX_COUNT or (hi is not None and hi > MAX_COUNT):
                raise GrammarError(f"pattern: repetition counts above {MAX_COUNT} are not supported", field)
            out.append(("rep", seq(*_pattern_nodes(sub, field)), lo, hi))
        elif op in ("SUBPATTERN", "ATOMIC_GROUP"):
            sub = av[-1] if op == "SUBPATTERN" else av
            if op == "SUBPATTERN" and (av[1] or av[2]):
                raise GrammarError("pattern: inline flags are not supported", field)
            out.append(seq(*_pattern_nodes(sub, field)))
        elif op == "BRANCH":
            out.append(alt(*(seq(*_pattern_nodes(b, field)) for b in av[1])))
        elif op == "CATEGORY":
            out.append(json_chars(_category(av)))
        else:
            raise GrammarError(f"pattern: {op.lower()} is not supported (anchors only at the ends)", field)
    return out


def pattern_string(pattern: str, field: str) -> Node:
    """The JSON strings whose decoded value contains a match of `pattern` (re.search semantics)."""
    try:
        parsed = list(_sre.parse(pattern))
    except re.error as exc:
        raise GrammarError(f"pattern is not a valid regular expression: {exc}", field) from None
    anything = ("rep", json_chars(ALL_CHARS), 0, None)
    head = [anything]
    if parsed and str(parsed[0][0]) == "AT" and str(parsed[0][1]) == "AT_BEGINNING":
        parsed, head = parsed[1:], []
    tail = [anything]
    if parsed and str(parsed[-1][0]) == "AT" and str(parsed[-1][1]) in ("AT_END", "AT_END_STRING"):
        parsed, tail = parsed[:-1], []
    return seq(lit('"'), *head, *_pattern_nodes(parsed, field), *tail, lit('"'))


FORMATS = {
    "date": r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])$",
    "time": r"^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$",
    "date-time": r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                 r"(\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$",
    "uuid": r"^[0-9a-f]{8}-[0-9a-f]{4}-[1-5][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$",
    "email": r"^[a-z0-9][a-z0-9._]{0,30}@[a-z0-9]{1,20}\.[a-z]{2,6}$",
}


# --- JSON Schema -> AST --------------------------------------------------------------------------

TYPE_KEYWORDS = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "boolean": set(), "null": set(),
}
GENERAL = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"}


def _canonical(value: Any) -> str:
    """A JSON value as text with sorted keys (equal values, equal text; 1 and 1.0 stay apart,
    which only refuses such a schema, never accepts a wrong value)."""
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)
KNOWN = set().union(*TYPE_KEYWORDS.values()) | GENERAL | ANNOTATIONS


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return {int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "null")


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


class _Compiler:
    def __init__(self, root: dict) -> None:
        self.root = root
        self.active: dict[str, int] = {}   # $ref -> expansions on the current path

    def value(self, schema: object, path: str) -> Node:
        if schema is True or schema == {}:
            return any_value()
        if schema is False:
            return NOTHING
        if not isinstance(schema, dict):
            raise GrammarError("a schema must be an object or a boolean", path or None)
        for key in schema:
            if key not in KNOWN:
                raise GrammarError(f"the JSON Schema keyword {key!r} is not supported", _join(path, key))
        if "$ref" in schema:
            return self.ref(schema["$ref"], _join(path, "$ref"))
        if "enum" in schema and (not isinstance(schema["enum"], list) or not schema["enum"]):
            raise GrammarError("enum must be a non-empty array", _join(path, "enum"))
        if "const" in schema:
            # beside an enum, const must be one of its values (compared as canonical JSON), or
            # nothing validates: the grammar would accept a value the schema refuses
            if "enum" in schema and _canonical(schema["const"]) not in {_canonical(v) for v in schema["enum"]}:
                raise GrammarError("const is not one of the enum values: no value can match", _join(path, "const"))
            return self.literals(self.admitted([schema["const"]], schema, _join(path, "const")), path)
        if "enum" in schema:
            return self.literals(self.admitted(schema["enum"], schema, _join(path, "enum")), path)
        for key in ("anyOf", "oneOf", "allOf"):
            if key in schema:
                return self.combination(schema, key, _join(path, key))
        types = schema.get("type")
        if types is None and "type" in schema:
            raise GrammarError("type must be a string or an array of strings", _join(path, "type"))
        if types is None:
            types = [t for t, words in TYPE_KEYWORDS.items() if words & set(schema)]
            if not types:
                return any_value()
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not types or any(t not in TYPE_KEYWORDS for t in types):
            raise GrammarError("type must be one of " + ", ".join(TYPE_KEYWORDS) + " (or an array of them)",
                               _join(path, "type"))
        return alt(*(getattr(self, "t_" + t)(schema, path) for t in types))

    def admitted(self, values: list[object], schema: dict, path: str) -> list[object]:
        """The const/enum values that the schema's other keywords (type, items, bounds...) also
        admit: the literals alone would let the engine write a value those keywords refuse. Each
        value's text is run through the automaton of the other keywords, so a value is kept only
        if the grammar would have produced it (a spelling the grammar does not write, such as 1.0
        for an integer, is dropped: stricter, never wrong)."""
        rest = {k: v for k, v in schema.items() if k not in ("const", "enum") and k not in ANNOTATIONS}
        if not rest:
            return values
        if "type" not in rest:  # only the values' own types matter (and integer bounds then stay exact)
            rest["type"] = sorted({_json_type(v) for v in values})
        start, accept, trans = dfa_of(compile_node(self.value(rest, path.rpartition(".")[0])))
        kept = []
        for v in values:
            try:
                text = json.dumps(v, ensure_ascii=False, separators=(", ", ": "), allow_nan=False).encode()
            except (TypeError, ValueError):
                raise GrammarError("enum/const values must be JSON", path) from None
            q = start
            for byte in text:
                q = next((t for lo, hi, t in trans[q] if lo <= byte <= hi), -1)
                if q < 0:
                    break
            if q >= 0 and accept[q]:
                kept.append(v)
        if not kept:
            raise GrammarError("no value of const/enum satisfies the schema's other keywords", path)
        return kept

    def literals(self, values: Iterable[object], path: str) -> Node:
        try:
            return alt(*(lit(json.dumps(v, ensure_ascii=False, separators=(", ", ": "), allow_nan=False))
                         for v in values))
        except (TypeError, ValueError):
            raise GrammarError("enum/const values must be JSON", path or None) from None

    def combination(self, schema: dict, key: str, path: str) -> Node:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise GrammarError(f"{key} must be a non-empty array", path)
        rest = {k: v for k, v in schema.items() if k != key and k not in ANNOTATIONS}
        if key == "allOf":
            if len(branches) != 1 or rest:
                raise GrammarError("allOf is supported only with a single schema", path)
            return self.value(branches[0], _join(path, 0))
        if rest:  # sibling keywords apply to each branch
            branches = [{**rest, **b} if isinstance(b, dict) else b for b in branches]
        return alt(*(self.value(b, _join(path, i)) for i, b in enumerate(branches)))

    def ref(self, ref: object, path: str) -> Node:
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise GrammarError("only local $ref (#/...) is supported", path)
        target = self.root
        for part in ref[2:].split("/") if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise GrammarError(f"$ref {ref!r} points nowhere", path)
            target = target[part]
        depth = self.active.get(ref, 0)
        if depth >= REF_DEPTH:
            return NOTHING  # a recursion this deep: only the branches that end remain
        self.active[ref] = depth + 1
        try:
            return self.value(target, ref[2:].replace("/", "."))
        finally:
            self.active[ref] = depth

    @overload
    def _count(self, schema: dict, key: str, path: str, default: int) -> int: ...

    @overload
    def _count(self, schema: dict, key: str, path: str, default: None = None) -> int | None: ...

    def _count(self, schema: dict, key: str, path: str, default: int | None = None) -> int | None:
        if key not in schema:
            return default
        v = schema[key]  # null too is refused here, naming the keyword (it was a TypeError further on)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise GrammarError(f"{key} must be a non-negative integer", _join(path, key))
        if v > MAX_COUNT:
            raise GrammarError(f"{key} above {MAX_COUNT} is not supported", _join(path, key))
        return v

    def t_string(self, schema: dict, path: str) -> Node:
        lo, hi = self._count(schema, "minLength", path, 0), self._count(schema, "maxLength", path)
        if "pattern" in schema or "format" in schema:
            if "minLength" in schema or "maxLength" in schema:
                key = "minLength" if "minLength" in schema else "maxLength"
                raise GrammarError(f"{key} together with pattern or format is not supported", _join(path, key))
            if "pattern" in schema:
                if not isinstance(schema["pattern"], str):
                    raise GrammarError("pattern must be a string", _join(path, "pattern"))
                return pattern_string(schema["pattern"], _join(path, "pattern"))
            fmt = schema["format"]
            if fmt not in FORMATS:
                raise GrammarError(f"format {str(fmt)[:40]!r} is not supported (" + ", ".join(FORMATS) + ")",
                                   _join(path, "format"))
            return pattern_string(FORMATS[fmt], _join(path, "format"))
        if hi is not None and hi < lo:
            return NOTHING
        if lo == 0 and hi is None:
            return STRING
        return seq(lit('"'), ("rep", COUNTED_CHAR, lo, hi), lit('"'))

    def _bound(self, schema: dict, key: str, path: str) -> int | float | None:
        v = schema.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise GrammarError(f"{key} must be a number", _join(path, key))
        if abs(v) > MAX_BOUND:  # a 142-digit bound took minutes to compile (found by hypothesis)
            raise GrammarError(f"{key} must be within ±2^63", _join(path, key))
        return v

    def t_integer(self, schema: dict, path: str) -> Node:
        lo, hi = self._bound(schema, "minimum", path), self._bound(schema, "maximum", path)
        xlo, xhi = self._bound(schema, "exclusiveMinimum", path), self._bound(schema, "exclusiveMaximum", path)
        lows = [math.ceil(lo)] if lo is not None else []
        highs = [math.floor(hi)] if hi is not None else []
        if xlo is not None:
            lows.append(math.floor(xlo) + 1)
        if xhi is not None:
            highs.append(math.ceil(xhi) - 1)
        if not lows and not highs:
            return INTEGER
        return int_range(max(lows) if lows else None, min(highs) if highs else None)

    def t_number(self, schema: dict, path: str) -> Node:
        for key in ("maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if key in schema:
                raise GrammarError(f"{key} on a number is not supported (integers take bounds)", _join(path, key))
        lo = self._bound(schema, "minimum", path)
        if lo is None:
            return NUMBER
        if lo != 0:
            raise GrammarError("minimum on a number is supported only as 0", _join(path, "minimum"))
        return seq(NONNEG_INT, ("rep", FRACTION, 0, 1), ("rep", EXPONENT, 0, 1))

    def t_boolean(self, schema: dict, path: str) -> Node:
        return alt(lit("true"), lit("false"))

    def t_null(self, schema: dict, path: str) -> Node:
        return lit("null")

    def t_object(self, schema: dict, path: str) -> Node:
        props = schema.get("properties") or {}
        if not isinstance(props, dict):
            raise GrammarError("properties must be an object", _join(path, "properties"))
        required = schema.get("required") or []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise GrammarError("required must be an array of strings", _join(path, "required"))
        missing = [r for r in required if r not in props]
        extra = schema.get("additionalProperties", True if not props else False)
        if missing and extra is False:
            raise GrammarError(f"required property {missing[0]!r} is not in properties", _join(path, "required"))
        if not props:
            if extra is False:
                return lit("{}")
            value = any_value() if extra is True else self.value(extra, _join(path, "additionalProperties"))
            if missing:
                members = [(name, value, True) for name in missing]
                return seq(lit("{"), WS, ("members", members), WS, lit("}"))
            return _container("object", seq(STRING, WS, lit(":"), WS, value))
        members = [(name, self.value(sub, _join(_join(path, "properties"), name)), name in required)
                   for name, sub in props.items()]
        if missing:
            value = any_value() if extra is True else self.value(extra, _join(path, "additionalProperties"))
            members += [(name, value, True) for name in missing]
        for name, node, req in members:
            if req and node == NOTHING:
                raise GrammarError(f"required property {name!r} allows no value", _join(path, "properties"))
        return seq(lit("{"), WS, ("members", members), WS, lit("}"))

    def t_array(self, schema: dict, path: str) -> Node:
        lo, hi = self._count(schema, "minItems", path, 0), self._count(schema, "maxItems", path)
        prefix = schema.get("prefixItems")
        items = schema.get("items", True)
        if prefix is not None:
            if not isinstance(prefix, list):
                raise GrammarError("prefixItems must be an array", _join(path, "prefixItems"))
            if items is not False or "minItems" in schema or "maxItems" in schema:
                raise GrammarError("prefixItems is supported only as a fixed tuple (items: false)",
                                   _join(path, "prefixItems"))
            nodes = [self.value(s, _join(_join(path, "prefixItems"), i)) for i, s in enumerate(prefix)]
            if not nodes:
                return lit("[]")
            body = [nodes[0]] + [n for node in nodes[1:] for n in (seq(WS, lit(","), WS), node)]
            return seq(lit("["), WS, *body, WS, lit("]"))
        if isinstance(items, list):
            raise GrammarError("items as an array is not supported (use prefixItems)", _join(path, "items"))
        if hi is not None and hi < lo:
            return NOTHING
        item = self.value(items, _join(path, "items"))
        if item == NOTHING:
            return lit("[]") if lo == 0 else NOTHING
        return _container("array", item, lo, hi)


def grammar_for_schema(schema: dict | bool) -> bytes:
    """A JSON Schema -> CGD1 wire bytes; GrammarError names the keyword and where it is.
    Clients send the same schema again and again: the last SCHEMA_CACHE compilations are kept."""
    if not isinstance(schema, (dict, bool)):
        raise GrammarError("the schema must be a JSON object")
    try:
        return _compiled(json.dumps(schema, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, GrammarError):
            raise
        raise GrammarError("the schema must be JSON") from None
    except RecursionError:
        raise GrammarError("the schema is nested too deeply") from None


SCHEMA_CACHE = 64


@functools.lru_cache(maxsize=SCHEMA_CACHE)
def _compiled(key: str) -> bytes:
    schema = json.loads(key)
    node = _Compiler(schema if isinstance(schema, dict) else {}).value(schema, "")
    if node == NOTHING:
        raise GrammarError("the schema allows no value at all")
    return compile_node(node)
