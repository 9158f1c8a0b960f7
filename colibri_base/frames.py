"""Websocket server frames as data: TypedDict declarations rendered as the front end's TypeScript
union, and checked against the frames a test receives.

Why here: every socket app (chat, experts) declares its frames once, in its own
`<app>/server_frames.py` (TypedDicts and the only functions that build them), and the front end's
type of them is generated from those declarations rather than written by hand beside them. The
machinery that turns a declaration into TypeScript and checks a frame against it is the same for
every app, so it lives below them; each app hands in its frames as a FrameSet.

Invariants: nothing here imports an app (the FrameSet carries all an app knows); `typescript()` is
a pure function of the FrameSet (the file on disk is compared byte for byte by the apps' tests and
by `manage.py frames_ts --check`); a nested shape named in `ts_names` is spelled by that name and
is the hand-written interface's to keep complete (`interface_keys` reads it back for the tests),
any other nested TypedDict is spelled inline.
"""
import posixpath
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

COMMAND = "python manage.py frames_ts"  # writes every app's generated file (colibri_site's command)


def frame_type(cls: type) -> str:
    """The `type` literal of a frame TypedDict."""
    return str(typing.get_args(typing.get_type_hints(cls)["type"])[0])


def fields(cls: type) -> list[tuple[str, Any, bool]]:
    """(name, annotation, required) of a TypedDict, in declaration order."""
    hints = typing.get_type_hints(cls)
    required: frozenset[str] = getattr(cls, "__required_keys__")
    return [(name, hints[name], name in required) for name in cls.__annotations__]


@dataclass(frozen=True)
class FrameSet:
    """One socket's server frames and where their TypeScript goes.

    Paths are relative to the repository root, with "/" separators. `ts_names` maps a nested
    TypedDict to the name of the interface the front end declares by hand (used for HTTP too);
    `ts_files` names the .ts file that declares each such name, from which the generated file
    imports it.
    """

    source: str  # the declaring module, e.g. "chat/server_frames.py"
    target: str  # the generated file, e.g. "frontend/src/server_events.ts"
    test: str  # the test that fails while `target` is stale
    union: str  # the exported union's name, e.g. "ServerEvent"
    frames: tuple[type, ...]
    ts_names: Mapping[type, str]
    ts_files: Mapping[str, str]

    def __post_init__(self) -> None:
        unfiled = set(self.ts_names.values()) - set(self.ts_files)
        if unfiled:
            raise ValueError(f"ts_files names no file for {sorted(unfiled)}")
        kinds = [frame_type(cls) for cls in self.frames]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"two frames share a type: {kinds}")

    def ts(self, annotation: Any) -> str:
        """The TypeScript spelling of one annotation."""
        if annotation in self.ts_names:
            return self.ts_names[annotation]
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if annotation is int or annotation is float:
            return "number"
        if annotation is str:
            return "string"
        if annotation is bool:
            return "boolean"
        if annotation is type(None):
            return "null"
        if annotation is Any:
            return "unknown"
        if typing.is_typeddict(annotation):
            return f"{{ {self._members(annotation)} }}"
        if origin is Literal:
            return " | ".join(f'"{a}"' for a in args)
        if origin in (Union, types.UnionType):
            return " | ".join(self.ts(a) for a in args)
        if origin is list:
            inner = self.ts(args[0])
            return f"({inner})[]" if "|" in inner else f"{inner}[]"
        if origin is dict:
            return f"Record<{self.ts(args[0])}, {self.ts(args[1])}>"
        raise TypeError(f"no TypeScript spelling for {annotation!r}")

    def _members(self, cls: type) -> str:
        return "; ".join(f"{name}{'' if req else '?'}: {self.ts(ann)}" for name, ann, req in fields(cls))

    def _imports(self) -> list[str]:
        """One `import type` line per hand-written .ts file, by module specifier, names sorted."""
        here = posixpath.dirname(self.target)
        by_spec: dict[str, set[str]] = {}
        for name in self.ts_names.values():
            spec = posixpath.relpath(posixpath.splitext(self.ts_files[name])[0], here)
            by_spec.setdefault(spec if spec.startswith("../") else f"./{spec}", set()).add(name)
        return [f'import type {{ {", ".join(sorted(names))} }} from "{spec}";' for spec, names in sorted(by_spec.items())]

    def typescript(self) -> str:
        """The generated file: a header, the imports of the named shapes, the union (one member
        per frame, in declaration order)."""
        lines = [
            f"// Generated from {self.source} by `{COMMAND}`: do not edit by hand",
            f"// ({self.test} fails while this file differs from what the server declares).",
            *self._imports(),
            "",
            f"export type {self.union} =",
        ]
        lines += [f"  | {{ {self._members(cls)} }}" for cls in self.frames]
        lines[-1] += ";"
        return "\n".join(lines) + "\n"

    def problems(self, frame: object) -> list[str]:
        """What makes `frame` differ from its declaration (empty: it conforms); for tests."""
        kind = frame.get("type") if isinstance(frame, dict) else None
        cls = next((c for c in self.frames if frame_type(c) == kind), None)
        if cls is None:
            return [f"unknown frame type {kind!r}"]
        return self._dict_problems(frame, cls, str(kind))

    def _value_problems(self, value: object, annotation: Any, where: str) -> list[str]:
        if annotation in self.ts_names or typing.is_typeddict(annotation):
            return self._dict_problems(value, annotation, where)
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if annotation is Any:
            return []
        if origin in (Union, types.UnionType):
            options = [self._value_problems(value, a, where) for a in args]
            return [] if any(not o for o in options) else [f"{where}: {value!r} is none of {self.ts(annotation)}"]
        if origin is Literal:
            return [] if value in args else [f"{where}: {value!r} is not {self.ts(annotation)}"]
        if origin is list:
            if not isinstance(value, list):
                return [f"{where}: {value!r} is not a list"]
            return [p for i, v in enumerate(value) for p in self._value_problems(v, args[0], f"{where}[{i}]")]
        if origin is dict:
            return [] if isinstance(value, dict) else [f"{where}: {value!r} is not an object"]
        if annotation is type(None):
            return [] if value is None else [f"{where}: {value!r} is not null"]
        if annotation is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif annotation is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, annotation)
        return [] if ok else [f"{where}: {value!r} is not {self.ts(annotation)}"]

    def _dict_problems(self, value: object, cls: type, where: str) -> list[str]:
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not an object"]
        declared = fields(cls)
        out = [f"{where}.{k}: not declared" for k in value if k not in {n for n, _, _ in declared}]
        for name, ann, req in declared:
            if name in value:
                out += self._value_problems(value[name], ann, f"{where}.{name}")
            elif req:
                out.append(f"{where}.{name}: missing")
        return out


def interface_keys(ts_source: str, name: str) -> dict[str, bool] | None:
    """{key: optional} of `export interface <name> { ... }` in a TypeScript source (one line or
    many; nested object types and comments skipped), None when it declares no such interface.

    The reverse of `FrameSet.ts` for the shapes named in `ts_names`: tests hold a hand-written
    interface to every key its TypedDict declares, since the generated union trusts the name."""
    head = re.search(rf"export interface {re.escape(name)}\b[^{{]*\{{", ts_source)
    if head is None:
        return None
    text = re.sub(r"//[^\n]*", "", ts_source[head.end():])
    depth, member_start, members = 1, 0, []
    for i, ch in enumerate(text):
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
            if depth == 0:
                members.append(text[member_start:i])
                break
        elif depth == 1 and ch in ";\n":
            members.append(text[member_start:i])
            member_start = i + 1
    out: dict[str, bool] = {}
    for member in members:
        m = re.match(r"\s*(?:readonly\s+)?(\w+)(\?)?\s*:", member)
        if m:
            out[m[1]] = m[2] == "?"
    return out
