"""The colibri mux protocol: engine stdout -> typed events, and the commands we write to stdin.

Reference: /work/shared/reference/mux-protocol.md. Rules that shape this module:
* stdout before the READY sentinel is banner text, not protocol (§2);
* DATA, TOOL and ECHO payloads are read by byte count, then exactly one '\n' (§4.2, §4.7);
* unknown kinds are ignored (logged once), a malformed line of a known kind is a ProtocolError
  (the caller restarts the engine);
* a SUBMIT the engine rejects leaves its payload in the pipe, so we validate before writing (§5).
"""
import json
import logging
import math
import re
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

from engine_bridge import sampling

log = logging.getLogger(__name__)

READY_LINE = b"\x01\x01READY\x01\x01"
MAX_LINE = 16 * 1024 * 1024
MAX_FRAME = 16 * 1024 * 1024
MAX_PAYLOAD = 16 * 1024 * 1024
MAX_GRAMMAR = 1024 * 1024  # the 7th field's bytes (mux-protocol.md §3.1)
_warned_kinds: set[str] = set()


class ProtocolError(Exception):
    """The engine broke the protocol; the stream can no longer be trusted."""


class SubmitError(ValueError):
    """A command we were about to write would be rejected by the engine."""


@dataclass
class Banner:
    text: str


@dataclass
class Ready:
    pass


@dataclass
class Stat:
    values: list


@dataclass
class Caps:
    caps: dict


@dataclass
class HwInfo:
    cores: int
    ram_total_gb: float
    ram_avail_gb: float
    ngpu: int
    vram_total_gb: float
    cpu: str
    gpu: str


@dataclass
class Tiers:
    vram_experts: int
    ram_experts: int
    disk_experts: int
    vram_gb: float
    ram_gb: float


@dataclass
class Emap:
    rows: int
    cols: int
    hex: str


@dataclass
class Hits:
    rows: int
    cols: int
    hex: str


@dataclass
class Gpus:
    gpus: list  # [{"used_gb", "total_gb", "experts"}]


@dataclass
class GpuDetail:
    pass


@dataclass
class Model:
    info: dict


@dataclass
class Accept:
    id: int
    prompt_tokens: int
    extras: dict = field(default_factory=dict)


@dataclass
class Data:
    id: int
    data: bytes
    logprob: float | None = None
    top: list | None = None  # [[token_id, logprob], ...] with logprobs=k
    token_bytes: bytes | None = None  # lptext=1: the sampled token's raw bytes
    top_bytes: list | None = None     # lptext=1: each candidate's raw bytes, in `top`'s order


@dataclass
class TopK:
    id: int
    candidates: list  # [[logprob, text], ...]


@dataclass
class Perf:
    id: int
    values: dict


@dataclass
class Prof:
    values: dict


@dataclass
class Entropy:
    values: list


@dataclass
class Routes:
    id: int
    rows: int
    cols: int
    counts: list  # [[row, expert, count], ...], nonzero, sorted by row then expert


@dataclass
class RouteStep:
    """ROUTESTEP (routes=2): the expert selections of one generated token the engine forwarded."""
    id: int
    rows: int
    cols: int
    k: int          # experts per token: `picks` holds k ids per MoE row
    picks: list     # rows * k expert ids, row-major, each < cols


@dataclass
class Repin:
    layer: int
    expert: int
    old_tier: int
    gpu: int


@dataclass
class IoStat:
    """Our engine's per-turn expert I/O (IOSTAT, emitted once per turn right before its DONE; the
    real colibri engine never sends it). figures() is the one place its derived figures are built."""
    id: int
    tokens: int            # tokens the turn ran through the model (prompt + generated)
    disk_bytes: int        # expert bytes read from disk during the turn
    ideal_bytes: int       # bytes of the experts its tokens selected, each (step, layer, expert) once
    hits: int              # expert acquisitions served from RAM
    acquisitions: int      # all expert acquisitions
    stall_s: float         # seconds the forward waited for expert reads
    prefetch_issued: int   # lookahead reads issued
    prefetch_used: int     # of those, later used

    def figures(self) -> dict[str, Any]:
        """The turn's I/O as the site shows it (telemetry `iostat`, done `io`, /v1/stats `io`):
        the raw counts plus per-token bytes and stall, hit % and prefetch accuracy (None where the
        denominator is 0)."""
        per_token = (lambda v, scale=1: round(v * scale / self.tokens, 3)) if self.tokens else (lambda v, scale=1: None)
        return {
            "id": self.id, "tokens": self.tokens, "disk_bytes": self.disk_bytes, "ideal_bytes": self.ideal_bytes,
            "hits": self.hits, "acquisitions": self.acquisitions, "stall_s": self.stall_s,
            "prefetch_issued": self.prefetch_issued, "prefetch_used": self.prefetch_used,
            "disk_bytes_per_token": per_token(self.disk_bytes), "ideal_bytes_per_token": per_token(self.ideal_bytes),
            "hit_pct": round(100 * self.hits / self.acquisitions, 2) if self.acquisitions else None,
            "stall_ms_per_token": per_token(self.stall_s, 1000),
            "prefetch_accuracy_pct": (round(100 * self.prefetch_used / self.prefetch_issued, 2)
                                      if self.prefetch_issued else None),
        }


@dataclass
class SlotMem:
    """Our engine's memory of one slot after a turn (SLOTMEM, in the turn-end block): its K/V rows,
    a linear-attention hybrid's recurrent state with its checkpoints (0 for a transformer)."""
    slot: int
    kv_bytes: int
    state_bytes: int       # the live state plus its checkpoints
    checkpoints: int

    def figures(self) -> dict[str, int]:
        return {"kv_bytes": self.kv_bytes, "state_bytes": self.state_bytes, "checkpoints": self.checkpoints,
                "total_bytes": self.kv_bytes + self.state_bytes}


@dataclass
class Done:
    id: int
    emitted: int
    tok_s: float
    hit_pct: float
    rss_gb: float
    prompt_tokens: int
    length_limited: bool


@dataclass
class Error:
    id: int
    code: str
    args: list = field(default_factory=list)
    n: int | None = None       # CONTEXT_EXCEEDED only
    limit: int | None = None   # CONTEXT_EXCEEDED only

    @property
    def message(self) -> str:
        return " ".join([self.code, *self.args])


@dataclass
class Tool:
    id: int


@dataclass
class Echo:
    id: int


PROF_FIELDS = [
    "wall_s", "prompt_tokens", "completion_tokens", "expert_disk_s", "expert_wait_s",
    "expert_matmul_s", "attention_s", "lm_head_s", "forwards",
    "fwd_p50_ms", "fwd_p99_ms", "physical_ssd_bytes", "rammap_experts", "rammap_bytes",
    "ttft_ms", "prefault_s", "physical_ssd_valid",
]
PERF_FIELDS = ["dt", "t_edisk", "t_ewait", "t_emm", "t_attn", "t_kvb", "t_head"]


# --- helpers ---------------------------------------------------------------------------------

def _int(tok: str, lo: int | None = None) -> int:
    try:
        value = int(tok)
    except ValueError:
        raise ProtocolError(f"bad integer {tok!r}") from None
    if lo is not None and value < lo:
        raise ProtocolError(f"integer {value} below {lo}")
    return value


def _float(tok: str) -> float:
    try:
        value = float(tok)
    except ValueError:
        raise ProtocolError(f"bad number {tok!r}") from None
    if not math.isfinite(value):
        raise ProtocolError(f"non-finite number {tok!r}")
    return value


def _need(toks: list[str], n: int, kind: str) -> None:
    if len(toks) < n:
        raise ProtocolError(f"{kind}: expected at least {n - 1} fields, got {len(toks) - 1}")


def _hex(tok: str, nbytes: int, kind: str) -> str:
    if len(tok) != 2 * nbytes or not re.fullmatch(r"[0-9a-fA-F]*", tok):
        raise ProtocolError(f"{kind}: expected {nbytes} hex bytes")
    return tok.lower()


def _kv(tokens: Iterable[str]) -> dict[str, int | str]:
    out: dict[str, int | str] = {}
    for tok in tokens:
        key, sep, value = tok.partition("=")
        if not sep:
            continue
        try:
            out[key] = int(value)
        except ValueError:
            out[key] = value
    return out


def emap_cells(hex_str: str) -> list[tuple[int, int]]:
    """EMAP bytes as (tier, heat) pairs, row-major: tier = byte >> 6, heat = byte & 63."""
    return [(b >> 6, b & 63) for b in bytes.fromhex(hex_str)]


def hit_bit(hex_str: str, index: int) -> bool:
    """True when expert `index` (row * cols + col) is set in a HITS bitmap (LSB-first per byte)."""
    data = bytes.fromhex(hex_str)
    return bool(data[index >> 3] & (1 << (index & 7)))


def hit_indices(hex_str: str, count: int | None = None) -> list[int]:
    """Indices of the set bits of a HITS bitmap, LSB-first within each byte."""
    data = bytes.fromhex(hex_str)
    total = len(data) * 8 if count is None else count
    return [i for i in range(total) if data[i >> 3] & (1 << (i & 7))]


# --- line parsers (one per kind); each gets the tokens of the line -----------------------------

def _stat(toks: list[str], line: str) -> Stat:
    if len(toks) - 1 not in (4, 6):
        raise ProtocolError("STAT: expected 4 or 6 values")
    return Stat([_float(t) for t in toks[1:]])


def _hwinfo(toks: list[str], line: str) -> HwInfo:
    m = re.match(r"HWINFO\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)(?:\s(.*))?$", line)
    if not m:
        raise ProtocolError("HWINFO: expected 5 numbers and a name")
    cpu, _, gpu = (m.group(6) or "").partition("|")
    return HwInfo(_int(m.group(1)), _float(m.group(2)), _float(m.group(3)), _int(m.group(4)),
                  _float(m.group(5)), cpu.strip(), gpu.strip())


def _tiers(toks: list[str], line: str) -> Tiers:
    _need(toks, 6, "TIERS")
    return Tiers(_int(toks[1]), _int(toks[2]), _int(toks[3]), _float(toks[4]), _float(toks[5]))


def _emap(toks: list[str], line: str) -> Emap:
    _need(toks, 4, "EMAP")
    rows, cols = _int(toks[1], 0), _int(toks[2], 0)
    return Emap(rows, cols, _hex(toks[3], rows * cols, "EMAP"))


def _hits(toks: list[str], line: str) -> Hits:
    _need(toks, 4, "HITS")
    rows, cols = _int(toks[1], 0), _int(toks[2], 0)
    return Hits(rows, cols, _hex(toks[3], (rows * cols + 7) // 8, "HITS"))


def _gpus(toks: list[str], line: str) -> Gpus:
    _need(toks, 2, "GPUS")
    n = _int(toks[1], 0)
    if len(toks) != 2 + 3 * n:
        raise ProtocolError("GPUS: expected 3 values per device")
    return Gpus([{"used_gb": _float(toks[2 + 3 * i]), "total_gb": _float(toks[3 + 3 * i]),
                  "experts": _int(toks[4 + 3 * i])} for i in range(n)])


def _model(toks: list[str], line: str) -> Model:
    try:
        info = json.loads(line[len("MODEL"):].strip())
    except ValueError:
        raise ProtocolError("MODEL: bad json") from None
    if not isinstance(info, dict):
        raise ProtocolError("MODEL: expected a json object")
    return Model(info)


def _accept(toks: list[str], line: str) -> Accept:
    _need(toks, 3, "ACCEPT")
    return Accept(_int(toks[1], 1), _int(toks[2], 0), _kv(toks[3:]))


def _topk(toks: list[str], line: str) -> TopK:
    _need(toks, 3, "TOPK")
    k = _int(toks[2], 0)
    if len(toks) != 3 + 2 * k:
        raise ProtocolError("TOPK: expected k (logprob, hextext) pairs")
    cands = []
    for i in range(k):
        try:
            text = bytes.fromhex(toks[4 + 2 * i]).decode("utf-8", "replace")
        except ValueError:
            raise ProtocolError("TOPK: bad hex text") from None
        cands.append([_float(toks[3 + 2 * i]), text])
    return TopK(_int(toks[1], 1), cands)


def _perf(toks: list[str], line: str) -> Perf:
    _need(toks, 3, "PERF")
    return Perf(_int(toks[1], 1), dict(zip(PERF_FIELDS, (_float(t) for t in toks[2:]))))


def _prof(toks: list[str], line: str) -> Prof:
    _need(toks, 10, "PROF")
    values = dict(zip(PROF_FIELDS, (_float(t) for t in toks[1:])))
    for key in ("prompt_tokens", "completion_tokens", "forwards"):
        values[key] = int(values[key])
    return Prof(values)


def _entropy(toks: list[str], line: str) -> Entropy:
    return Entropy([_float(t) for t in toks[1:]])


def _routes(toks: list[str], line: str) -> Routes:
    _need(toks, 4, "ROUTES")
    rid, rows, cols = _int(toks[1], 1), _int(toks[2], 0), _int(toks[3], 0)
    counts = []
    for tok in toks[4:]:
        parts = tok.split(":")
        if len(parts) != 3:
            raise ProtocolError(f"ROUTES: expected row:expert:count, got {tok[:40]!r}")
        row, expert, count = (_int(t, 0) for t in parts)
        if row >= rows or expert >= cols or count < 1:
            raise ProtocolError(f"ROUTES: {tok[:40]!r} outside {rows}x{cols} or zero")
        counts.append([row, expert, count])
    return Routes(rid, rows, cols, counts)


def _routestep(toks: list[str], line: str) -> RouteStep:
    _need(toks, 6, "ROUTESTEP")
    rid, rows, cols, k = _int(toks[1], 1), _int(toks[2], 1), _int(toks[3], 1), _int(toks[4], 1)
    width = 4 if cols > 256 else 2
    hexed = toks[5]
    if len(toks) != 6 or len(hexed) != rows * k * width:
        raise ProtocolError(f"ROUTESTEP: expected {rows}x{k} ids of {width} hex digits")
    try:
        raw = bytes.fromhex(hexed)
    except ValueError:
        raise ProtocolError("ROUTESTEP: bad hex") from None
    picks = list(raw) if width == 2 else [int.from_bytes(raw[i:i + 2], "big") for i in range(0, len(raw), 2)]
    if k > cols or max(picks) >= cols:
        raise ProtocolError(f"ROUTESTEP: an expert outside 0..{cols - 1} or k above it")
    return RouteStep(rid, rows, cols, k, picks)


def _repin(toks: list[str], line: str) -> Repin:
    _need(toks, 5, "REPIN")
    return Repin(*(_int(t) for t in toks[1:5]))


def _slotmem(toks: list[str], line: str) -> SlotMem:
    _need(toks, 5, "SLOTMEM")
    return SlotMem(*(_int(t, 0) for t in toks[1:5]))


def _iostat(toks: list[str], line: str) -> IoStat:
    _need(toks, 10, "IOSTAT")
    rid, tokens, disk, ideal, hits, acq = _int(toks[1], 1), *(_int(t, 0) for t in toks[2:7])
    stall = _float(toks[7])
    issued, used = _int(toks[8], 0), _int(toks[9], 0)
    if hits > acq or stall < 0:
        raise ProtocolError("IOSTAT: hits above acquisitions or a negative stall")
    return IoStat(rid, tokens, disk, ideal, hits, acq, stall, issued, used)


def _done(toks: list[str], line: str) -> Done:
    _need(toks, 9, "DONE")
    if toks[2] != "STAT":
        raise ProtocolError("DONE: expected STAT")
    return Done(_int(toks[1], 1), _int(toks[3], 0), _float(toks[4]), _float(toks[5]),
                _float(toks[6]), _int(toks[7], 0), toks[8] == "1")


def _error(toks: list[str], line: str) -> Error:
    _need(toks, 3, "ERROR")
    err = Error(_int(toks[1], 0), toks[2], toks[3:])
    if err.code == "CONTEXT_EXCEEDED":
        kv = _kv(err.args)
        nums = [int(t) for t in err.args if t.lstrip("-").isdigit()]
        if "prompt_tokens" in kv or "capacity" in kv:   # Kimi-style key=value form
            n, limit = kv.get("prompt_tokens"), kv.get("capacity", kv.get("limit"))
            # a value that is no integer is no count (it went into n / limit as a str)
            err.n, err.limit = (n if isinstance(n, int) else None), (limit if isinstance(limit, int) else None)
        elif len(nums) >= 2:                             # GLM positional form: n limit
            err.n, err.limit = nums[0], nums[1]
    return err


Event = (Banner | Ready | Stat | Caps | HwInfo | Tiers | Emap | Hits | Gpus | GpuDetail | Model | Accept | Data
         | TopK | Perf | Prof | Entropy | Routes | RouteStep | Repin | IoStat | SlotMem | Done | Error | Tool | Echo)

LINE_KINDS: dict[str, Callable[[list[str], str], Event]] = {
    "STAT": _stat, "CAPS": lambda t, l: Caps(_kv(t[1:])), "HWINFO": _hwinfo, "TIERS": _tiers,
    "EMAP": _emap, "HITS": _hits, "GPUS": _gpus, "GPUDETAIL": lambda t, l: GpuDetail(),
    "MODEL": _model, "ACCEPT": _accept, "TOPK": _topk, "PERF": _perf, "PROF": _prof,
    "ENTROPY": _entropy, "ROUTES": _routes, "ROUTESTEP": _routestep, "REPIN": _repin, "IOSTAT": _iostat,
    "SLOTMEM": _slotmem, "DONE": _done, "ERROR": _error,
}
FRAME_KINDS = {"DATA", "TOOL", "ECHO"}


def parse_line(line: str) -> Event | None:
    """One protocol line (str, no '\\n') -> event; None for unknown kinds."""
    toks = line.split()
    if not toks:
        raise ProtocolError("blank line")
    kind = toks[0]
    parser = LINE_KINDS.get(kind)
    if parser is None:
        if kind not in _warned_kinds:
            _warned_kinds.add(kind)
            log.warning("ignoring unknown engine line kind %r", kind[:40])
        return None
    return parser(toks, line)


def _hex_bytes(tok: str) -> bytes:
    if tok == "-":
        return b""
    try:
        return bytes.fromhex(tok)
    except ValueError:
        raise ProtocolError(f"bad hex token bytes {tok[:40]!r}") from None


def _frame_header(toks: list[str]) -> tuple[Data | Tool | Echo, int]:
    """DATA/TOOL/ECHO header -> (partial event, byte count)."""
    kind = toks[0]
    _need(toks, 3, kind)
    req, n = _int(toks[1], 1), _int(toks[2], 0)
    if n > MAX_FRAME:
        raise ProtocolError(f"{kind}: frame of {n} bytes")
    if kind == "DATA":
        event = Data(req, b"")
        if len(toks) > 3:  # logprobs tail: <lp> <k> [<tid> <tlp>]*k, lptext=1: + <hex> * (k+1)
            _need(toks, 5, kind)
            k = _int(toks[4], 0)
            if len(toks) not in (5 + 2 * k, 6 + 3 * k):
                raise ProtocolError("DATA: bad logprobs tail")
            event.logprob = _float(toks[3])
            event.top = [[_int(toks[5 + 2 * i]), _float(toks[6 + 2 * i])] for i in range(k)]
            if len(toks) == 6 + 3 * k:
                hexes = [_hex_bytes(t) for t in toks[5 + 2 * k:]]
                event.token_bytes, event.top_bytes = hexes[0], hexes[1:]
        return event, n
    return (Tool(req) if kind == "TOOL" else Echo(req)), n


class Parser:
    """Push parser: feed() raw stdout bytes in chunks of any size, get complete events back."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.ready = False
        # (event, byte count) while a frame payload is incomplete
        self.pending: tuple[Data | Tool | Echo, int] | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        self.buf += chunk
        buf, pos = self.buf, 0
        events: list[Event] = []
        try:
            while True:
                if self.pending is not None:
                    event, n = self.pending
                    if len(buf) - pos < n + 1:
                        break
                    if buf[pos + n] != 0x0A:
                        raise ProtocolError(f"frame of {n} bytes not followed by a newline")
                    if isinstance(event, Data):
                        event.data = bytes(buf[pos:pos + n])
                    pos += n + 1
                    self.pending = None
                    events.append(event)
                    continue
                end = buf.find(b"\n", pos)
                if end < 0:
                    if len(buf) - pos > MAX_LINE:
                        raise ProtocolError("line too long")
                    break
                raw = bytes(buf[pos:end]).rstrip(b"\r")
                pos = end + 1
                line_event = self._line(raw)
                if line_event is not None:
                    events.append(line_event)
        finally:
            del buf[:pos]  # once per chunk: consumed lines are not moved one by one
        return events

    def _line(self, raw: bytes) -> Event | None:
        if not self.ready:
            if raw == READY_LINE:
                self.ready = True
                return Ready()
            return Banner(raw.decode("utf-8", "replace"))
        line = raw.decode("utf-8", "replace")
        toks = line.split()
        if toks and toks[0] in FRAME_KINDS:
            self.pending = _frame_header(toks)
            return None
        return parse_line(line)


# --- commands ----------------------------------------------------------------------------------

def format_number(value: float) -> str:
    """Shortest decimal form without exponent: 0.7 -> '0.7', 1.0 -> '1', 1e-05 -> '0.00001'."""
    text = format(Decimal(repr(float(value))), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or "0"


MAX_LOGPROBS = 32  # the engine's logprobs=k bound


def format_submit(req_id: int, slot: int, payload: str | bytes, max_tokens: int, temperature: float | None,
                  top_p: float | None, *,
                  slots: int, seed: int | None = None, experts: int | None = None, routes: bool = False,
                  route_steps: bool = False, heat: bool = True, top_k: int | None = None, logprobs: int = 0,
                  grammar: bytes | None = None) -> bytes:
    """SUBMIT header + payload + '\\n' as one bytes object; SubmitError if the engine would refuse.

    `seed`, `experts`, `routes`, `heat`, `top_k` and `logprobs` become key=value fields
    (`seed=<u64>`, `experts=<n>`, `routes=1` (`routes=2` with route_steps: also a ROUTESTEP line
    per generated token, for an engine whose MODEL line says "routes": 2), `heat=0`, `top_k=<n>`, `logprobs=<k> lptext=1`; a
    field at its default is not written): only engines that announce our
    extensions (the MODEL line) take them; the real colibri engine refuses unknown keys.
    `grammar` (CGD1 bytes, engine_bridge.grammar) goes as the 7th positional field's bytes with
    `grammar=1`: only for an engine whose MODEL line says "grammar": "CGD1"."""
    if not isinstance(req_id, int) or req_id < 1:
        raise SubmitError("id must be >= 1")
    if not isinstance(slot, int) or not 0 <= slot < slots:
        raise SubmitError(f"slot must be in 0..{slots - 1}")
    if isinstance(payload, str):
        try:
            payload = payload.encode("utf-8")
        except UnicodeEncodeError:
            raise SubmitError("prompt is not valid UTF-8") from None
    else:
        try:
            bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            raise SubmitError("prompt is not valid UTF-8") from None
    if b"\x00" in payload:
        raise SubmitError("prompt contains NUL")
    if len(payload) > MAX_PAYLOAD:
        raise SubmitError("prompt larger than 16 MiB")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise SubmitError("max_tokens must be >= 1")
    try:  # the wire form the engine's parser takes (no subnormals, no exponent, 6 decimals)
        temperature, top_p = sampling.wire_temperature(temperature), sampling.wire_top_p(top_p)
    except sampling.SamplingError as exc:
        raise SubmitError(exc.message) from None
    extra = ""
    if seed is not None:
        if not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise SubmitError("seed must be an integer in [0, 2^64)")
        extra = f" seed={seed}"
    if experts is not None:  # our engine's per-request expert count (docs/contracts.md)
        if isinstance(experts, bool) or not isinstance(experts, int) or experts < 1:
            raise SubmitError("experts must be a positive integer")
        extra += f" experts={experts}"
    if routes:
        extra += " routes=2" if route_steps else " routes=1"
    if not heat:
        extra += " heat=0"
    if top_k is not None:  # our engine's top-k cut (0 = none)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k < 2**31:
            raise SubmitError("top_k must be an integer in [0, 2^31)")
        extra += f" top_k={top_k}"
    if logprobs:  # per-token candidates with their bytes (our engine's lptext=1)
        if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 < logprobs <= MAX_LOGPROBS:
            raise SubmitError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}]")
        extra += f" logprobs={logprobs} lptext=1"
    gbytes = b""
    if grammar is not None:
        if not isinstance(grammar, (bytes, bytearray)) or not 0 < len(grammar) <= MAX_GRAMMAR:
            raise SubmitError(f"grammar must be 1..{MAX_GRAMMAR} bytes")
        gbytes = bytes(grammar)
        extra = f" {len(gbytes)}{extra} grammar=1"
    header = (f"SUBMIT {req_id} {slot} {len(payload)} {max_tokens} "
              f"{format_number(temperature)} {format_number(top_p)}{extra}\n")
    return header.encode("ascii") + bytes(payload) + gbytes + b"\n"


def _simple(verb: str, req_id: int) -> bytes:
    if not isinstance(req_id, int) or req_id < 1:
        raise SubmitError("id must be >= 1")
    return f"{verb} {req_id}\n".encode("ascii")


def format_stop(req_id: int) -> bytes:
    return _simple("STOP", req_id)


def format_cancel(req_id: int) -> bytes:
    return _simple("CANCEL", req_id)
